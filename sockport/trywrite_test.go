package sockport

import (
	"errors"
	"os"
	"tapgro/port"
	"tapgro/port/porttest"
	"testing"
	"time"
)

// withTimeout fails the test if fn blocks for longer than limit: TryWriteBatch must
// never wait for a peer that does not read.
func withTimeout(t *testing.T, limit time.Duration, what string, fn func()) {
	t.Helper()
	porttest.Within(t, limit, what, fn)
}

// fillStream calls TryWriteBatch until port.ErrWouldBlock and returns the frames sent and
// the unsent rest of the last batch (whose first record may be partly written).
func fillStream(t *testing.T, p port.BatchSender, size int) (sent, rest [][]byte) {
	t.Helper()
	batch := make([][]byte, 64)
	withTimeout(t, 10*time.Second, "TryWriteBatch on a full socket", func() {
		for i := 0; ; i++ {
			for j := range batch {
				batch[j] = porttest.Frame(size, byte(len(sent)+j))
			}
			n, err := p.TryWriteBatch(batch)
			sent = append(sent, batch[:n]...)
			if errors.Is(err, port.ErrWouldBlock) {
				rest = batch[n:]
				return
			}
			if err != nil {
				t.Errorf("TryWriteBatch: %v", err)
				return
			}
			if i > 100000 {
				t.Errorf("the socket never filled")
				return
			}
		}
	})
	return sent, rest
}

// On stream sockets TryWriteBatch fills the socket without blocking, stops with whole
// records only, Room shrinks as it fills and grows as the peer reads, and WaitWritable
// wakes once the peer has read.
func TestStreamTryWriteBatch(t *testing.T) {
	for _, kind := range []string{"unix", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			porttest.CheckLeaks(t)
			a, b := streamPorts(t, kind)
			free0, size := a.Room()
			if size <= 0 || size == int(^uint(0)>>1) || free0 <= 0 || free0 > size {
				t.Fatalf("Room of an idle socket = %d of %d", free0, size)
			}
			sent, rest := fillStream(t, a, 9014)
			if len(sent) == 0 {
				t.Fatal("nothing was sent before port.ErrWouldBlock")
			}
			freeFull, _ := a.Room()
			if freeFull >= free0 {
				t.Errorf("Room did not shrink when the socket filled: %d -> %d", free0, freeFull)
			}
			// Not writable now: WaitWritable times out without breaking the port.
			if err := a.WaitWritable(time.Now().Add(20 * time.Millisecond)); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("WaitWritable on a full socket = %v, want a deadline error", err)
			}
			// The peer reads exactly the whole records sent; at most the start of the
			// next one follows, and it is pending in the port.
			porttest.ReadFrames(t, b, sent)
			if b.df.Buffered() != a.pendOff {
				t.Fatalf("%d bytes of a partial record after the %d whole ones, port says %d", b.df.Buffered(), len(sent), a.pendOff)
			}
			withTimeout(t, 5*time.Second, "WaitWritable after the peer read everything", func() {
				if err := a.WaitWritable(time.Time{}); err != nil {
					t.Errorf("WaitWritable: %v", err)
				}
			})
			// The rest follows, resuming the partial record.
			if n, err := a.TryWriteBatch(rest); n != len(rest) || err != nil {
				t.Fatalf("TryWriteBatch of the rest = %d, %v", n, err)
			}
			porttest.ReadFrames(t, b, rest)
			if kind == "unix" { // TCP frees room when ACKs arrive, a moment later
				if free, _ := a.Room(); free <= freeFull {
					t.Errorf("Room did not grow after the peer read: %d -> %d", freeFull, free)
				}
			}
			if a.Stats().FramesOut.Load() != uint64(len(sent)+len(rest)) {
				t.Errorf("FramesOut = %d, want %d", a.Stats().FramesOut.Load(), len(sent)+len(rest))
			}
		})
	}
}

// A record the kernel took in part is resumed by the next call, which must begin with
// the same frame; the peer sees every record whole and in order.
func TestStreamTryWritePartialRecord(t *testing.T) {
	for _, kind := range []string{"unix", "tcp"} {
		t.Run(kind, func(t *testing.T) {
			a, b := streamPorts(t, kind)
			// A small send buffer makes a port.MaxFrame record larger than what fits.
			smallBuffers(kind, a, b)
			big := [][]byte{porttest.Frame(port.MaxFrame, 1), porttest.Frame(port.MaxFrame, 2), porttest.Frame(port.MaxFrame, 3), porttest.Frame(port.MaxFrame, 4)}
			var n int
			var err error
			withTimeout(t, 5*time.Second, "TryWriteBatch of records larger than the socket", func() {
				n, err = a.TryWriteBatch(big)
			})
			if !errors.Is(err, port.ErrWouldBlock) || n != 0 || a.pendOff == 0 {
				t.Fatalf("TryWriteBatch = %d, %v with %d bytes of the first record pending; want 0, port.ErrWouldBlock, some", n, err, a.pendOff)
			}
			// Another frame first would corrupt the stream: refused.
			if n, err := a.TryWriteBatch(big[1:]); n != 0 || !errors.Is(err, ErrPartialRecord) {
				t.Fatalf("TryWriteBatch with another frame first = %d, %v; want ErrPartialRecord", n, err)
			}
			a.Fail(nil) // the refusal does not break anything by itself here
			done := writeAllAsync(a, big, a.TryWriteBatch, nil)
			porttest.ReadFrames(t, b, big)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if b.df.Buffered() != 0 || a.pendOff != 0 {
				t.Fatalf("%d bytes buffered, %d pending after the last record", b.df.Buffered(), a.pendOff)
			}
		})
	}
}

