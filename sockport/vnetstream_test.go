package sockport

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/port/porttest"
	"tapgro/vnethdr"
)

// vnetPorts runs the hello on both ends of a connection at once and returns the ports.
// kind is "tcp", "unix", or "shm" (AF_UNIX with shared-memory rings).
func vnetPorts(t testing.TB, kind string, acceptsA, acceptsB vnethdr.Offloads) (a, b *StreamPort) {
	t.Helper()
	shm := kind == "shm"
	var ca, cb net.Conn
	if kind == "tcp" {
		ca, cb = porttest.TCPConnPair(t)
	} else {
		ca, cb = porttest.UnixConnPair(t, unix.SOCK_STREAM)
	}
	return helloBoth(t, ca, cb, acceptsA, acceptsB, shm, shm)
}

// helloBoth makes vnet-hdr=on ports of both ends of a connection, each offering shared
// memory or not.
func helloBoth(t testing.TB, ca, cb net.Conn, acceptsA, acceptsB vnethdr.Offloads, shmA, shmB bool) (a, b *StreamPort) {
	t.Helper()
	type res struct {
		p   *StreamPort
		err error
	}
	ch := make(chan res, 1)
	go func() {
		p, err := NewVnetStreamPort(cb, nil, nil, acceptsB, shmB, time.Second)
		ch <- res{p, err}
	}()
	a, err := NewVnetStreamPort(ca, nil, nil, acceptsA, shmA, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { a.Close(); r.p.Close() })
	return a, r.p
}

func TestVnetHelloRoundTrip(t *testing.T) {
	for _, kind := range []string{"unix", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			porttest.CheckLeaks(t)
			a, b := vnetPorts(t, kind, VnetStreamAccepts, vnethdr.OffloadCSUM|vnethdr.OffloadTSO4)
			if a.VnetHdrLen() != VnetStreamHdrLen || b.VnetHdrLen() != VnetStreamHdrLen {
				t.Fatalf("header lengths %d/%d, want %d", a.VnetHdrLen(), b.VnetHdrLen(), VnetStreamHdrLen)
			}
			// Each end accepts what the other advertised.
			if got, want := a.Accepts(), vnethdr.OffloadCSUM|vnethdr.OffloadTSO4; got != want {
				t.Errorf("a.Accepts() = %s, want %s", got, want)
			}
			if got := b.Accepts(); got != VnetStreamAccepts {
				t.Errorf("b.Accepts() = %s, want %s", got, VnetStreamAccepts)
			}
			if a.VnetHdrLen() != VnetStreamHdrLen || b.VnetHdrLen() != VnetStreamHdrLen {
				t.Error("vnet stream must report a fixed 12-byte header")
			}
			if got := a.State(); got != "stream(vnet-hdr 12, accepts csum,tso4)" {
				t.Errorf("State() = %q", got)
			}
		})
	}
}

