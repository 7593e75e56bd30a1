package sockport

import (
	"bytes"
	"errors"
	"net"
	"path/filepath"
	"tapgro/port"
	"tapgro/port/porttest"
	"testing"
	"time"
)

// dgramPorts returns two DgramPorts that send to each other.
func dgramPorts(t testing.TB, kind string) (a, b *DgramPort) {
	t.Helper()
	var ca, cb net.Conn
	if kind == "udp" {
		ua, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		ub, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		ca, cb = ua, ub
	} else {
		dir := t.TempDir()
		ua, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Net: "unixgram", Name: filepath.Join(dir, "a")})
		if err != nil {
			t.Fatal(err)
		}
		ub, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Net: "unixgram", Name: filepath.Join(dir, "b")})
		if err != nil {
			t.Fatal(err)
		}
		ca, cb = ua, ub
	}
	a, err := NewDgramPort(ca, cb.LocalAddr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err = NewDgramPort(cb, ca.LocalAddr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestDgramRoundTrip(t *testing.T) {
	for _, kind := range []string{"udp", "unixgram"} {
		t.Run(kind, func(t *testing.T) {
			porttest.CheckLeaks(t)
			a, b := dgramPorts(t, kind)
			// 100 small frames in one batch, then the size classes one at a time. The
			// writer runs concurrently: an AF_UNIX datagram queue holds only
			// net.unix.max_dgram_qlen (default 10) datagrams, so the sender must wait
			// for the reader (and be woken by it) rather than drop. A reader starved of
			// CPU for dgramSendWait (go test -race on a loaded machine) would make the
			// sender drop by design, so the wait is raised here: the test is about the
			// wake-up, not the give-up (TestDgramSendGivesUp covers that).
			a.sendWait, b.sendWait = time.Minute, time.Minute
			var frames [][]byte
			for i := 0; i < 100; i++ {
				frames = append(frames, porttest.Frame(60+i, byte(i)))
			}
			errc := make(chan error, 1)
			go func() {
				n, err := a.WriteBatch(frames)
				if err == nil && n != len(frames) {
					err = errors.New("short WriteBatch")
				}
				errc <- err
			}()
			porttest.ReadFrames(t, b, frames)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if d := a.Stats().SendDrops.Load(); d != 0 {
				t.Errorf("SendDrops = %d, want 0", d)
			}
			// Batching, deterministically: datagrams already queued (fewer than a unixgram
			// queue's 10) all come back from one recvmmsg.
			queued := frames[:8]
			if _, err := a.WriteBatch(queued); err != nil {
				t.Fatal(err)
			}
			calls := b.Stats().ReadCalls.Load()
			bufs, bsizes := porttest.Buffers(64, port.MaxFrame)
			if n, err := b.ReadBatch(bufs, bsizes); err != nil || n != len(queued) {
				t.Errorf("ReadBatch of %d queued datagrams = %d, %v: not batching", len(queued), n, err)
			}
			if c := b.Stats().ReadCalls.Load() - calls; c != 1 {
				t.Errorf("%d recvmmsg calls for %d queued datagrams, want 1", c, len(queued))
			}
			sizes := []int{14, 1514, 9014, 65507} // 65507: the largest UDP/IPv4 payload
			if kind == "unixgram" {
				sizes = append(sizes, 65535+14, port.MaxFrame)
			}
			for i, n := range sizes {
				f := [][]byte{porttest.Frame(n, byte(i))}
				if n, err := b.WriteBatch(f); n != 1 || err != nil {
					t.Fatalf("WriteBatch(%d bytes) = %d, %v", len(f[0]), n, err)
				}
				porttest.ReadFrames(t, a, f)
			}
		})
	}
}

// Datagrams outside [port.MinFrame, port.MaxFrame] are dropped and counted; good ones around them
// arrive packed at the front of bufs.
func TestDgramBadSizes(t *testing.T) {
	for _, kind := range []string{"udp", "unixgram"} {
		t.Run(kind, func(t *testing.T) {
			a, b := dgramPorts(t, kind)
			raw := a.conn.(interface {
				WriteTo([]byte, net.Addr) (int, error)
			})
			dst := b.conn.LocalAddr()
			good1, good2 := porttest.Frame(60, 1), porttest.Frame(70, 2)
			send := func(p []byte) {
				if _, err := raw.WriteTo(p, dst); err != nil {
					t.Fatal(err)
				}
			}
			send(porttest.Frame(13, 9))
			send(good1)
			send(nil)
			wantOver := uint64(0)
			if kind == "unixgram" {
				send(porttest.Frame(port.MaxFrame+1, 9))
				wantOver = 1
			}
			send(good2)
			porttest.ReadFrames(t, b, [][]byte{good1, good2})
			if got := b.Stats().ShortDatagram.Load(); got != 2 {
				t.Errorf("ShortDatagram = %d, want 2", got)
			}
			if got := b.Stats().OversizeDatagram.Load(); got != wantOver {
				t.Errorf("OversizeDatagram = %d, want %d", got, wantOver)
			}
			n, err := a.WriteBatch([][]byte{good1, porttest.Frame(5, 1)})
			var fe *port.FrameError
			if n != 1 || !errors.As(err, &fe) {
				t.Errorf("WriteBatch with a 5-byte frame = %d, %v; want 1 and a port.FrameError", n, err)
			}
		})
	}
}

// Sending to a UNIX path nobody has bound yet drops and counts, and does not fail.
func TestDgramRemoteMissing(t *testing.T) {
	dir := t.TempDir()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Net: "unixgram", Name: filepath.Join(dir, "l")})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewDgramPort(c, &net.UnixAddr{Net: "unixgram", Name: filepath.Join(dir, "nobody")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	frames := [][]byte{porttest.Frame(60, 1), porttest.Frame(60, 2), porttest.Frame(60, 3)}
	if n, err := p.WriteBatch(frames); n != 3 || err != nil {
		t.Fatalf("WriteBatch = %d, %v; want 3, nil", n, err)
	}
	if got := p.Stats().SendDrops.Load(); got != 3 {
		t.Errorf("SendDrops = %d, want 3", got)
	}
}

func TestDgramCloseUnblocksRead(t *testing.T) {
	porttest.CheckLeaks(t)
	a, _ := dgramPorts(t, "udp")
	errc := make(chan error)
	go func() {
		bufs, sizes := porttest.Buffers(4, port.MaxFrame)
		_, err := a.ReadBatch(bufs, sizes)
		errc <- err
	}()
	a.Close()
	if err := <-errc; !errors.Is(err, port.ErrClosed) {
		t.Errorf("ReadBatch after Close: %v, want port.ErrClosed", err)
	}
}

func TestDgramZeroAllocs(t *testing.T) {
	for _, kind := range []string{"udp", "unixgram"} {
		t.Run(kind, func(t *testing.T) {
			a, b := dgramPorts(t, kind)
			frames := make([][]byte, 8) // below net.unix.max_dgram_qlen
			for i := range frames {
				frames[i] = porttest.Frame(1514, byte(i))
			}
			bufs, sizes := porttest.Buffers(64, port.MaxFrame)
			allocs := testing.AllocsPerRun(100, func() {
				if n, err := a.WriteBatch(frames); n != len(frames) || err != nil {
					t.Fatalf("WriteBatch = %d, %v", n, err)
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
				t.Errorf("%v allocations per batch round trip, want 0", allocs)
			}
		})
	}
}

// TestDgramSendGivesUp: a unixgram receiver that never reads fills its queue
// (net.unix.max_dgram_qlen); the sender waits sendWait, then drops the rest of the batch
// and counts it, rather than wedge the pipeline. Every datagram is either queued for the
// receiver or counted.
func TestDgramSendGivesUp(t *testing.T) {
	porttest.CheckLeaks(t)
	a, b := dgramPorts(t, "unixgram")
	a.sendWait = 20 * time.Millisecond
	var frames [][]byte
	for i := 0; i < 40; i++ {
		frames = append(frames, porttest.Frame(60, byte(i)))
	}
	if n, err := a.WriteBatch(frames); n != len(frames) || err != nil {
		t.Fatalf("WriteBatch = %d, %v; want every frame sent or dropped", n, err)
	}
	drops := a.Stats().SendDrops.Load()
	if drops == 0 {
		t.Fatal("no datagram dropped with a receiver that never reads")
	}
	bufs, sizes := porttest.Buffers(64, port.MaxFrame)
	n, err := b.ReadBatch(bufs, sizes)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(n)+drops != uint64(len(frames)) {
		t.Errorf("%d queued + %d dropped, want %d", n, drops, len(frames))
	}
	for i := 0; i < n; i++ {
		if !bytes.Equal(bufs[i][:sizes[i]], frames[i]) {
			t.Fatalf("queued datagram %d differs: the ones kept must be the first, in order", i)
		}
	}
}
