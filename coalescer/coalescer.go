package coalescer

import (
	"bytes"
	"fmt"
	"hash/maphash"

	"tapgro/vnethdr"
)

// Defaults and limits.
const (
	DefaultMaxFlows = 64
	// DefaultMaxSegments does not bind before the size cap for segments of 64 bytes or
	// more: Linux TCP GRO counts no segments (skb_gro_receive limits bytes only), so a
	// lower default would stop short of 65535 bytes at small MSS. 1024 is UIO_MAXIOV,
	// the most segments a software fallback can write as one iovec batch.
	DefaultMaxSegments = 1024

	// maxIPLen bounds an aggregate's IP length (IPv4 total length / IPv6 40 + payload
	// length, extension headers included): Linux net/core/gro.c skb_gro_receive refuses
	// a segment once p->len + len >= gro_max_size, whose default is 65536.
	maxIPLen = 65535
	// maxL2 is the largest L2 header we coalesce: Ethernet + one 802.1Q tag.
	maxL2 = vlanHdrLen
)

// Config selects what the engine coalesces. The zero value of MaxFlows/MaxSegments
// means the default; VnetHdrLen must be 10 or 12.
type Config struct {
	MaxFlows    int  // flow table size (bounded, preallocated); default 64
	MaxSegments int  // segments per aggregate; default 1024 (UDP is capped at 64 regardless)
	VnetHdrLen  int  // 10 or 12: bytes of virtio_net_hdr written before each output packet
	DisableTCP  bool // --gro off for TCP
	UDP         bool // coalesce UDP into GSO_UDP_L4 (only when the TAP accepted USO4|USO6)
	ECN         bool // output accepts GSO_ECN (TUN_F_TSO_ECN): a CWR segment may start an aggregate

	// Stats, if non-nil, receives the counters (so an exporter can hold them before
	// the engine exists); nil: the engine keeps its own. Read at New only.
	Stats *Stats

	// Trace, if non-nil, is called once per decision (merge, start, bypass, flush)
	// with the length of the frame or packet concerned. It runs on the packet path:
	// keep it cheap (main rate-limits its log lines).
	Trace func(r Reason, frameLen int)

	// RefTags > 0 enables AddRef: tags 0..RefTags-1 name the caller's read buffers (or
	// groups of them) that aggregates may reference instead of copying from. 0: AddRef
	// is unavailable and nothing for it is allocated (vhostnet's engines).
	RefTags int
	// MaxRefs bounds the payload references one aggregate holds (AddRef); default 128,
	// at most MaxIovRefs. One more segment first copies the referenced payloads into the
	// aggregate's own buffer (the decision to merge does not change), so an emitted
	// packet never needs more than MaxRefs+1 iovecs.
	MaxRefs int
	// RefMinPayload is the smallest first-segment payload for which AddRef references
	// instead of copying: an aggregate that starts with a smaller segment is built by
	// copy, as by Add (its buffers are not pinned). 0: always reference. The datapath
	// sets it from a measurement: a gathered write costs the kernel per iovec, so small
	// segments are cheaper copied (datapath.groRefMinPayload).
	RefMinPayload int
}

// DefaultMaxRefs covers a full 64 KB aggregate of segments down to 512 bytes of payload
// (65495/128 ≈ 512; 1448-byte segments need 45), and MaxIovRefs is UIO_MAXIOV (1024,
// include/uapi/linux/uio.h) minus the iovec of the headers: writev(2) refuses more.
const (
	DefaultMaxRefs = 128
	MaxIovRefs     = 1023
)

// Coalescer is the userspace GRO engine. It is not safe for concurrent use: one
// goroutine (the port → TAP pipeline) owns it; Stats may be read from anywhere.
type Coalescer struct {
	cfg      Config
	emit     func(pkt []byte)
	emitV    func(iov [][]byte) // nil: aggregates with references are copied together for emit
	iov      [][]byte           // emitV's scratch, cap MaxRefs+1
	pins     []int32            // per tag: references held into the caller's buffers
	maxRefs  int
	seed     maphash.Seed
	maxSegs  int
	off      bool // neither TCP nor UDP coalescing: skip parsing entirely
	aggs     []agg
	buckets  []int32 // hash bucket → first agg index, -1 if empty
	mask     uint64
	free     []int32 // stack of unused agg indices
	oldest   int32   // start-order list of held aggregates, -1 if none
	youngest int32
	held     int
	p        pkt      // scratch for the frame being added
	sp       splitSrc // the frame being added, when it came through AddSplit
	stats    *Stats
}

