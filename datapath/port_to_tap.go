package datapath

import (
	"errors"
	"os"
	"time"

	"tapgro/alarm"
	"tapgro/coalescer"
	"tapgro/pcapio"
	"tapgro/port"
	"tapgro/vnethdr"
)

// Port→TAP, reading and coalescing: one goroutine per connection reads batches from
// the port (frames lent in place, into a ring of buffers the GRO engine may reference,
// or into plain buffers) and feeds them to the GRO engine (package coalescer), set up
// here from what the TAP accepts. What the engine emits is written by tap_writer.go.

// coalescerConfig derives the GRO engine's settings from what the TAP accepts.
func (b *bridge) coalescerConfig() coalescer.Config {
	gro := b.groOn.Load() && !b.groKilled.Load()
	acc := b.tapWrite()
	return coalescer.Config{
		MaxFlows:    b.cfg.maxFlows,
		MaxSegments: coalescer.DefaultMaxSegments, // Linux caps by bytes (65535), not segments
		VnetHdrLen:  b.cfg.vnetHdrLen,
		DisableTCP:  !gro,
		UDP:         gro && b.udpGROOn.Load() && acc&vnethdr.OffloadUSO == vnethdr.OffloadUSO,
		ECN:         acc&vnethdr.OffloadTSOECN != 0,
		Trace:       b.cfg.trace,

		// The plain port's read buffers (portToTap.bufs) are the engine's tags, and an
		// aggregate leaves in at most DefaultMaxRefs+1 iovecs, well within tapdev.MaxIov.
		RefTags:       b.refRing(),
		MaxRefs:       coalescer.DefaultMaxRefs,
		RefMinPayload: b.groRefMin,
	}
}

// groRefMinPayload is the segment size from which the GRO engine references a plain
// port's payloads instead of copying them (coalescer.Config.RefMinPayload). A gathered
// TAP write costs the kernel per iovec: drivers/net/tun.c tun_get_user copies the frame
// with skb_copy_datagram_from_iter, which goes through lib/iov_iter.c _copy_from_iter
// one iovec at a time (a user-copy setup per piece). Measured on the development
// machine (Linux 6.18, AMD EPYC, 2 cores; BenchmarkTapWritev, BenchmarkPortToTapRealTap):
// a 64 KB GSO write gathered from 46 pieces took ~6.0-6.4 µs against ~4.0-4.4 µs from
// one buffer (two pieces, header and payload: ~4.5 µs). That is more than GRO's copy of
// the 45 cache-hot 1448-byte payloads it saves: the whole pipeline into a real TAP ran
// at ~340 ns per MTU segment copying and ~390 by reference. From 4344-byte segments (15
// pieces) the two are even, and 8948-byte jumbo segments (7 pieces) are even to ~10 %
// ahead by reference. So MTU-sized segments are copied, larger ones referenced.
const groRefMinPayload = 4096

// coalescerFor returns the bridge's single GRO engine, creating it on first use. It is
// kept across connections so its memory is allocated once and its counters keep counting.
func (b *bridge) coalescerFor() *coalescer.Coalescer {
	b.coalMu.Lock()
	defer b.coalMu.Unlock()
	if b.coal == nil {
		w := &tapWriter{b: b}
		w.vec, _ = b.tap.(vectorTap)
		b.coalWriter = w
		b.coal = coalescer.New(b.coalescerConfig(), w.write)
		b.coal.SetEmitV(w.writev)
	} else {
		b.coal.SetConfig(b.coalescerConfig())
	}
	return b.coal
}

// portToTap is one connection's port→TAP pipeline. Its read buffers put the Ethernet
// frame at offset head = max(TAP header, port header): the port's own header (if any)
// lands just before it, and the TAP's header is written in place over the same headroom
// when the GRO engine passes a frame through, so nothing is copied.
//
// For a plain port (no vnet header) the read buffers are a ring of refRing() buffers,
// and the GRO engine merges segments of groRefMinPayload bytes or more by reference
// (coalescer.AddRef, tag = the buffer's index in bufs) instead of copying their
// payloads: an aggregate pins the buffers it points into. Each read takes the next batch buffers of the ring, oldest first, and
// releases each from the engine before the port may fill it (claim): an aggregate that
// still points into one copies its payloads into its own buffer then (copy on hold) and
// stays held. So a buffer is never overwritten while anything refers to it, memory
// stays fixed, and what the engine emits, and when, is what it would emit copying.
type portToTap struct {
	b     *bridge
	bufs  [][]byte // the read buffers: batch of them, or the ring for a plain port
	views [][]byte // bufs[k][head-phl:] for the buffers of the batch, what Port.ReadBatch fills
	sizes []int
	phl   int // the port's vnet header length
	head  int // where the Ethernet frame starts in bufs[i]
	hdr   vnethdr.Hdr

	// ring: bufs is a ring handed out batch buffers at a time from next on; tags[i] is
	// the index in bufs of frame i of the batch (its tag for the GRO engine).
	ring bool
	next int
	tags []int

	// A port that lends frames in place (port.Lender: from its peer's shared-memory
	// ring, or its own read buffer): lent[i] is set for such a frame, and cur[i] is the
	// buffer frame i of the batch is in, laid out like bufs[i] (frame at head), whichever
	// it came in.
	lender port.Lender
	lent   [][]byte
	cur    [][]byte
}

