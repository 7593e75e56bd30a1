package coalescer

import (
	"bytes"
	"math/rand/v2"
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
	now int64 // the time add passes; the caller moves it

	// By reference (ring > 0): frames go in through AddRef from a ring of buffers, each
	// released (Release) and poisoned before it is reused, so an aggregate that still
	// pointed into it would emit poison and fail the comparison with the input.
	ring  [][]byte
	used  []int // bytes of ring[k] the last frame occupied
	next  int
	iovs  int // most iovecs one emitV call carried
	vcall int // emitV calls
}

// harnessRing, when > 0, makes newHarness feed frames by reference from a ring of that
// many buffers (TestByReference runs the table tests that way).
var harnessRing int

// ringBufs and poison are the by-reference harnesses' buffers, allocated once.
var (
	ringBufs [][]byte
	poison   []byte
)

const ringBufLen = vnethdr.LenMrgRxbuf + maxL2 + maxIPLen + 64 // a padded jumbo frame fits

func newHarness(t testing.TB, cfg Config) *harness { return newHarnessRing(t, cfg, harnessRing) }

func newHarnessRing(t testing.TB, cfg Config, ring int) *harness {
	h := &harness{t: t, vl: cfg.VnetHdrLen}
	if h.vl == 0 {
		cfg.VnetHdrLen, h.vl = vnethdr.Len, vnethdr.Len
	}
	if ring > 0 {
		cfg.RefTags = ring
		if poison == nil {
			poison = bytes.Repeat([]byte{0xdb}, ringBufLen)
		}
		for len(ringBufs) < ring {
			ringBufs = append(ringBufs, bytes.Clone(poison))
		}
		h.ring, h.used = ringBufs[:ring], make([]int, ring)
	}
	if poison == nil {
		poison = bytes.Repeat([]byte{0xdb}, ringBufLen)
	}
	h.c = New(cfg, h.record)
	if ring > 0 {
		var pkt []byte
		h.c.SetEmitV(func(iov [][]byte) {
			h.vcall++
			h.iovs = max(h.iovs, len(iov))
			if len(iov) > h.c.maxRefs+1 || len(iov) > MaxIovRefs+1 {
				t.Fatalf("emitV with %d iovecs, MaxRefs %d", len(iov), h.c.maxRefs)
			}
			if len(iov[0]) < h.vl {
				t.Fatalf("emitV: first iovec of %d bytes holds no header", len(iov[0]))
			}
			pkt = pkt[:0]
			for _, b := range iov {
				pkt = append(pkt, b...)
			}
			h.record(pkt)
		})
	}
	return h
}

func (h *harness) record(pkt []byte) {
	var o outPkt
	if err := o.hdr.Decode(pkt, h.vl); err != nil {
		h.t.Fatalf("emitted %d bytes, shorter than the header", len(pkt))
	}
	o.frame = append([]byte(nil), pkt[h.vl:]...)
	h.out = append(h.out, o)
}

// harnessSplit, when non-nil, makes the harness feed frames through AddSplit (TestSplit
// runs the table tests that way): each frame's private prefix is cut at a point drawn
// from it, the rest split into pieces of drawn sizes, odd ones included.
var harnessSplit *rand.Rand

// add offers frame (copied into a buffer with headroom) with arrival header in.
func (h *harness) add(frame []byte, in *vnethdr.Hdr) {
	if h.ring != nil {
		h.addRef(frame, in)
		return
	}
	if harnessSplit != nil {
		h.addSplit(frame, in, harnessSplit)
		return
	}
	buf := make([]byte, h.vl+len(frame))
	// Garbage in the headroom: the engine must write a fresh header, never pass it on.
	for i := range h.vl {
		buf[i] = 0xee
	}
	copy(buf[h.vl:], frame)
	h.c.Add(buf, in, h.now)
}

// addRef is add by reference: the next ring buffer is released, poisoned where the
// last frame lay, and filled.
func (h *harness) addRef(frame []byte, in *vnethdr.Hdr) {
	k := h.next
	h.next = (k + 1) % len(h.ring)
	h.c.Release(k)
	if h.c.Pinned(k) {
		h.t.Fatalf("buffer %d still pinned after Release", k)
	}
	b := h.ring[k]
	copy(b[:h.used[k]], poison)
	h.used[k] = h.vl + len(frame)
	for i := range h.vl {
		b[i] = 0xee
	}
	copy(b[h.vl:], frame)
	h.c.AddRef(b[:h.vl+len(frame)], in, h.now, k)
}

// pinned reports whether any ring buffer is still referenced.
func (h *harness) pinned() bool {
	for k := range h.ring {
		if h.c.Pinned(k) {
			return true
		}
	}
	return false
}

// splitCuts are private-prefix lengths worth trying: inside and at the end of each
// header, a TCP option, the payload.
var splitCuts = []int{0, 1, 13, 14, 17, 18, 33, 34, 41, 53, 54, 58, 65, 66, 74, 86, 94, 100, 512}

// addSplit is add through AddSplit: the buffer past the prefix holds poison, each piece
// of rest is a copy of its own, poisoned once AddSplit returns, so output built from
// anything but one read of rest during the call fails the comparison with the input.
func (h *harness) addSplit(frame []byte, in *vnethdr.Hdr, rng *rand.Rand) {
	valid := splitCuts[rng.IntN(len(splitCuts))]
	if rng.IntN(4) == 0 && len(frame) > 0 {
		valid = rng.IntN(len(frame))
	}
	valid = min(valid, len(frame))
	buf := make([]byte, h.vl+len(frame))
	for i := range buf {
		buf[i] = 0xdb
	}
	for i := range h.vl {
		buf[i] = 0xee
	}
	copy(buf[h.vl:], frame[:valid])
	var rest [][]byte
	for off := valid; off < len(frame); {
		n := min(len(frame)-off, 1+rng.IntN([]int{3, 64, 1500, 9000}[rng.IntN(4)]))
		rest = append(rest, bytes.Clone(frame[off:off+n]))
		off += n
	}
	h.c.AddSplit(buf, valid, rest, in, h.now)
	for _, r := range rest {
		copy(r, poison[:len(r)])
	}
}