// agg is one open aggregate: a copy of the head frame's headers, its payload in two
// parts, and what the merge rules compare. The payload is buf's flat bytes after the
// headers (segments added by Add, copied; and whatever was copied on hold), then refs,
// slices of the caller's buffers (segments added by AddRef, not copied).
type agg struct {
	buf        []byte // [VnetHdrLen headroom][headers][flat payload], cap VnetHdrLen+18+65535
	flat       int    // payload bytes in buf after the headers (buf[VnetHdrLen+payOff:][:flat])
	refs       [][]byte
	tags       []int32 // tags[k] is the caller's tag of refs[k]
	head       []byte  // while the lone head is referenced: [headroom][frame] in the caller's buffer
	key        flowKey
	hash       uint64
	hnext      int32 // next agg in the same hash bucket
	prev, next int32 // start-order list
	start      int64

	v6, udp bool
	byRef   bool // started by AddRef at or above RefMinPayload: payloads are referenced
	l2      int  // offsets within the frame, as in pkt
	l4Off   int
	payOff  int
	end     int // L2 + current IP length: payOff + flat + the referenced bytes
	headLen int // the head frame's length as received (padding included)
	segs    int
	gsoSize int
	pseudo  uint64 // folded pseudo-header sum without the length

	ipSig  uint32
	lastID uint16
	idMode uint8

	flags   uint8 // head's TCP flags without PSH/FIN/CWR
	cwr     bool
	ack     uint32
	nextSeq uint32
	win     uint16
	partial bool // head arrived with NEEDS_CSUM; a lone head keeps that header
	headHdr vnethdr.Hdr
	capSegs int
}

// IPv4 ID modes of an aggregate, decided by its second segment (Linux 6.18
// include/net/gro.h inet_gro_flush, which sets ip_fixedid at count 1 whatever DF says).
const (
	idUnknown = iota // one segment so far
	idIncr           // ID grows by exactly 1 per segment
	idFixed          // ID constant, DF set or clear
)

// SetEmitV sets the vectored output for aggregates that reference the caller's buffers
// (AddRef): emitV gets iov[0] = [virtio_net_hdr][the head's headers, rewritten][any
// flat payload], then one slice per referenced payload; their concatenation is exactly
// the packet emit would have been given, and it is valid only during the call. emitV
// must not call back into the Coalescer. Without it such an aggregate is copied together
// in its own buffer and handed to emit. Everything else still goes to emit.
func (c *Coalescer) SetEmitV(emitV func(iov [][]byte)) { c.emitV = emitV }

// New returns a Coalescer that hands every output packet to emit. All memory is
// allocated here: MaxFlows aggregate buffers of 65535+VnetHdrLen+18 bytes each (4.2 MB
// at the defaults). emit's argument is [virtio_net_hdr][Ethernet frame] and is valid only
// during the call; emit must not call back into the Coalescer.
// New panics if cfg.VnetHdrLen is neither 10 nor 12 (a programming error).
func New(cfg Config, emit func(pkt []byte)) *Coalescer {
	c := &Coalescer{emit: emit, seed: maphash.MakeSeed(), stats: cfg.Stats}
	if c.stats == nil {
		c.stats = new(Stats)
	}
	c.configure(cfg)
	return c
}

// Stats returns the counters.
func (c *Coalescer) Stats() *Stats { return c.stats }

// Held returns the number of aggregates currently held.
func (c *Coalescer) Held() int { return c.held }

// Oldest returns the start time of the oldest held aggregate, for the I/O loop's poll
// deadline in timer mode.
func (c *Coalescer) Oldest() (t int64, ok bool) {
	if c.oldest < 0 {
		return 0, false
	}
	return c.aggs[c.oldest].start, true
}

// SetConfig applies new settings between batches. Everything held is flushed first
// (counted as batch_end); buffers are reallocated only if MaxFlows or VnetHdrLen grew.
func (c *Coalescer) SetConfig(cfg Config) {
	c.Flush()
	c.configure(cfg)
}

