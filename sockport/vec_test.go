package sockport

import (
	"errors"
	"testing"
	"time"

	"tapgro/port"
	"tapgro/port/porttest"
)

// vecsOf cuts each frame into a Vec: the first cut bytes (headers) copied into a fresh
// head behind port.VecHeadroom, the rest left in place as the body, as the TAP→port
// pipeline lays out a segment (or cut 0: the whole frame as the body).
func vecsOf(frames [][]byte, cut func(i int) int) []port.Vec {
	v := make([]port.Vec, len(frames))
	for i, f := range frames {
		c := min(cut(i), len(f))
		v[i].Head = append(make([]byte, port.VecHeadroom), f[:c]...)
		v[i].Body = f[c:]
	}
	return v
}

// mixedCut is where vecsOf cuts frame i into Head and Body: after a header of a few
// bytes, nowhere (body only), after the end (head only).
func mixedCut(i int) int { return []int{54, 0, 1 << 20, 7}[i%4] }

// Short writes: a stream socket with a small send buffer takes records in part; every
// TryWriteVecs call resumes the partly written record from where the kernel stopped —
// inside the prefix, the head or the body — and the peer reads every record whole, in
// order, byte for byte. Beginning with another Vec is refused (ErrPartialRecord).
func TestStreamTryWriteVecsShortWrites(t *testing.T) {
	for _, kind := range []string{"unix", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			a, b := streamPorts(t, kind)
			smallBuffers(kind, a, b)
			var frames [][]byte
			for i := 0; i < 200; i++ {
				frames = append(frames, porttest.Frame([]int{port.MaxFrame, 1514, 60, 9000, 333}[i%5], byte(i)))
			}
			vecs := vecsOf(frames, mixedCut)
			var n int
			var err error
			withTimeout(t, 5*time.Second, "TryWriteVecs on a small socket", func() { n, err = a.TryWriteVecs(vecs) })
			if !errors.Is(err, port.ErrWouldBlock) || a.pendOff == 0 {
				t.Fatalf("TryWriteVecs = %d, %v, %d bytes pending; want port.ErrWouldBlock inside a record", n, err, a.pendOff)
			}
			if n+1 < len(vecs) {
				// Another Vec (a copy of the next one: same bytes, other memory) first
				// would corrupt the stream.
				other := vecsOf(frames[n:n+1], mixedCut)
				if m, err := a.TryWriteVecs(other); m != 0 || !errors.Is(err, ErrPartialRecord) {
					t.Fatalf("TryWriteVecs with another Vec first = %d, %v; want ErrPartialRecord", m, err)
				}
				a.Fail(nil)
			}
			partials := 0
			done := writeAllAsync(a, vecs[n:], a.TryWriteVecs, func() {
				if a.pendOff > 0 {
					partials++
				}
			})
			porttest.ReadFrames(t, b, frames)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if partials == 0 {
				t.Fatal("no record was ever left partly written: the test did not exercise the resume")
			}
			if b.df.Buffered() != 0 || a.pendOff != 0 {
				t.Fatalf("%d bytes buffered, %d pending after the last record", b.df.Buffered(), a.pendOff)
			}
			if got := a.Stats().FramesOut.Load(); got != uint64(len(frames)) {
				t.Fatalf("FramesOut = %d, want %d", got, len(frames))
			}
		})
	}
}

// More records than one writev's IOV_MAX: a batch of 1500 Vecs goes out as several
// writevs of whole records (512 each, two iovecs a record), in order.
func TestStreamTryWriteVecsIovMax(t *testing.T) {
	a, b := streamPorts(t, "unix")
	st := a.Stats()
	var frames [][]byte
	for i := 0; i < 1500; i++ {
		frames = append(frames, porttest.Frame(100+i%50, byte(i)))
	}
	vecs := vecsOf(frames, func(i int) int { return 14 + i%3 })
	errc := writeAllAsync(a, vecs, a.TryWriteVecs, nil)
	porttest.ReadFrames(t, b, frames)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if w := st.WriteCalls.Load(); w < 3 {
		t.Fatalf("%d writev calls for 1500 records, want at least 3 (512 per IOV_MAX)", w)
	}
	// A Vec without headroom is refused before anything is written.
	if n, err := a.TryWriteVecs([]port.Vec{{Head: []byte{1, 2}, Body: frames[0]}}); n != 0 || err == nil {
		t.Fatalf("TryWriteVecs of a Vec without headroom = %d, %v", n, err)
	}
}

// Datagrams: each Vec is one datagram, head and body gathered by sendmmsg; the receiver
// gets the frames whole and in order.
func TestDgramTryWriteVecs(t *testing.T) {
	for _, kind := range []string{"unix", "udp"} {
		t.Run(kind, func(t *testing.T) {
			a, b := dgramPorts(t, kind)
			var frames [][]byte
			for i := 0; i < 64; i++ {
				frames = append(frames, porttest.Frame([]int{1514, 60, 900}[i%3], byte(i)))
			}
			vecs := vecsOf(frames, mixedCut)
			errc := writeAllAsync(a, vecs, a.TryWriteVecs, nil)
			porttest.ReadFrames(t, b, frames)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if got := a.Stats().BytesOut.Load(); got != uint64(len(frames)/3*(1514+60+900)+1514) {
				t.Fatalf("BytesOut = %d", got)
			}
		})
	}
}

func TestTryWriteVecsZeroAllocs(t *testing.T) {
	a, b := streamPorts(t, "unix")
	var frames [][]byte
	for i := 0; i < 64; i++ {
		frames = append(frames, porttest.Frame(1514, byte(i)))
	}
	vecs := vecsOf(frames, mixedCut)
	bufs, sizes := porttest.Buffers(64, port.MaxFrame)
	allocs := testing.AllocsPerRun(200, func() {
		if n, err := a.TryWriteVecs(vecs); n != 64 || err != nil {
			t.Fatalf("TryWriteVecs = %d, %v", n, err)
		}
		drainN(t, b, bufs, sizes, 64)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per TryWriteVecs, want 0", allocs)
	}
}
