package datapath

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/sockport"
	"tapgro/sockport/sockporttest"
	"tapgro/tapdev/taptest"
)

// statPair is sockporttest.StreamPair with counters on the near end, so tests can count
// writev calls.
func statPair(t testing.TB) (near, far *sockport.StreamPort, st *port.Stats) {
	t.Helper()
	st = new(port.Stats)
	near, far = sockporttest.StreamPairStats(t, st, nil)
	return near, far, st
}

// fillMixed fills p's read buffers as a TAP read would: 64 KB TSO frames, every fourth
// a plain MTU frame.
func fillMixed(p *tapToPort) {
	pkt := gsoTCP4(10, pattern(65000), 1448)
	plain := tcp4(1, 1, pattern(1448))
	plainPkt := make([]byte, 10+len(plain))
	copy(plainPkt[10:], plain)
	for i := range p.bufs {
		if i%4 == 3 {
			p.sizes[i] = copy(p.bufs[i], plainPkt)
		} else {
			p.sizes[i] = copy(p.bufs[i], pkt)
		}
	}
}

// drain reads far until it is closed and sends every frame's TCP sequence number and
// length on the channel (when it is not nil).
func drain(far port.Port, seqs chan<- [2]uint32) {
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, port.MaxFrame+sockport.VnetStreamHdrLen)
	}
	sizes := make([]int, 64)
	for {
		n, err := far.ReadBatch(bufs, sizes)
		if err != nil {
			if seqs != nil {
				close(seqs)
			}
			return
		}
		if seqs != nil {
			for i := 0; i < n; i++ {
				seqs <- [2]uint32{binary.BigEndian.Uint32(bufs[i][38:]), uint32(sizes[i])}
			}
		}
	}
}

// The pool is the hard cap: a GSO frame whose segments need more buffers than the whole
// pool holds is dropped and counted; frames before and after it are delivered.
func TestTapToPortPoolCap(t *testing.T) {
	tap := taptest.New(false)
	b := testBridge(tap, true)
	b.cfg.rx = rxpool.Config{BufSize: 2048, Bytes: 128 << 10} // 64 buffers
	near, far, _ := statPair(t)
	b.port.Store(&portRef{p: near})
	p := newTapToPort(b)
	seqs := make(chan [2]uint32, 4096)
	go drain(far, seqs)

	pkts := [][]byte{
		gsoTCP4(10, pattern(65000), 1448), // 45 segments: fits
		gsoTCP4(10, pattern(65000), 536),  // 122 segments: more than 64 buffers
		gsoTCP4(10, pattern(28000), 1448), // 20 segments: 45 + 20 > 64
	}
	for i, pkt := range pkts {
		p.sizes[i] = copy(p.bufs[i], pkt)
	}
	p.process(len(pkts))
	got := 0
	for got < 45+20 {
		select {
		case <-seqs:
			got++
		case <-time.After(5 * time.Second):
			t.Fatalf("got %d of %d segments", got, 45+20)
		}
	}
	if d := b.rxStats.Drops[rxpool.DropTooBig].Load(); d != 1 {
		t.Fatalf("too_big drops = %d, want 1", d)
	}
	if b.rxStats.MaxInUse.Load() > 64 {
		t.Fatalf("pool held %d buffers of 64", b.rxStats.MaxInUse.Load())
	}
	// The third frame's 20 segments do not fit beside the first one's 45: it forced
	// a pool_full flush.
	if b.rxStats.Flushes[rxpool.ReasonPoolFull].Load() != 1 || b.rxStats.Flushes[rxpool.ReasonBatchEnd].Load() != 1 {
		t.Fatalf("flushes: pool_full %d, batch_end %d; want 1 each",
			b.rxStats.Flushes[rxpool.ReasonPoolFull].Load(), b.rxStats.Flushes[rxpool.ReasonBatchEnd].Load())
	}
}