func (c *Coalescer) configure(cfg Config) {
	if cfg.VnetHdrLen != vnethdr.Len && cfg.VnetHdrLen != vnethdr.LenMrgRxbuf {
		panic(fmt.Sprintf("coalescer: VnetHdrLen %d, want %d or %d", cfg.VnetHdrLen, vnethdr.Len, vnethdr.LenMrgRxbuf))
	}
	if cfg.MaxFlows <= 0 {
		cfg.MaxFlows = DefaultMaxFlows
	}
	if cfg.MaxSegments <= 0 {
		cfg.MaxSegments = DefaultMaxSegments
	}
	c.cfg = cfg
	c.maxSegs = cfg.MaxSegments
	c.off = cfg.DisableTCP && !cfg.UDP

	if cfg.MaxRefs <= 0 {
		cfg.MaxRefs = DefaultMaxRefs
	}
	cfg.MaxRefs = min(cfg.MaxRefs, MaxIovRefs)
	c.cfg = cfg
	c.maxRefs = cfg.MaxRefs

	bufLen := cfg.VnetHdrLen + maxL2 + maxIPLen
	if len(c.aggs) < cfg.MaxFlows || (len(c.aggs) > 0 && len(c.aggs[0].buf) < bufLen) {
		c.aggs = make([]agg, cfg.MaxFlows)
		for i := range c.aggs {
			c.aggs[i].buf = make([]byte, bufLen)
		}
	}
	if cfg.RefTags > 0 {
		// Everything held was flushed (SetConfig), so no reference survives this.
		if cap(c.pins) < cfg.RefTags {
			c.pins = make([]int32, cfg.RefTags)
		}
		c.pins = c.pins[:cfg.RefTags]
		clear(c.pins)
		for i := range c.aggs {
			if a := &c.aggs[i]; cap(a.refs) < c.maxRefs {
				a.refs = make([][]byte, 0, c.maxRefs)
				a.tags = make([]int32, 0, c.maxRefs)
			}
		}
		if cap(c.iov) < c.maxRefs+1 {
			c.iov = make([][]byte, 0, c.maxRefs+1)
		}
	} else {
		c.pins = c.pins[:0]
	}
	nb := 1
	for nb < 2*cfg.MaxFlows {
		nb <<= 1
	}
	if cap(c.buckets) < nb {
		c.buckets = make([]int32, nb)
	}
	c.buckets = c.buckets[:nb]
	for i := range c.buckets {
		c.buckets[i] = -1
	}
	c.mask = uint64(nb - 1)
	if cap(c.free) < cfg.MaxFlows {
		c.free = make([]int32, 0, cfg.MaxFlows)
	}
	c.free = c.free[:0]
	for i := cfg.MaxFlows - 1; i >= 0; i-- {
		c.free = append(c.free, int32(i))
	}
	c.oldest, c.youngest, c.held = -1, -1, 0
}

// note counts a decision and reports it to the trace hook.
func (c *Coalescer) note(r Reason, n int) {
	c.stats.Reason(r).Add(1)
	if c.cfg.Trace != nil {
		c.cfg.Trace(r, n)
	}
}

// out hands one packet to emit.
func (c *Coalescer) out(b []byte, segs int) {
	c.stats.Packets.Add(1)
	c.stats.SegsPerPacket[histBucket(segs)].Add(1)
	c.emit(b)
}

// outV hands one packet, referenced in pieces, to emitV.
func (c *Coalescer) outV(iov [][]byte, segs int) {
	c.stats.Packets.Add(1)
	c.stats.SegsPerPacket[histBucket(segs)].Add(1)
	c.emitV(iov)
}

// Add offers one frame. buf[:VnetHdrLen] is free headroom, buf[VnetHdrLen:] the Ethernet
// frame. in is the header the frame arrived with (nil or zero for ports without one):
// NEEDS_CSUM or DATA_VALID means its L4 checksum is trusted; a GSO frame is never merged
// (its flow is flushed, then it passes through with its header). now (monotonic ns) is
// used only by FlushExpired. A frame that is not merged is emitted without copying, with
// a freshly written header in the headroom; an aggregate held for its flow is always
// emitted first, so no frame overtakes held data of its own flow.
func (c *Coalescer) Add(buf []byte, in *vnethdr.Hdr, now int64) { c.add(buf, in, now, -1) }

// AddRef is Add for a frame whose buffer the caller keeps intact, headroom included,
// until the Coalescer no longer refers to it: a merged segment's payload is then
// referenced where it lies instead of copied (its checksum is verified in place, read
// only), and the aggregate leaves through the emitV callback as an iovec list
// (SetEmitV). tag, in 0..Config.RefTags-1, names the caller's buffer (or group of
// buffers) holding the frame. Before the caller reuses any buffer of a tag it calls
// Release(tag); an aggregate also lets go of its references when it is emitted, so after
// Flush nothing is referenced. Decisions, counters and output bytes are exactly Add's.
// AddRef panics if tag is out of range (a programming error).
func (c *Coalescer) AddRef(buf []byte, in *vnethdr.Hdr, now int64, tag int) {
	if uint(tag) >= uint(len(c.pins)) {
		panic(fmt.Sprintf("coalescer: AddRef tag %d, Config.RefTags %d", tag, len(c.pins)))
	}
	c.add(buf, in, now, int32(tag))
}

