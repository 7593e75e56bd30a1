package rxpool

import (
	"encoding/binary"
	"runtime"
	"syscall"
	"testing"
	"time"

	"tapgro/port"
	"tapgro/sockport/sockporttest"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A consumer that stops reading for 2 s and then resumes: the producer (the pool's
// goroutine, as in tapgro) blocks in the netpoller without burning CPU, its memory
// stays at the pool, and every frame arrives once, in order.
//
// Bounds (behaviour, not timing): process CPU over the stall < 0.2 s; the pool never
// holds more buffers than it has; the heap grows by < 1 MiB over the stall.
func TestSlowConsumer(t *testing.T) {
	const (
		total     = 30000 // 1514-byte frames: 45 MB, several times the socket buffer
		beforeGap = 2000
		stall     = 2 * time.Second
		batch     = 64
	)
	wst := new(port.Stats)
	w, r := sockporttest.StreamPairStats(t, wst, nil)
	st := new(Stats)
	p, err := New(Config{}, st)
	if err != nil {
		t.Fatal(err)
	}

	errc := make(chan error, 1)
	go func() {
		frame := make([]byte, 1514)
		for seq := uint64(0); seq < total; seq++ {
			binary.BigEndian.PutUint64(frame, seq)
			frame[1513] = byte(seq)
			buf, ok := p.Reserve(len(frame))
			if !ok {
				if _, _, err := p.Flush(w, ReasonPoolFull); err != nil {
					errc <- err
					return
				}
				buf, _ = p.Reserve(len(frame))
			}
			p.Commit(copy(buf, frame))
			if seq%batch == batch-1 {
				if _, _, err := p.Flush(w, ReasonBatchEnd); err != nil {
					errc <- err
					return
				}
			}
		}
		_, _, err := p.Flush(w, ReasonBatchEnd)
		errc <- err
	}()

	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, port.MaxFrame)
	}
	sizes := make([]int, 64)
	next := uint64(0)
	read := func(until uint64) {
		for next < until {
			n, err := r.ReadBatch(bufs, sizes)
			if err != nil {
				t.Fatalf("ReadBatch after %d frames: %v", next, err)
			}
			for i := 0; i < n; i++ {
				f := bufs[i][:sizes[i]]
				if len(f) != 1514 {
					t.Fatalf("frame %d is %d bytes", next, len(f))
				}
				if seq := binary.BigEndian.Uint64(f); seq != next || f[1513] != byte(seq) {
					t.Fatalf("got frame %d, want %d: lost, duplicated or reordered", seq, next)
				}
				next++
			}
		}
	}
	read(beforeGap)

	// Stall. Give the producer time to fill the socket and the pool and block.
	time.Sleep(200 * time.Millisecond)
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := cpuTime()
	writes0, stalls0 := wst.WriteCalls.Load(), st.Stalls.Load()
	time.Sleep(stall)
	cpu := cpuTime() - cpu0
	runtime.ReadMemStats(&m1)
	writes, stalls := wst.WriteCalls.Load()-writes0, st.Stalls.Load()-stalls0
	t.Logf("stalled %v: process CPU %v, heap %d -> %d bytes, pool max %d of %d buffers, %d writev and %d stalls while stalled",
		stall, cpu, m0.HeapAlloc, m1.HeapAlloc, st.MaxInUse.Load(), p.Buffers(), writes, stalls)
	if writes > 1 || stalls > 1 {
		t.Errorf("%d writev calls and %d stalls while the consumer was stopped: the producer is polling", writes, stalls)
	}
	if cpu > 200*time.Millisecond {
		t.Errorf("process used %v of CPU over a %v stall, want < 200ms: something spins", cpu, stall)
	}
	if m1.HeapAlloc > m0.HeapAlloc+1<<20 {
		t.Errorf("heap grew from %d to %d bytes while stalled", m0.HeapAlloc, m1.HeapAlloc)
	}

	read(total)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st.MaxInUse.Load() > int64(p.Buffers()) || p.InUse() != 0 {
		t.Fatalf("pool held up to %d buffers of %d, %d at the end", st.MaxInUse.Load(), p.Buffers(), p.InUse())
	}
	if st.Stalls.Load() == 0 {
		t.Fatal("the producer never met a full socket: the test stalled nothing")
	}
	t.Logf("%d frames in %d writev calls (%.3f per frame), %d stalls, blocked %v, flushes %v",
		total, wst.WriteCalls.Load(), float64(wst.WriteCalls.Load())/total, st.Stalls.Load(), time.Duration(st.BlockedNanos.Load()), flushCounts(st))
	if st.FramesSent.Load() != total {
		t.Fatalf("sent %d frames, want %d", st.FramesSent.Load(), total)
	}
	// Nothing more arrives: no duplicates after the last frame.
	r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, _ := r.ReadBatch(bufs, sizes); n != 0 {
		t.Fatalf("%d frames after the last one", n)
	}
}
