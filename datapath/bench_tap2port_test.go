package datapath

import (
	"testing"

	"tapgro/port/porttest"
	"tapgro/tapdev/taptest"
)

// BenchmarkTapToPortPlain measures the host→guest path per plain MTU frame: batches of
// 64 fully checksummed 1514-byte frames from the TAP, one writev to a stream port
// (drained by another goroutine).
func BenchmarkTapToPortPlain(b *testing.B) {
	tap := taptest.New(false)
	br := testBridge(tap, true)
	near, far := porttest.StreamPair(b)
	br.port.Store(newPortRef(near))
	go drain(far, nil)
	p := newTapToPort(br)
	plain := tcp4(1, 1, pattern(1460))
	pkt := make([]byte, 10+len(plain))
	copy(pkt[10:], plain)
	for i := range p.bufs {
		p.sizes[i] = copy(p.bufs[i], pkt)
	}
	const perBatch = 64
	b.SetBytes(int64(len(plain) * perBatch))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.process(perBatch)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(br.t2p.Frames.Load()), "ns/frame")
}
