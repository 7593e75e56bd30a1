package coalescer

import (
	"testing"

	"tapgro/coalescer/grotest"
	"tapgro/vnethdr"
)

// The frame builders are package grotest's, shared with vhostnet's run of the suite;
// these names keep this package's tests short.
type (
	spec = grotest.Spec
	flow = grotest.Flow
)

var (
	newFlow     = grotest.NewFlow
	build       = grotest.Build
	payloadByte = grotest.PayloadByte
	tsOpts      = grotest.TSOpts

	macA, macB = grotest.MACA, grotest.MACB
	ip4A, ip4B = grotest.IP4A, grotest.IP4B
	ip6A, ip6B = grotest.IP6A, grotest.IP6B

	withFlags = grotest.WithFlags
	orFlags   = grotest.OrFlags
	withTTL   = grotest.WithTTL
	withTOS   = grotest.WithTOS
	withID    = grotest.WithID
	withDF    = grotest.WithDF
	withSeq   = grotest.WithSeq
	withAck   = grotest.WithAck
	withOpts  = grotest.WithOpts
	withLabel = grotest.WithLabel
	withPort  = grotest.WithPort
	withVLAN  = grotest.WithVLAN
	withPad   = grotest.WithPad

	badL4      = grotest.BadL4
	badIP      = grotest.BadIP
	zeroUDP    = grotest.ZeroUDP
	partialL4  = grotest.PartialL4
	withIPOpt  = grotest.WithIPOpt
	withMF     = grotest.WithMF
	dstOpts    = grotest.DstOpts
	fragHdr    = grotest.FragHdr
	dstOptsPad = grotest.DstOptsPad
	hbhDstOpts = grotest.HbhDstOpts
	routingHdr = grotest.RoutingHdr
)

// outPkt is one emitted packet, copied.
type outPkt struct {
	hdr   vnethdr.Hdr
	frame []byte
}

// harness wraps a Coalescer and records its output.
type harness struct {
	t   testing.TB
	c   *Coalescer
	vl  int
	out []outPkt
}

func newHarness(t testing.TB, cfg Config) *harness {
	h := &harness{t: t, vl: cfg.VnetHdrLen}
	if h.vl == 0 {
		cfg.VnetHdrLen, h.vl = vnethdr.Len, vnethdr.Len
	}
	h.c = New(cfg, func(pkt []byte) {
		var o outPkt
		if err := o.hdr.Decode(pkt, h.vl); err != nil {
			t.Fatalf("emitted %d bytes, shorter than the header", len(pkt))
		}
		o.frame = append([]byte(nil), pkt[h.vl:]...)
		h.out = append(h.out, o)
	})
	return h
}

// add offers frame (copied into a buffer with headroom) with arrival header in.
func (h *harness) add(frame []byte, in *vnethdr.Hdr) {
	buf := make([]byte, h.vl+len(frame))
	// Garbage in the headroom: the engine must write a fresh header, never pass it on.
	for i := range h.vl {
		buf[i] = 0xee
	}
	copy(buf[h.vl:], frame)
	h.c.Add(buf, in, 0)
}
