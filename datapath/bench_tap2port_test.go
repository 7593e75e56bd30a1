package datapath

import (
	"syscall"
	"testing"
	"time"

	"tapgro/sockport/sockporttest"
	"tapgro/tapdev/taptest"
)

// cpuNow is the process's user+system CPU time: both the pipeline and the goroutine
// draining the port, kernel copies included, so a benchmark reports work, not just the
// wall time two cores overlap.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchTapToPortFrames times process on batches of perBatch copies of pkt (a TAP record:
// 10-byte vnet header and frame) sent to a stream port whose far end another goroutine
// drains, and reports ns and CPU ns per frame on the wire.
func benchTapToPortFrames(b *testing.B, pkt []byte, perBatch int) {
	tap := taptest.New(false)
	br := testBridge(tap, true)
	near, far := sockporttest.StreamPair(b)
	br.port.Store(newPortRef(near))
	go drain(far, nil)
	p := newTapToPort(br)
	for i := range p.bufs {
		p.sizes[i] = copy(p.bufs[i], pkt)
	}
	b.SetBytes(int64((len(pkt) - 10) * perBatch))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuNow()
	for i := 0; i < b.N; i++ {
		p.process(perBatch)
	}
	cpu := cpuNow() - cpu0
	b.StopTimer()
	frames := float64(br.t2p.Frames.Load())
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/frames, "ns/frame")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkTapToPortGSO: one op is a TAP batch of eight 64 KB TSO frames, each split
// into 45 MTU segments for a plain stream port.
func BenchmarkTapToPortGSO(b *testing.B) {
	benchTapToPortFrames(b, gsoTCP4(10, pattern(65000), 1448), 8)
}

// BenchmarkTapToPortPlain: one op is a TAP batch of 64 plain, fully checksummed
// 1514-byte frames passed whole to a plain stream port.
func BenchmarkTapToPortPlain(b *testing.B) {
	plain := tcp4(1, 1, pattern(1460))
	benchTapToPortFrames(b, append(make([]byte, 10), plain...), 64)
}