// Datagram ports: TryWriteBatch stops at the first EAGAIN (an AF_UNIX receiver whose
// queue is full), WaitWritable pauses instead of spinning, and nothing is lost.
func TestDgramTryWriteBatch(t *testing.T) {
	a, b := dgramPorts(t, "unix")
	var sent [][]byte
	batch := make([][]byte, 64)
	withTimeout(t, 10*time.Second, "TryWriteBatch on a full receiver", func() {
		for {
			for j := range batch {
				batch[j] = porttest.Frame(1514, byte(len(sent)+j))
			}
			n, err := a.TryWriteBatch(batch)
			sent = append(sent, batch[:n]...)
			if errors.Is(err, port.ErrWouldBlock) {
				return
			}
			if err != nil || len(sent) > 1e6 {
				t.Errorf("TryWriteBatch: %v after %d", err, len(sent))
				return
			}
		}
	})
	if a.Stats().SendDrops.Load() != 0 {
		t.Fatalf("%d datagrams dropped while filling", a.Stats().SendDrops.Load())
	}
	// A caller that retries after each WaitWritable while the receiver stays full keeps
	// getting port.ErrWouldBlock and loses nothing. (That it does not spin is a property of
	// WaitWritable's bounded waits; timing is not asserted in tests.)
	for i := 0; i < 5; i++ {
		if err := a.WaitWritable(time.Time{}); err != nil {
			t.Fatal(err)
		}
		if n, err := a.TryWriteBatch(batch[:1]); n != 0 || !errors.Is(err, port.ErrWouldBlock) {
			t.Fatalf("TryWriteBatch to a full receiver = %d, %v", n, err)
		}
	}
	if free, size := a.Room(); size <= 0 || free > size {
		t.Errorf("Room = %d of %d", free, size)
	}
	porttest.ReadFrames(t, b, sent)
	// The receiver's queue holds net.unix.max_dgram_qlen datagrams (10 by default):
	// send the next batch in steps, reading as we go; nothing is lost or reordered.
	errc := writeAllAsync(a, batch, a.TryWriteBatch, nil)
	porttest.ReadFrames(t, b, batch)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if a.Stats().SendDrops.Load() != 0 {
		t.Fatalf("%d datagrams dropped", a.Stats().SendDrops.Load())
	}

	// UDP: a batch goes out whole; Room reports the send buffer.
	u, v := dgramPorts(t, "udp")
	if n, err := u.TryWriteBatch(batch[:8]); n != 8 || err != nil {
		t.Fatalf("UDP TryWriteBatch = %d, %v", n, err)
	}
	porttest.ReadFrames(t, v, batch[:8])
	if free, size := u.Room(); size <= 0 || free > size {
		t.Errorf("UDP Room = %d of %d", free, size)
	}
	if err := u.WaitWritable(time.Now().Add(time.Second)); err != nil {
		t.Errorf("WaitWritable on an idle UDP socket: %v", err)
	}
}

// WaitWritable returns port.ErrClosed when the port is closed under it.
func TestWaitWritableClose(t *testing.T) {
	porttest.CheckLeaks(t)
	a, _ := streamPorts(t, "unix")
	fillStream(t, a, 9014)
	errc := make(chan error, 1)
	go func() { errc <- a.WaitWritable(time.Time{}) }()
	time.Sleep(20 * time.Millisecond)
	a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, port.ErrClosed) {
			t.Fatalf("WaitWritable after Close = %v, want port.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock WaitWritable")
	}
}

func TestTryWriteZeroAllocs(t *testing.T) {
	a, b := streamPorts(t, "unix")
	frames := make([][]byte, 64)
	for i := range frames {
		frames[i] = porttest.Frame(1514, byte(i))
	}
	bufs, sizes := porttest.Buffers(64, port.MaxFrame)
	allocs := testing.AllocsPerRun(200, func() {
		if n, err := a.TryWriteBatch(frames); n != 64 || err != nil {
			t.Fatalf("TryWriteBatch = %d, %v", n, err)
		}
		if free, _ := a.Room(); free <= 0 {
			t.Fatal("no room")
		}
		if err := a.WaitWritable(time.Time{}); err != nil {
			t.Fatal(err)
		}
		drainN(t, b, bufs, sizes, 64)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per TryWriteBatch+Room+WaitWritable, want 0", allocs)
	}
}
