package sockport

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"tapgro/port"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"tapgro/port/porttest"
)

func streamPorts(t testing.TB, kind string) (a, b *StreamPort) {
	t.Helper()
	var ca, cb net.Conn
	if kind == "tcp" {
		ca, cb = porttest.TCPConnPair(t)
	} else {
		ca, cb = porttest.UnixConnPair(t, unix.SOCK_STREAM)
	}
	a, err := NewStreamPort(ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err = NewStreamPort(cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestStreamRoundTrip(t *testing.T) {
	for _, kind := range []string{"unix", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			porttest.CheckLeaks(t)
			a, b := streamPorts(t, kind)
			var frames [][]byte
			for i := 0; i < 40; i++ { // enough data to fill socket buffers and force partial writes
				for j, n := range []int{14, 1514, 9014, 65535 + 14, port.MaxFrame} {
					frames = append(frames, porttest.Frame(n, byte(i*5+j)))
				}
			}
			for _, dir := range []struct{ w, r *StreamPort }{{a, b}, {b, a}} {
				errc := make(chan error, 1)
				go func() {
					n, err := dir.w.WriteBatch(frames)
					if err == nil && n != len(frames) {
						err = errors.New("short WriteBatch")
					}
					errc <- err
				}()
				porttest.ReadFrames(t, dir.r, frames)
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
			}
			st := a.Stats()
			if st.FramesOut.Load() != uint64(len(frames)) || st.FramesIn.Load() != uint64(len(frames)) {
				t.Errorf("stats: out %d in %d, want %d each", st.FramesOut.Load(), st.FramesIn.Load(), len(frames))
			}
		})
	}
}

// A batch of frames already in the socket comes back from one ReadBatch, one read(2).
func TestStreamManyFramesPerRead(t *testing.T) {
	a, b := streamPorts(t, "unix")
	frames := make([][]byte, 64)
	for i := range frames {
		frames[i] = porttest.Frame(1514, byte(i))
	}
	if n, err := a.WriteBatch(frames); n != 64 || err != nil {
		t.Fatalf("WriteBatch = %d, %v", n, err)
	}
	if c := a.Stats().WriteCalls.Load(); c != 1 {
		t.Errorf("WriteBatch used %d writev calls, want 1", c)
	}
	bufs, sizes := porttest.Buffers(100, port.MaxFrame)
	n, err := b.ReadBatch(bufs, sizes)
	if err != nil || n != 64 {
		t.Fatalf("ReadBatch = %d, %v; want 64 frames at once", n, err)
	}
	if c := b.Stats().ReadCalls.Load(); c != 1 {
		t.Errorf("ReadBatch used %d reads, want 1", c)
	}
}

// A peer dribbling one byte per write still yields whole frames, in order.
func TestStreamOneByteChunks(t *testing.T) {
	porttest.CheckLeaks(t)
	raw, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	defer raw.Close()
	b, err := NewStreamPort(cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	frames := [][]byte{porttest.Frame(14, 1), porttest.Frame(1514, 2), porttest.Frame(60, 3)}
	var stream []byte
	for _, f := range frames {
		stream = append(append(stream, prefixOnly(uint32(len(f)))...), f...)
	}
	go func() {
		for i := range stream {
			if _, err := raw.Write(stream[i : i+1]); err != nil {
				return
			}
		}
	}()
	porttest.ReadFrames(t, b, frames)
}

func TestStreamBadLength(t *testing.T) {
	for _, tt := range []struct {
		l     uint32
		limit int
	}{{13, port.MinFrame}, {0, port.MinFrame}, {port.MaxFrame + 1, port.MaxFrame}} {
		raw, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
		b, err := NewStreamPort(cb, nil)
		if err != nil {
			t.Fatal(err)
		}
		good := porttest.Frame(100, 7)
		msg := append(append(prefixOnly(100), good...), prefixOnly(tt.l)...)
		msg = append(msg, make([]byte, 20)...)
		if _, err := raw.Write(msg); err != nil {
			t.Fatal(err)
		}
		porttest.ReadFrames(t, b, [][]byte{good})
		bufs, sizes := porttest.Buffers(4, port.MaxFrame)
		n, err := b.ReadBatch(bufs, sizes)
		var fe *port.FrameError
		if n != 0 || !errors.As(err, &fe) || fe.Length != uint64(tt.l) || fe.Limit != tt.limit {
			t.Fatalf("len %d: ReadBatch = %d, %v; want port.FrameError{%d, %d}", tt.l, n, err, tt.l, tt.limit)
		}
		if got := b.Stats().BadLength.Load(); got != 1 {
			t.Errorf("BadLength = %d, want 1", got)
		}
		// The caller closes on a port.FrameError; the peer sees the connection end.
		b.Close()
		if _, err := raw.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("peer read after Close: %v, want EOF", err)
		}
		raw.Close()
	}
}

func TestStreamEOF(t *testing.T) {
	// Clean EOF between frames.
	raw, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	b, _ := NewStreamPort(cb, nil)
	defer b.Close()
	raw.Close()
	bufs, sizes := porttest.Buffers(1, port.MaxFrame)
	_, err := b.ReadBatch(bufs, sizes)
	if !errors.Is(err, port.ErrClosed) || !errors.Is(err, io.EOF) {
		t.Errorf("clean EOF: %v, want port.ErrClosed and io.EOF", err)
	}

	// EOF in the middle of a frame.
	raw, cb = porttest.UnixConnPair(t, unix.SOCK_STREAM)
	b2, _ := NewStreamPort(cb, nil)
	defer b2.Close()
	raw.Write(append(prefixOnly(1514), make([]byte, 100)...))
	raw.Close()
	_, err = b2.ReadBatch(bufs, sizes)
	if !errors.Is(err, port.ErrClosed) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("EOF mid-frame: %v, want port.ErrClosed and io.ErrUnexpectedEOF", err)
	}
	if b2.Stats().Truncated.Load() != 1 {
		t.Errorf("Truncated = %d, want 1", b2.Stats().Truncated.Load())
	}
	t.Log(err)
}

