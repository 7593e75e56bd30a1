package tapdev

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
)

// splitAt cuts b into pieces of the given lengths (the rest is the last piece).
func splitAt(b []byte, lens ...int) [][]byte {
	var out [][]byte
	for _, n := range lens {
		n = min(n, len(b))
		out = append(out, b[:n])
		b = b[n:]
	}
	return append(out, b)
}

// TestVectoredRoundTrip writes an echo request as oddly split segments (the vnet header
// itself split, an empty segment in between) and reads the reply into segments split
// inside the header and the frame.
func TestVectoredRoundTrip(t *testing.T) {
	for _, hdrLen := range []int{10, 12} {
		t.Run(fmt.Sprint(hdrLen), func(t *testing.T) {
			_, d, mac := upTAP(t, "vec", Config{Name: "tgtap0", VnetHdrLen: hdrLen}, 1500)
			payload := bytes.Repeat([]byte("vectored "), 100)
			req := echoRequest(hdrLen, mac, 0x4321, 3, payload)
			n, err := d.Writev(splitAt(req, 3, 0, 9, 1, 40, 500))
			if err != nil || n != len(req) {
				t.Fatalf("Writev = %d, %v; want %d", n, err, len(req))
			}
			buf := make([]byte, bufSize)
			segs := splitAt(buf, 7, 5, 30, 100)
			d.SetReadDeadline(time.Now().Add(hangGuard))
			for {
				n, err := d.Readv(segs)
				if err != nil {
					t.Fatalf("Readv: %v", err)
				}
				if isEchoReply(buf[hdrLen:n], 0x4321, 3, payload) {
					break
				}
			}
		})
	}
}

// TestReadvTruncates: a frame longer than the segments is cut, reported and counted.
func TestReadvTruncates(t *testing.T) {
	_, d, mac := upTAP(t, "vectrunc", Config{Name: "tgtap0"}, 1500)
	payload := make([]byte, 1000)
	req := echoRequest(10, mac, 1, 1, payload)
	d.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := d.Writev([][]byte{req}); err != nil {
		t.Fatal(err)
	}
	small := make([]byte, 200)
	for {
		n, err := d.Readv([][]byte{small[:100], small[100:]})
		if errors.Is(err, ErrTruncated) {
			if n != 200 || d.Stats().Truncated.Load() == 0 {
				t.Fatalf("truncated read = %d, Truncated = %d", n, d.Stats().Truncated.Load())
			}
			return
		}
		if err != nil {
			t.Fatalf("Readv: %v", err)
		}
	}
}

// TestReadvExactFit: a frame that fills the segments exactly is not reported as
// truncated (the sink byte after them stays empty).
func TestReadvExactFit(t *testing.T) {
	_, d, mac := upTAP(t, "vecexact", Config{Name: "tgtap0"}, 1500)
	payload := make([]byte, 1000)
	req := echoRequest(10, mac, 1, 1, payload)
	d.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := d.Writev([][]byte{req}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(req)) // the reply is as long as the request
	for {
		n, err := d.Readv(splitAt(buf, 500))
		if err != nil {
			t.Fatalf("Readv = %d, %v", n, err)
		}
		if n == len(req) && isEchoReply(buf[10:], 1, 1, payload) {
			return
		}
	}
}

// TestTryReadvAndWait: no frame → ErrWouldBlock at once; WaitReadable obeys the deadline.
func TestTryReadvAndWait(t *testing.T) {
	_, d, _ := upTAP(t, "vectry", Config{Name: "tgtap0"}, 1500)
	buf := make([]byte, bufSize)
	for { // drain whatever the kernel sent on link up
		if _, err := d.TryReadv([][]byte{buf}); errors.Is(err, ErrWouldBlock) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := d.Readable(); ok || err != nil {
		t.Fatalf("Readable on an empty queue = %v, %v", ok, err)
	}
	d.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if err := d.WaitReadable(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WaitReadable = %v, want deadline", err)
	}
	d.SetReadDeadline(time.Time{})
}

// TestWritevErrors: a rejected header is counted as EINVAL, like Write; too many
// segments are refused before the syscall.
func TestWritevErrors(t *testing.T) {
	_, d, mac := upTAP(t, "vecerr", Config{Name: "tgtap0"}, 1500)
	bad := echoRequest(10, mac, 1, 1, make([]byte, 10))
	bad[1] = 2 // unknown gso_type
	if _, err := d.Writev(splitAt(bad, 4)); err == nil || d.Stats().WriteErrEINVAL.Load() != 1 {
		t.Fatalf("Writev(bad) = %v, EINVAL count %d", err, d.Stats().WriteErrEINVAL.Load())
	}
	many := make([][]byte, MaxIov+1)
	for i := range many {
		many[i] = bad[:1]
	}
	if _, err := d.Writev(many); err == nil {
		t.Fatal("Writev with too many segments succeeded")
	}
}

func TestVectoredAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under -race")
	}
	_, d, mac := upTAP(t, "vecallocs", Config{Name: "tgtap0"}, 1500)
	req := echoRequest(10, mac, 9, 9, make([]byte, 56))
	wsegs := splitAt(req, 4, 20)
	buf := make([]byte, bufSize)
	rsegs := splitAt(buf, 6, 64)
	d.SetReadDeadline(time.Now().Add(hangGuard))
	var werr, rerr error
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := d.Writev(wsegs); err != nil {
			werr = err
		}
		if ok, _ := d.Readable(); !ok {
			time.Sleep(time.Millisecond) // the reply is on its way
		}
		if _, err := d.Readv(rsegs); err != nil {
			rerr = err
		}
	})
	if werr != nil || rerr != nil {
		t.Fatalf("writev: %v, readv: %v", werr, rerr)
	}
	if allocs != 0 {
		t.Fatalf("Writev+Readv: %v allocs per run, want 0", allocs)
	}
}
