//go:build linux

package netmapio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"tapgro/port"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"tapgro/port/porttest"
)

// modelPort builds a NetmapPort over the model. The only stand-in is the file the port
// polls: an eventfd that the model writes whenever the real kernel would wake a netmap
// poller (packets for the port, TX slots freed). Everything else is the port's own code.
func modelPort(t testing.TB, m *nmModel, hdrLen int) (*NetmapPort, *port.Stats, *NetmapStats) {
	t.Helper()
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	kfd, err := unix.Dup(efd)
	if err != nil {
		t.Fatal(err)
	}
	unix.SetNonblock(kfd, true)
	kick := os.NewFile(uintptr(kfd), "model-kick") // its own fd: the port's file holds its write lock while it waits
	t.Cleanup(func() { kick.Close() })
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	m.mu.Lock()
	m.kick = func() { kick.Write(one[:]) }
	m.mu.Unlock()
	c, st, nst := m.core(t, hdrLen)
	p, err := newNetmapPort(os.NewFile(uintptr(efd), "model"), c, "netmap:model", true, nil, st)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, st, nst
}

func TestNetmapPortPair(t *testing.T) {
	porttest.CheckLeaks(t)
	for _, hl := range []int{0, 12} {
		a := newModel(t, modelConfig{slots: 128})
		b := newModel(t, modelConfig{slots: 128})
		link(a, b)
		pa, _, _ := modelPort(t, a, hl)
		pb, stb, _ := modelPort(t, b, hl)
		if pa.VnetHdrLen() != hl || (pa.Accepts() != 0) != (hl != 0) {
			t.Fatalf("hdr %d: VnetHdrLen %d Accepts %v", hl, pa.VnetHdrLen(), pa.Accepts())
		}
		var frames [][]byte
		for i := 0; i < 60; i++ {
			frames = append(frames, gsoFrame(hl, []int{60, 1514, 65536, 9000, 2048}[i%5], byte(i)))
		}
		// VALE drops what does not fit the receiver's ring; keep each batch within it so
		// the comparison is exact, and send both ways at once.
		var wg sync.WaitGroup
		// Flow control on a VALE switch is the receiver's ring: write a batch, read it.
		for i := 0; i < len(frames); i += 3 {
			wg.Add(2)
			go func() {
				defer wg.Done()
				if n, err := pa.WriteBatch(frames[i : i+3]); n != 3 || err != nil {
					t.Errorf("A WriteBatch = %d, %v", n, err)
				}
			}()
			go func() {
				defer wg.Done()
				if n, err := pb.WriteBatch(frames[i : i+3]); n != 3 || err != nil {
					t.Errorf("B WriteBatch = %d, %v", n, err)
				}
			}()
			porttest.ReadFrames(t, pb, frames[i:i+3])
			porttest.ReadFrames(t, pa, frames[i:i+3])
			wg.Wait()
		}
		if stb.FramesIn.Load() != uint64(len(frames)) {
			t.Fatalf("FramesIn %d", stb.FramesIn.Load())
		}
		a.checkClean(t)
		b.checkClean(t)
	}
}

func TestNetmapPortBlockingRead(t *testing.T) {
	porttest.CheckLeaks(t)
	m := newModel(t, modelConfig{slots: 64})
	p, _, _ := modelPort(t, m, 0)
	bufs, sizes := porttest.Buffers(4, port.MaxFrame)

	// A deadline ends a wait without ending the port.
	p.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := p.ReadBatch(bufs, sizes); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadBatch past deadline = %v", err)
	}
	p.SetReadDeadline(time.Time{})

	// A blocked ReadBatch returns when a frame arrives (whether it started waiting
	// before or after the inject).
	want := porttest.Frame(5000, 3)
	done := make(chan error, 1)
	go func() {
		n, err := p.ReadBatch(bufs, sizes)
		if err == nil && (n != 1 || !bytes.Equal(bufs[0][:sizes[0]], want)) {
			err = errors.New("wrong frame")
		}
		done <- err
	}()
	m.inject(want)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Close unblocks a waiting reader with port.ErrClosed.
	go func() {
		_, err := p.ReadBatch(bufs, sizes)
		done <- err
	}()
	p.Close()
	if err := <-done; err != port.ErrClosed {
		t.Fatalf("ReadBatch after Close = %v", err)
	}
	if _, err := p.TryWriteBatch([][]byte{porttest.Frame(60, 1)}); err != port.ErrClosed {
		t.Fatalf("TryWriteBatch after Close = %v", err)
	}
	m.checkClean(t)
}