// Pinned reports whether a held aggregate refers to a buffer of tag.
func (c *Coalescer) Pinned(tag int) bool { return uint(tag) < uint(len(c.pins)) && c.pins[tag] > 0 }

// Release ends every reference into the buffers of tag: each held aggregate referring
// to one copies all its referenced payloads into its own buffer (copy on hold) and stays
// held, so the caller may overwrite them; what the engine emits, and when, does not
// change. Without references into tag it returns at once.
func (c *Coalescer) Release(tag int) {
	if !c.Pinned(tag) {
		return
	}
	for i := c.oldest; i >= 0 && c.pins[tag] > 0; {
		a := &c.aggs[i]
		next := a.next
		for _, t := range a.tags {
			if t == int32(tag) {
				c.materialize(a)
				break
			}
		}
		i = next
	}
}

// materialize copies a's referenced payloads into its own buffer after the flat part,
// in order, and lets go of the references. A lone head is copied with its link-layer
// padding, which it is emitted with.
func (c *Coalescer) materialize(a *agg) {
	if len(a.refs) == 0 {
		return
	}
	vl := c.cfg.VnetHdrLen
	n := 0
	if a.head != nil {
		n = copy(a.buf[vl+a.payOff:], a.head[vl+a.payOff:])
		a.head = nil
	} else {
		off := vl + a.payOff + a.flat
		for _, r := range a.refs {
			off += copy(a.buf[off:], r)
			n += len(r)
		}
	}
	a.flat = a.end - a.payOff
	c.stats.HeldCopies.Add(uint64(n))
	c.unpin(a)
}

// unpin drops a's references.
func (c *Coalescer) unpin(a *agg) {
	for _, t := range a.tags {
		c.pins[t]--
	}
	clear(a.refs) // do not keep the caller's buffers reachable from here
	a.refs, a.tags = a.refs[:0], a.tags[:0]
	a.head = nil
}

// add is Add (tag < 0: copy) and AddRef.
func (c *Coalescer) add(buf []byte, in *vnethdr.Hdr, now int64, tag int32) {
	c.stats.Segments.Add(1)
	vl := c.cfg.VnetHdrLen
	if len(buf) < vl {
		// No room for a header, so no frame either: there is nothing to deliver.
		c.note(ReasonMalformed, len(buf))
		return
	}
	frame := buf[vl:]
	p := &c.p
	var r Reason
	switch {
	case in != nil && in.IsGSO():
		c.parse(frame, p) // for the flow key only
		r = ReasonGSOInput
	case c.off:
		p.keyed = false
		r = ReasonDisabled
	default:
		r = c.parse(frame, p)
	}
	if c.sp.on && !c.off && (p.need > c.sp.valid || r == ReasonStarted && p.payOff > c.sp.valid) {
		// AddSplit: the decision read past the private prefix. Gather the frame and
		// decide again, on bytes the peer can no longer change.
		c.flatten(frame, nil)
		if in != nil && in.IsGSO() {
			c.parse(frame, p)
		} else {
			r = c.parse(frame, p)
		}
	}
	if r != ReasonStarted {
		c.bypass(buf, in, r)
		return
	}

	if i := c.lookup(p); i >= 0 {
		a := &c.aggs[i]
		if r = c.mergeCheck(a, p, frame); r == ReasonMerged {
			c.merge(i, buf, in, tag)
			return
		}
		c.emitAgg(i)
		c.note(r, len(frame))
	}
	c.startAgg(buf, in, now, tag)
}

// bypass passes an ineligible frame through, after flushing its flow.
func (c *Coalescer) bypass(buf []byte, in *vnethdr.Hdr, r Reason) {
	c.note(c.flushFlow(r), len(buf)-c.cfg.VnetHdrLen)
	c.pass(buf, in)
}

// flushFlow emits the aggregate held for the flow of the frame in c.p (if any) before
// that frame passes through, and returns r refined to DupAck when it can tell.
func (c *Coalescer) flushFlow(r Reason) Reason {
	p := &c.p
	if p.keyed {
		if i := c.lookup(p); i >= 0 {
			a := &c.aggs[i]
			if r == ReasonPureAck && !a.udp && p.ack == a.ack && p.win == a.win {
				r = ReasonDupAck
			}
			c.emitAgg(i)
		}
	}
	return r
}