// Batching: one TAP batch of 8 TSO frames (360 segments) leaves in one writev; per-frame
// mode (--rx-batch=off) writes every segment on its own.
func TestTapToPortBatching(t *testing.T) {
	for _, perFrame := range []bool{false, true} {
		t.Run(fmt.Sprintf("perFrame=%v", perFrame), func(t *testing.T) {
			tap := taptest.New(false)
			b := testBridge(tap, true)
			b.cfg.rx.PerFrame = perFrame
			near, far, st := statPair(t)
			b.port.Store(&portRef{p: near})
			p := newTapToPort(b)
			seqs := make(chan [2]uint32, 4096)
			go drain(far, seqs)
			pkt := gsoTCP4(10, pattern(65000), 1448)
			for i := 0; i < 8; i++ {
				p.sizes[i] = copy(p.bufs[i], pkt)
			}
			p.process(8)
			for got := 0; got < 360; got++ {
				select {
				case s := <-seqs:
					// Every TSO frame restarts at seq 1: segment i of a frame is at
					// 1 + (i mod 45) × 1448.
					if want := uint32(1 + (got%45)*1448); s[0] != want {
						t.Fatalf("segment %d has seq %d, want %d", got, s[0], want)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("got %d of 360 segments", got)
				}
			}
			want := uint64(1)
			if perFrame {
				want = 360
			}
			if w := st.WriteCalls.Load(); w != want {
				t.Fatalf("%d writev calls for 360 frames, want %d", w, want)
			}
			if b.t2p.Frames.Load() != 360 || b.rxStats.FramesSent.Load() != 360 {
				t.Fatalf("frames delivered: bridge %d, pool %d", b.t2p.Frames.Load(), b.rxStats.FramesSent.Load())
			}
		})
	}
}

// A peer that stops reading stops the pipeline (backpressure), and when it resumes every
// segment arrives once and in order.
func TestTapToPortBackpressure(t *testing.T) {
	tap := taptest.New(false)
	b := testBridge(tap, true)
	near, far, _ := statPair(t)
	b.port.Store(&portRef{p: near})
	done := make(chan error, 1)
	go func() { done <- b.runTapToPort() }()
	defer func() { tap.Close(); <-done }()

	const frames = 400 // 400 × 45 segments = 26 MB: several socket buffers
	go func() {
		for i := 0; i < frames; i++ {
			pkt := gsoTCP4(10, pattern(65000), 1448)
			// Continue one stream: frame i starts at 1 + i×65000.
			binary.BigEndian.PutUint32(pkt[10+38:], uint32(1+i*65000))
			if !tap.Inject(pkt) {
				return
			}
		}
	}()
	// The port fills; the pipeline blocks.
	for deadline := time.Now().Add(10 * time.Second); b.rxStats.Stalls.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no stall with a peer that does not read")
		}
	}
	read := b.t2p.Reads.Load()
	time.Sleep(100 * time.Millisecond)
	if r := b.t2p.Reads.Load(); r != read {
		t.Fatalf("the pipeline read %d more TAP frames while the port was full", r-read)
	}
	seqs := make(chan [2]uint32, 4096)
	go drain(far, seqs)
	next := uint32(1)
	for got := 0; got < frames*45; got++ {
		select {
		case s := <-seqs:
			if s[0] != next {
				t.Fatalf("segment %d: seq %d, want %d (lost, duplicated or reordered)", got, s[0], next)
			}
			next += s[1] - 54
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d of %d segments", got, frames*45)
		}
	}
	if b.t2p.Drops[DropPortError].Load() != 0 || b.rxStats.Drops[rxpool.DropTooBig].Load() != 0 {
		t.Fatal("frames dropped under backpressure")
	}
}

// The pipeline allocates nothing per batch.
func TestTapToPortZeroAllocs(t *testing.T) {
	tap := taptest.New(false)
	b := testBridge(tap, true)
	near, far, _ := statPair(t)
	b.port.Store(&portRef{p: near})
	go drain(far, nil)
	p := newTapToPort(b)
	fillMixed(p)
	allocs := testing.AllocsPerRun(100, func() { p.process(8) })
	if allocs != 0 {
		t.Fatalf("%v allocations per batch, want 0", allocs)
	}
}

// BenchmarkTapToPortPool is BenchmarkTapToPort over pool geometries (the default is
// 2048 × 2048 B): ns per frame and writev calls per frame.
func BenchmarkTapToPortPool(b *testing.B) {
	for _, c := range []struct {
		buf, bytes int
		batch      int // TSO frames per TAP batch
	}{
		{2048, 256 << 10, 8}, {2048, 1 << 20, 8}, {2048, 4 << 20, 8}, {2048, 16 << 20, 8},
		{4096, 4 << 20, 8}, {1536, 3 << 20, 8},
		{2048, 1 << 20, 64}, {2048, 4 << 20, 64}, {2048, 8 << 20, 64},
	} {
		b.Run(fmt.Sprintf("buf=%d/pool=%dK/tso=%d", c.buf, c.bytes>>10, c.batch), func(b *testing.B) {
			tap := taptest.New(false)
			br := testBridge(tap, true)
			br.cfg.rx = rxpool.Config{BufSize: c.buf, Bytes: c.bytes}
			near, far, st := statPair(b)
			br.port.Store(&portRef{p: near})
			go drain(far, nil)
			p := newTapToPort(br)
			pkt := gsoTCP4(10, pattern(65000), 1448)
			for i := range p.bufs {
				p.sizes[i] = copy(p.bufs[i], pkt)
			}
			b.SetBytes(int64(len(pkt) * c.batch))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p.process(c.batch)
			}
			b.StopTimer()
			frames := float64(br.t2p.Frames.Load())
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/frames, "ns/frame")
			b.ReportMetric(float64(st.WriteCalls.Load())/frames, "writev/frame")
		})
	}
}