func TestNetmapPortTxFull(t *testing.T) {
	porttest.CheckLeaks(t)
	m := newModel(t, modelConfig{slots: 16, holdTX: true})
	p, st, _ := modelPort(t, m, 12)
	var frames [][]byte
	for i := 0; i < 10; i++ {
		frames = append(frames, gsoFrame(12, 4000, byte(i))) // 2 slots each
	}
	n, err := p.TryWriteBatch(frames)
	if n != 7 || err != port.ErrWouldBlock {
		t.Fatalf("TryWriteBatch = %d, %v; want 7, port.ErrWouldBlock", n, err)
	}
	if free, size := p.Room(); free != 2048 || size != 15*2048 {
		t.Fatalf("Room = %d of %d", free, size)
	}
	if err := p.WaitWritable(time.Now().Add(-time.Second)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("WaitWritable past deadline = %v", err)
	}
	// WriteBatch waits for room; the model frees slots as a NIC would.
	done := make(chan error, 1)
	go func() {
		n, err := p.WriteBatch(frames[7:])
		if err == nil && n != 3 {
			err = errors.New("short write")
		}
		done <- err
	}()
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			m.mu.Lock()
			out := append([][]byte(nil), m.out...)
			m.mu.Unlock()
			sameFrames(t, out, frames)
			if st.FramesOut.Load() != 10 {
				t.Fatalf("FramesOut %d", st.FramesOut.Load())
			}
			m.checkClean(t)
			return
		default:
			m.releaseTX(1)
			time.Sleep(time.Millisecond)
		}
	}
}

func TestNetmapPortSetHdr(t *testing.T) {
	m := newModel(t, modelConfig{slots: 16})
	p, _, nst := modelPort(t, m, 0)
	var set []int
	p.setHdr = func(n int) error { set = append(set, n); return nil }
	m.inject(porttest.Frame(100, 1)) // arrives with the old (no) header
	if err := p.SetVnetHdrLen(7); err == nil {
		t.Fatal("length 7 accepted")
	}
	if err := p.SetVnetHdrLen(12); err != nil {
		t.Fatal(err)
	}
	if p.VnetHdrLen() != 12 || len(set) != 1 || nst.Stale.Load() != 1 {
		t.Fatalf("VnetHdrLen %d, set %v, Stale %d", p.VnetHdrLen(), set, nst.Stale.Load())
	}
	f := gsoFrame(12, 100, 2)
	m.inject(f)
	porttest.ReadFrames(t, p, [][]byte{f})
	if err := p.SetVnetHdrLen(10); err == nil {
		t.Fatal("header length changed after the datapath started")
	}
	if !p.HasVnetHdrLen(10) || p.HasVnetHdrLen(20) || !p.HasUFO() || p.HasUSO() {
		t.Fatal("probes")
	}
}

// TestNetmapPortAllocs: ReadBatch and WriteBatch allocate nothing in steady state.
func TestNetmapPortAllocs(t *testing.T) {
	m := newModel(t, modelConfig{slots: 256, loopback: true})
	p, _, _ := modelPort(t, m, 12)
	frames := [][]byte{gsoFrame(12, 1500, 1), gsoFrame(12, 65000, 2), gsoFrame(12, 60, 3)}
	bufs, sizes := porttest.Buffers(8, port.MaxFrame+12)
	round := func() {
		if n, err := p.WriteBatch(frames); n != 3 || err != nil {
			t.Fatalf("WriteBatch = %d, %v", n, err)
		}
		for got := 0; got < 3; {
			n, err := p.ReadBatch(bufs, sizes)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	round()
	if a := testing.AllocsPerRun(100, round); a != 0 {
		t.Fatalf("%.1f allocations per round, want 0", a)
	}
}

func BenchmarkNetmapPort(b *testing.B) {
	m := newModel(b, modelConfig{slots: 1024, loopback: true})
	p, _, _ := modelPort(b, m, 12)
	f := gsoFrame(12, 65536, 1)
	frames := [][]byte{f, f, f, f, f, f, f, f}
	bufs, sizes := porttest.Buffers(8, port.MaxFrame+12)
	b.ReportAllocs()
	b.SetBytes(int64(len(f) * len(frames)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.WriteBatch(frames); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < len(frames); {
			n, err := p.ReadBatch(bufs, sizes)
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
}