// pass emits buf unchanged behind a fresh header: the arrival header for GSO and
// NEEDS_CSUM frames (the kernel must still complete them), zero otherwise (never a stale
// header: tailscale/tailscale#19820).
func (c *Coalescer) pass(buf []byte, in *vnethdr.Hdr) {
	vl := c.cfg.VnetHdrLen
	if len(buf) < vl {
		return
	}
	c.flatten(buf[vl:], nil) // AddSplit: nothing of rest was read on the way here
	if in != nil && (in.IsGSO() || in.Flags&vnethdr.FlagNeedsCsum != 0) {
		h := *in
		h.NumBuffers = 0
		_ = h.Encode(buf, vl)
	} else {
		vnethdr.Zero(buf, vl)
	}
	c.out(buf, 1)
}

// trusted reports whether the arrival header vouches for the L4 checksum.
func trusted(in *vnethdr.Hdr) bool {
	return in != nil && in.Flags&(vnethdr.FlagNeedsCsum|vnethdr.FlagDataValid) != 0
}

// lookup returns the index of p's flow's aggregate, or -1.
func (c *Coalescer) lookup(p *pkt) int32 {
	if c.held == 0 || !p.keyed {
		return -1
	}
	h := c.hashOf(p)
	for i := c.buckets[h&c.mask]; i >= 0; i = c.aggs[i].hnext {
		if a := &c.aggs[i]; a.hash == h && a.key == p.key {
			return i
		}
	}
	return -1
}

// mergeCheck returns ReasonMerged if p may join a, or why a must be flushed first. It
// changes nothing except p.idMode. The order follows Linux: IP layer (ipv6_gro_receive,
// inet_gro_receive), then tcp_gro_receive.
func (c *Coalescer) mergeCheck(a *agg, p *pkt, frame []byte) Reason {
	p.idMode = idUnknown
	vl := c.cfg.VnetHdrLen
	if p.v6 && (p.l4Off != a.l4Off || frame[p.l2+6] != a.buf[vl+a.l2+6] ||
		!bytes.Equal(frame[p.l2+ipv6HdrLen:p.l4Off], a.buf[vl+a.l2+ipv6HdrLen:vl+a.l4Off])) {
		// Linux ipv6_gro_receive compares the first next header and memcmp()s the
		// extension headers: a different chain is another flow there. Here the flow key
		// has no room for the chain, and one aggregate per 5-tuple keeps the
		// no-overtaking guarantee, so a different chain flushes instead.
		return ReasonExtHeader
	}
	if p.flags&tcpCWR != 0 && !p.udp {
		return ReasonCWR // CWR never joins an aggregate (it may start one)
	}
	if p.ipSig != a.ipSig {
		return ReasonTosTTLChanged
	}
	if !p.v6 {
		switch a.idMode {
		case idUnknown:
			switch {
			case p.id == a.lastID+1:
				p.idMode = idIncr
			case p.id == a.lastID:
				// Linux 6.18 merges a fixed ID with DF clear too (its GRO selftest:
				// "DF=0, Fixed - should coalesce").
				p.idMode = idFixed
			default:
				return ReasonIPIDChanged
			}
		case idIncr:
			if p.id != a.lastID+1 {
				return ReasonIPIDChanged
			}
			p.idMode = idIncr
		case idFixed:
			if p.id != a.lastID {
				return ReasonIPIDChanged
			}
			p.idMode = idFixed
		}
	}
	if !p.udp {
		if p.flags&^(tcpPSH|tcpFIN|tcpCWR) != a.flags {
			return ReasonFlagsChanged
		}
		if p.ack != a.ack {
			return ReasonAckChanged
		}
		if p.payOff-p.l4Off != a.payOff-a.l4Off ||
			!bytes.Equal(frame[p.l4Off+tcpHdrLen:p.payOff], a.buf[vl+a.l4Off+tcpHdrLen:vl+a.payOff]) {
			return ReasonOptionsChanged
		}
		if p.seq != a.nextSeq {
			return ReasonOutOfOrder
		}
	}
	if p.payload > a.gsoSize {
		return ReasonLargerSegment
	}
	if a.end-a.l2+p.payload > maxIPLen {
		// This segment starts the next packet (skb_gro_receive returns -E2BIG).
		return ReasonOverSize
	}
	return ReasonMerged
}