// refRingBatches is how many read batches of buffers a plain port's ring holds: one
// more than a read needs lets an aggregate still held after a read (batch flush while
// the port has more buffered, timer flush) go on referring to the previous batch's
// buffers; only one outliving a whole further batch of reads is copied. It costs a
// batch of buffers more per connection (64 × 69.6 KB ≈ 4.5 MB at the defaults), used
// only by aggregates of segments from groRefMinPayload on.
const refRingBatches = 2

// refRing is the number of read buffers in a plain port's ring, the GRO engine's tags.
func (b *bridge) refRing() int { return refRingBatches * b.cfg.batch }

// newPortToTap builds the pipeline for a port with phl-byte vnet headers that lends
// frames (l non-nil) or not. A plain port that does not lend reads into the ring.
func newPortToTap(b *bridge, phl int, l port.Lender) *portToTap {
	head := max(b.cfg.vnetHdrLen, phl)
	ring := phl == 0 && l == nil
	nb := b.cfg.batch
	if ring {
		nb = b.refRing()
	}
	p := &portToTap{
		b:      b,
		bufs:   make([][]byte, nb),
		views:  make([][]byte, b.cfg.batch),
		sizes:  make([]int, b.cfg.batch),
		phl:    phl,
		head:   head,
		ring:   ring,
		lender: l,
	}
	for i := range p.bufs {
		p.bufs[i] = make([]byte, head+port.MaxFrame)
	}
	p.cur = p.bufs
	switch {
	case p.ring:
		p.cur = make([][]byte, b.cfg.batch)
		p.tags = make([]int, b.cfg.batch)
	case l != nil:
		p.lent = make([][]byte, len(p.bufs))
		p.cur = make([][]byte, len(p.bufs))
	}
	for i := range p.views {
		p.views[i] = p.bufs[i][head-phl:]
		p.cur[i] = p.bufs[i]
	}
	return p
}

// claim hands the next batch buffers of the ring to the read, each released from the
// GRO engine first (coalescer.Release: an aggregate still referring to it copies what
// it references, so the port may overwrite the buffer).
func (p *portToTap) claim(coal *coalescer.Coalescer) {
	k := p.next
	for j := range p.views {
		if coal.Pinned(k) {
			coal.Release(k)
		}
		p.views[j] = p.bufs[k][p.head:]
		p.cur[j] = p.bufs[k]
		p.tags[j] = k
		if k++; k == len(p.bufs) {
			k = 0
		}
	}
}

// consumed moves the ring past the n buffers the last read filled: the oldest buffer
// is then the first one the read did not fill.
func (p *portToTap) consumed(n int) {
	if p.ring {
		p.next = (p.next + n) % len(p.bufs)
	}
}

// runPortToTap moves frames from one connected port to the TAP until the port fails or
// is closed; it returns that error.
func (b *bridge) runPortToTap(pt port.Port) error {
	l, _ := pt.(port.Lender)
	if l != nil && max(b.cfg.vnetHdrLen, pt.VnetHdrLen()) > port.ShmHeadroom {
		l = nil // no room for the TAP's header in front of a lent frame
	}
	p := newPortToTap(b, pt.VnetHdrLen(), l)
	if l != nil {
		defer l.ReleaseLent()
	}
	return p.run(pt)
}

// read is one ReadBatch, into the ring's next buffers for a plain port, lending frames
// in place when the port can.
func (p *portToTap) read(pt port.Port, coal *coalescer.Coalescer) (int, error) {
	if p.lender == nil {
		if p.ring {
			p.claim(coal)
		}
		n, err := pt.ReadBatch(p.views, p.sizes)
		p.consumed(n)
		return n, err
	}
	n, err := p.lender.ReadBatchLent(p.views, p.sizes, p.lent)
	for i := 0; i < n; i++ {
		if l := p.lent[i]; l != nil {
			// The slot has ShmHeadroom bytes before the frame: room for the TAP header.
			p.cur[i] = l[port.ShmHeadroom-p.head:]
		} else {
			p.cur[i] = p.bufs[i]
		}
	}
	return n, err
}