// A connection that ends inside a record is counted in Truncated and reported as the
// peer closing (port.ErrClosed, io.ErrUnexpectedEOF), whether it ends inside the 4-byte length
// prefix or inside the frame, and whether the peer closed cleanly (FIN, EOF) or with
// data of ours still unread in its receive queue. Linux then resets the connection
// instead: for TCP, tcp_close sends an RST when unread data is discarded (RFC 2525 section 2.17);
// for AF_UNIX, unix_release_sock sets ECONNRESET on the peer. Either way the reader sees
// what was sent first, then ECONNRESET instead of EOF.
func TestStreamTruncatedCounted(t *testing.T) {
	for _, kind := range []string{"unix", "tcp"} {
		for _, tc := range []struct {
			name string
			data []byte
		}{
			{"in-prefix", prefixOnly(1514)[:2]},
			{"in-frame", append(prefixOnly(1514), make([]byte, 100)...)},
			{"after-frame-in-prefix", append(append(prefixOnly(60), make([]byte, 60)...), 0, 0, 5)},
		} {
			for _, reset := range []bool{false, true} {
				name := kind + "/" + tc.name + "/eof"
				if reset {
					name = kind + "/" + tc.name + "/reset"
				}
				t.Run(name, func(t *testing.T) {
					var raw, cb net.Conn
					if kind == "tcp" {
						raw, cb = porttest.TCPConnPair(t)
					} else {
						raw, cb = porttest.UnixConnPair(t, unix.SOCK_STREAM)
					}
					b, err := NewStreamPort(cb, nil)
					if err != nil {
						t.Fatal(err)
					}
					defer b.Close()
					if reset {
						// Something of ours the peer never reads: its close then resets.
						if _, err := b.WriteBatch([][]byte{porttest.Frame(60, 1)}); err != nil {
							t.Fatal(err)
						}
						if kind == "unix" {
							waitUnread(t, raw)
						} else {
							// Unread data alone makes Linux reset; SO_LINGER 0 makes
							// sure of it whatever the timing.
							raw.(*net.TCPConn).SetLinger(0)
						}
					}
					if _, err := raw.Write(tc.data); err != nil {
						t.Fatal(err)
					}
					raw.Close()
					bufs, sizes := porttest.Buffers(4, port.MaxFrame)
					b.SetReadDeadline(time.Now().Add(5 * time.Second))
					for {
						n, err := b.ReadBatch(bufs, sizes)
						if n > 0 {
							continue // the complete frame before the truncated one
						}
						if !errors.Is(err, port.ErrClosed) || !errors.Is(err, io.ErrUnexpectedEOF) {
							t.Errorf("ReadBatch: %v, want port.ErrClosed and io.ErrUnexpectedEOF", err)
						}
						if reset && !errors.Is(err, unix.ECONNRESET) {
							t.Errorf("ReadBatch: %v, want it to carry ECONNRESET too", err)
						}
						t.Log(err)
						break
					}
					if got := b.Stats().Truncated.Load(); got != 1 {
						t.Errorf("Truncated = %d, want 1", got)
					}
				})
			}
		}
	}
}