// Records carry the header and GSO frames of 64 KiB cross whole, both ways.
func TestVnetRecordsRoundTrip(t *testing.T) {
	porttest.CheckLeaks(t)
	a, b := vnetPorts(t, "unix", VnetStreamAccepts, VnetStreamAccepts)
	h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOTCPv4, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}
	mk := func(n int, tag byte) []byte {
		rec := make([]byte, VnetStreamHdrLen+n)
		h.Encode(rec, VnetStreamHdrLen)
		copy(rec[VnetStreamHdrLen:], porttest.Frame(n, tag))
		return rec
	}
	// The largest frame a TAP hands over, a small one, and the largest a record holds.
	want := [][]byte{mk(65000, 1), mk(port.MinFrame, 2), mk(port.MaxFrame, 3)}
	for _, dir := range []struct {
		name     string
		from, to *StreamPort
	}{{"a->b", a, b}, {"b->a", b, a}} {
		t.Run(dir.name, func(t *testing.T) {
			errc := make(chan error, 1)
			go func() { _, err := dir.from.WriteBatch(want); errc <- err }()
			bufs, sizes := porttest.Buffers(8, port.MaxFrame+VnetStreamHdrLen)
			got := 0
			for got < len(want) {
				n, err := dir.to.ReadBatch(bufs, sizes)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < n; i++ {
					if !bytes.Equal(bufs[i][:sizes[i]], want[got]) {
						t.Fatalf("record %d: %d bytes, want %d", got, sizes[i], len(want[got]))
					}
					var gh vnethdr.Hdr
					if err := gh.Decode(bufs[i][:sizes[i]], VnetStreamHdrLen); err != nil || gh != h {
						t.Fatalf("record %d: header %v, want %v (%v)", got, gh, h, err)
					}
					got++
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		})
	}
	// One byte more than a frame plus header is refused before it is sent.
	var fe *port.FrameError
	if _, err := a.WriteBatch([][]byte{make([]byte, port.MaxFrame+VnetStreamHdrLen+1)}); !errors.As(err, &fe) {
		t.Fatalf("oversize record: err = %v, want *port.FrameError", err)
	}
	if _, err := a.WriteBatch([][]byte{make([]byte, port.MinFrame+VnetStreamHdrLen-1)}); !errors.As(err, &fe) {
		t.Fatalf("undersize record: err = %v, want *port.FrameError", err)
	}
}

// On a vnet-hdr=on stream ReadBatchLent lends records from the read buffer instead of
// copying them, with port.ShmHeadroom bytes in front of each frame that the caller may
// overwrite without touching any other record of the batch.
func TestVnetLendFromReadBuffer(t *testing.T) {
	porttest.CheckLeaks(t)
	a, b := vnetPorts(t, "unix", VnetStreamAccepts, VnetStreamAccepts)
	want := [][]byte{vnetRecordTag(65000, 1), vnetRecordTag(port.MinFrame, 2), vnetRecordTag(1500, 3), vnetRecordTag(port.MinFrame, 4)}
	go a.WriteBatch(want)
	bufs, sizes := porttest.Buffers(8, 16)
	lent := make([][]byte, 8)
	got := 0
	for got < len(want) {
		n, err := b.ReadBatchLent(bufs[got:], sizes[got:], lent[got:])
		if err != nil {
			t.Fatal(err)
		}
		for i := got; i < got+n; i++ {
			if lent[i] == nil {
				t.Fatalf("record %d was copied, not lent", i)
			}
		}
		// Scribble over every headroom of the batch, then check every record.
		for i := got; i < got+n; i++ {
			copy(lent[i][:port.ShmHeadroom], bytes.Repeat([]byte{0xAA}, port.ShmHeadroom))
		}
		for i := got; i < got+n; i++ {
			frame := lent[i][port.ShmHeadroom : port.ShmHeadroom-VnetStreamHdrLen+sizes[i]]
			if !bytes.Equal(frame, want[i][VnetStreamHdrLen:]) {
				t.Fatalf("record %d: frame damaged by the batch's headroom writes", i)
			}
		}
		got += n
		b.ReleaseLent()
	}
}

func vnetRecordTag(n int, tag byte) []byte {
	rec := make([]byte, VnetStreamHdrLen+n)
	copy(rec[VnetStreamHdrLen:], porttest.Frame(n, tag))
	return rec
}

// A vnet-hdr=on end meeting a plain (QEMU-framed) stream peer: both sides fail at once
// with an error that says what happened, whichever speaks first.
func TestVnetHelloAgainstPlainPeer(t *testing.T) {
	porttest.CheckLeaks(t)
	ca, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	plain, err := NewStreamPort(cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	// The plain side sends a frame first (as tapgro's announcement or a guest would).
	if _, err := plain.WriteBatch([][]byte{porttest.Frame(60, 9)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = NewVnetStreamPort(ca, nil, nil, VnetStreamAccepts, true, 5*time.Second)
	var he *HelloError
	if !errors.As(err, &he) || !errors.Is(err, ErrNotVnetPeer) {
		t.Fatalf("vnet side: err = %v, want a HelloError wrapping ErrNotVnetPeer", err)
	}
	if !strings.Contains(err.Error(), "peer is not a tapgro speaking vnet-hdr=on") || !strings.Contains(err.Error(), "got 0000003c") {
		t.Errorf("vnet side error does not explain itself: %v", err)
	}
	if time.Since(start) > 4*time.Second {
		t.Errorf("vnet side waited for the timeout instead of failing at once")
	}
	// The plain side got the hello as a record length it cannot accept, with a hint.
	bufs, sizes := porttest.Buffers(4, port.MaxFrame)
	_, err = plain.ReadBatch(bufs, sizes)
	var fe *port.FrameError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), "set vnet-hdr=on on this end too") {
		t.Fatalf("plain side: err = %v, want a port.FrameError with the vnet-hdr hint", err)
	}
	ca.Close()
}

// The vnet side speaks first into a silent plain peer that then closes (what QEMU does
// on reading the hello): the hello fails on EOF, not on the timeout.
func TestVnetHelloPeerCloses(t *testing.T) {
	porttest.CheckLeaks(t)
	ca, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	go func() {
		buf := make([]byte, 4)
		cb.Read(buf) // QEMU reads the length "TAPG", finds it absurd and closes
		cb.Close()
	}()
	start := time.Now()
	_, err := Hello(ca, VnetStreamAccepts, 5*time.Second)
	ca.Close()
	if !errors.Is(err, ErrNotVnetPeer) || !strings.Contains(err.Error(), "closed the connection during the hello") {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > 4*time.Second {
		t.Errorf("waited for the timeout")
	}
}

func TestVnetHelloTimeout(t *testing.T) {
	porttest.CheckLeaks(t)
	ca, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	defer cb.Close()
	_, err := Hello(ca, VnetStreamAccepts, 50*time.Millisecond)
	ca.Close()
	if !errors.Is(err, ErrNotVnetPeer) || !strings.Contains(err.Error(), "no hello within") {
		t.Fatalf("err = %v", err)
	}
}

func TestVnetHelloVersionMismatch(t *testing.T) {
	porttest.CheckLeaks(t)
	ca, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	defer cb.Close()
	h := encodeHello(VnetStreamAccepts, 0)
	h[7] = VnetStreamVersion + 1
	go cb.Write(h[:])
	_, err := Hello(ca, VnetStreamAccepts, time.Second)
	ca.Close()
	var he *HelloError
	if !errors.As(err, &he) || !strings.Contains(err.Error(), "version 2, this tapgro speaks 1") {
		t.Fatalf("err = %v", err)
	}
	if errors.Is(err, ErrNotVnetPeer) {
		t.Errorf("a version mismatch is a tapgro peer, not ErrNotVnetPeer: %v", err)
	}
}

func readFramesSized(t testing.TB, p port.Port, want [][]byte, size int) {
	t.Helper()
	bufs, sizes := porttest.Buffers(8, size)
	got := 0
	for got < len(want) {
		n, err := p.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			if !bytes.Equal(bufs[i][:sizes[i]], want[got]) {
				t.Fatalf("frame %d differs", got)
			}
			got++
		}
	}
}

// The vnet stream's read and write paths allocate nothing, as the plain ones.
func TestVnetStreamZeroAllocs(t *testing.T) {
	a, b := vnetPorts(t, "unix", VnetStreamAccepts, VnetStreamAccepts)
	rec := make([]byte, VnetStreamHdrLen+1514)
	frames := [][]byte{rec, rec, rec, rec}
	bufs, sizes := porttest.Buffers(8, port.MaxFrame+VnetStreamHdrLen)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := a.WriteBatch(frames); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(frames); {
			n, err := b.ReadBatch(bufs, sizes)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per round trip, want 0", allocs)
	}
}

func FuzzDecodeHello(f *testing.F) {
	good := encodeHello(VnetStreamAccepts, 0)
	f.Add(good[:])
	bad := good
	bad[7] = 9
	f.Add(bad[:])
	f.Add([]byte{0, 0, 0, 60, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add([]byte("TAPGRO"))
	f.Fuzz(func(t *testing.T, b []byte) {
		acc, _, err := decodeHello(b)
		if err == nil {
			if len(b) < HelloLen || [7]byte(b[:7]) != helloMagic {
				t.Fatalf("accepted %x", b)
			}
			if acc&^VnetStreamAccepts != 0 {
				t.Fatalf("accepted unknown offloads %s", acc)
			}
		}
	})
}