// done hands lent frames back once the batch has been processed: the GRO engine copies
// what it holds of them (they go in through Add, not AddRef), so nothing refers to them
// any more.
func (p *portToTap) done() {
	if p.lender != nil {
		p.lender.ReleaseLent()
	}
}

func (p *portToTap) run(pt port.Port) error {
	b := p.b
	hl := b.cfg.vnetHdrLen
	bufs, sizes := p.cur, p.sizes
	coal := b.coalescerFor()
	b.coalWriter.hdrPort = p.phl > 0
	st := &b.p2t
	killed := b.groKilled.Load()
	gen := b.reconf.Load()
	interval := b.cfg.rscInterval.Nanoseconds()
	armed := false // a read deadline is set for the timer flush
	var wake *alarm.Alarm
	if b.cfg.timerFlush {
		// The deadline alone would fire up to a millisecond late on an idle process
		// (package alarm); without an alarm (no descriptor left) it still fires.
		var err error
		if wake, err = alarm.New(); err != nil && b.onNoAlarm != nil {
			b.onNoAlarm(err)
		}
		defer wake.Close()
	}
	for {
		n, err := p.read(pt, coal)
		now := time.Now().UnixNano()
		if n > 0 {
			st.Batches.Add(1)
			st.Reads.Add(uint64(n))
			if w := b.capture.port.Writer(); w != nil {
				p.capture(w, n)
			}
			// Runtime switches (SetGRO, SetUDPGRO) apply from this batch on.
			p.refresh(coal, &killed, &gen)
			if p.ring {
				// By reference: bufs[i] is ring buffer tags[i], pinned by whatever
				// aggregate takes its payload until claim releases it or the aggregate
				// is written.
				for i := 0; i < n; i++ {
					coal.AddRef(bufs[i][:hl+sizes[i]], nil, now, p.tags[i])
				}
			} else if p.phl == 0 {
				// Lent in place (a QEMU-framed stream): the engine copies what it
				// keeps, in order, each frame's headroom written only after the
				// frame before it is done with (port.Lender).
				for i := 0; i < n; i++ {
					coal.Add(bufs[i][:hl+sizes[i]], nil, now)
				}
			} else {
				p.addWithHeaders(coal, n, now)
			}
			p.done()
			// A read batch is what one read from the peer delivered, not what fits in
			// our buffers: flush only once nothing more is buffered (gVisor's policy; a
			// flush per ReadBatch would cut aggregates at our buffer count).
			if !b.cfg.timerFlush && !pt.Pending() {
				coal.Flush()
			}
			// A kernel that refused a GSO write during this batch.
			p.refresh(coal, &killed, &gen)
		}
		if b.cfg.timerFlush {
			// Timer mode (QEMU RSC's rsc_interval): hold aggregates across reads, and let
			// the read deadline be the timer, armed only while something is held; the
			// alarm wakes an idle runtime for it, which would otherwise sleep a whole
			// millisecond past a 50 µs deadline (package alarm).
			coal.FlushExpired(now, interval)
			if oldest, ok := coal.Oldest(); ok {
				at := time.Unix(0, oldest+interval)
				pt.SetReadDeadline(at)
				wake.Set(at)
				armed = true
			} else if armed {
				pt.SetReadDeadline(time.Time{})
				armed = false
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				continue
			}
			coal.Flush()
			return err
		}
	}
}

// capture records the n frames just read from the port, before the GRO engine sees
// them (it rewrites headers in place when it merges).
func (p *portToTap) capture(w *pcapio.Writer, n int) {
	now := time.Now()
	for i := 0; i < n; i++ {
		if p.sizes[i] > p.phl {
			w.WriteFrame(now, p.cur[i][p.head:p.head-p.phl+p.sizes[i]])
		}
	}
}

// refresh applies new engine settings between batches when a kernel refused GSO or a
// runtime switch changed; SetConfig flushes what the engine holds first, so nothing is
// lost or reordered.
func (p *portToTap) refresh(coal *coalescer.Coalescer, killed *bool, gen *uint32) {
	b := p.b
	if k, g := b.groKilled.Load(), b.reconf.Load(); k != *killed || g != *gen {
		*killed, *gen = k, g
		coal.SetConfig(b.coalescerConfig())
	}
}