// A reset at a record boundary is the peer closing too, not a truncation.
func TestStreamResetBetweenFrames(t *testing.T) {
	raw, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	b, err := NewStreamPort(cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.WriteBatch([][]byte{porttest.Frame(60, 1)}); err != nil {
		t.Fatal(err)
	}
	waitUnread(t, raw)
	raw.Close()
	bufs, sizes := porttest.Buffers(1, port.MaxFrame)
	_, err = b.ReadBatch(bufs, sizes)
	if !errors.Is(err, port.ErrClosed) || !errors.Is(err, unix.ECONNRESET) || errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("ReadBatch: %v, want port.ErrClosed and ECONNRESET, not io.ErrUnexpectedEOF", err)
	}
	if got := b.Stats().Truncated.Load(); got != 0 {
		t.Errorf("Truncated = %d, want 0", got)
	}
}

// waitUnread waits until c has unread bytes in its receive queue (SIOCINQ).
func waitUnread(t *testing.T, c net.Conn) {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500; i++ {
		var n int
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
		if n > 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the peer never had unread data")
}

func TestStreamCloseUnblocksRead(t *testing.T) {
	porttest.CheckLeaks(t)
	a, _ := streamPorts(t, "unix")
	errc := make(chan error)
	go func() {
		bufs, sizes := porttest.Buffers(1, port.MaxFrame)
		_, err := a.ReadBatch(bufs, sizes)
		errc <- err
	}()
	a.Close()
	if err := <-errc; !errors.Is(err, port.ErrClosed) {
		t.Errorf("ReadBatch after Close: %v, want port.ErrClosed", err)
	}
}

func TestStreamWriteRejectsBadFrame(t *testing.T) {
	a, b := streamPorts(t, "unix")
	good := porttest.Frame(60, 1)
	n, err := a.WriteBatch([][]byte{good, porttest.Frame(13, 2), good})
	var fe *port.FrameError
	if n != 1 || !errors.As(err, &fe) || fe.Length != 13 {
		t.Fatalf("WriteBatch = %d, %v; want 1 and a port.FrameError for 13", n, err)
	}
	n, err = a.WriteBatch([][]byte{porttest.Frame(port.MaxFrame+1, 3)})
	if n != 0 || !errors.As(err, &fe) || fe.Limit != port.MaxFrame {
		t.Fatalf("WriteBatch = %d, %v; want 0 and a port.FrameError over port.MaxFrame", n, err)
	}
	// The connection is still usable.
	if n, err := a.WriteBatch([][]byte{good}); n != 1 || err != nil {
		t.Fatalf("WriteBatch after rejection = %d, %v", n, err)
	}
	porttest.ReadFrames(t, b, [][]byte{good, good})
}

func TestStreamBatchOver512(t *testing.T) {
	a, b := streamPorts(t, "unix")
	frames := make([][]byte, 1300)
	for i := range frames {
		frames[i] = porttest.Frame(64+i%700, byte(i))
	}
	done := make(chan int)
	go func() { n, _ := a.WriteBatch(frames); done <- n }()
	porttest.ReadFrames(t, b, frames)
	if n := <-done; n != len(frames) {
		t.Fatalf("WriteBatch = %d, want %d", n, len(frames))
	}
	if c := a.Stats().WriteCalls.Load(); c < 3 {
		t.Errorf("%d writev calls for 1300 frames, want >= 3 (512 per call)", c)
	}
}

func TestStreamZeroAllocs(t *testing.T) {
	a, b := streamPorts(t, "unix")
	frames := make([][]byte, 64)
	for i := range frames {
		frames[i] = porttest.Frame(1514, byte(i))
	}
	bufs, sizes := porttest.Buffers(64, port.MaxFrame)
	allocs := testing.AllocsPerRun(200, func() {
		if n, err := a.WriteBatch(frames); n != 64 || err != nil {
			t.Fatalf("WriteBatch = %d, %v", n, err)
		}
		drainN(t, b, bufs, sizes, 64)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per WriteBatch+ReadBatch, want 0", allocs)
	}
}

func BenchmarkStreamWriteBatch(b *testing.B) {
	ca, raw := porttest.UnixConnPair(b, unix.SOCK_STREAM)
	p, err := NewStreamPort(ca, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	setBuffers(raw)
	buf := make([]byte, 1<<20)
	go func() { // drain
		for {
			if _, err := raw.Read(buf); err != nil {
				return
			}
		}
	}()
	defer raw.Close()
	frames := make([][]byte, 64)
	for i := range frames {
		frames[i] = porttest.Frame(1514, byte(i))
	}
	b.SetBytes(64 * 1514)
	b.ReportAllocs()
	for b.Loop() {
		if n, err := p.WriteBatch(frames); n != 64 || err != nil {
			b.Fatal(n, err)
		}
	}
	b.ReportMetric(float64(p.Stats().WriteCalls.Load())/float64(b.N), "writev/op")
}

func BenchmarkStreamReadBatch(b *testing.B) {
	raw, cb := porttest.UnixConnPair(b, unix.SOCK_STREAM)
	p, err := NewStreamPort(cb, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	setBuffers(raw)
	var stream []byte
	for i := 0; i < 64; i++ {
		stream = append(append(stream, prefixOnly(1514)...), porttest.Frame(1514, byte(i))...)
	}
	done := make(chan struct{})
	go func() { // feed
		defer close(done)
		for {
			if _, err := raw.Write(stream); err != nil {
				return
			}
		}
	}()
	bufs, sizes := porttest.Buffers(64, port.MaxFrame)
	b.SetBytes(64 * 1514)
	b.ReportAllocs()
	for b.Loop() {
		for got := 0; got < 64; {
			n, err := p.ReadBatch(bufs, sizes)
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(p.Stats().ReadCalls.Load())/float64(b.N), "read/op")
	p.Close()
	raw.Close()
	<-done
}

// On a QEMU-framed stream ReadBatchLent lends frames where they lie in the read buffer,
// back to back, each with port.ShmHeadroom bytes in front of it inside the buffer (the
// deframer's headroom for the first). Taken in order — each frame checked, then its
// headroom scribbled over as the datapath writes the TAP header there — every frame
// arrives intact, across reads that leave a partial frame to be moved to the front.
func TestPlainLendFromReadBuffer(t *testing.T) {
	porttest.CheckLeaks(t)
	a, b := streamPorts(t, "unix")
	rng := rand.New(rand.NewPCG(15, 1))
	var want [][]byte
	total := 0
	for total < 3*streamBufSize { // several buffers' worth: compaction happens
		n := port.MinFrame + rng.IntN(9000)
		if rng.IntN(8) == 0 {
			n = port.MaxFrame - rng.IntN(100)
		}
		want = append(want, porttest.Frame(n, byte(len(want))))
		total += n
	}
	go a.WriteBatch(want)
	bufs, sizes := porttest.Buffers(5, 16)
	lent := make([][]byte, 5)
	scribble := bytes.Repeat([]byte{0xAA}, port.ShmHeadroom)
	for got := 0; got < len(want); {
		n, err := b.ReadBatchLent(bufs, sizes, lent)
		if err != nil {
			t.Fatalf("after %d of %d frames: %v", got, len(want), err)
		}
		for i := 0; i < n; i++ {
			if lent[i] == nil {
				t.Fatalf("frame %d was copied, not lent", got+i)
			}
			if len(lent[i]) != port.ShmHeadroom+sizes[i] {
				t.Fatalf("frame %d: lent %d bytes for a %d-byte frame, want the headroom in front", got+i, len(lent[i]), sizes[i])
			}
			if !bytes.Equal(lent[i][port.ShmHeadroom:], want[got+i]) {
				t.Fatalf("frame %d (%d bytes) damaged", got+i, sizes[i])
			}
			copy(lent[i], scribble)
		}
		got += n
		b.ReleaseLent()
	}
}
