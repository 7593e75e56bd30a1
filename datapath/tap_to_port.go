package datapath

import (
	"errors"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/vnethdr"
)

// TAP→port, reading and staging: the loop reads a batch from the TAP (straight into
// free slots of the port's shared-memory ring when it has one), decides each frame on
// its own vnet header — passed whole, split (tap_to_port_split.go), or its partial
// checksum completed — and stages it in the receive pool without copying its payload.
// Delivery to the port is tap_to_port_flush.go.

// runTapToPort reads the TAP until it is closed. It returns nil on Close.
func (b *bridge) runTapToPort() error { return newTapToPort(b).run() }

// run is the TAP→port loop: read a batch, stage and flush it, free its buffers.
func (p *tapToPort) run() error {
	for {
		n, err := p.b.tap.ReadBatch(p.prepare(), p.sizes, 0)
		if n > 0 {
			p.process(n)
		}
		p.released()
		p.slotsDone()
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			return err
		}
	}
}

// tapToPort is the state of the TAP→port pipeline. Every frame for the port is staged
// in the receive pool (rxpool) without copying its payload (package doc, "TAP→port
// without a payload copy"): plain frames as views of the read buffer behind the port's
// header, GSO frames as per-segment headers built in the pool's header slots followed by
// payload slices of the read buffer. The pool is flushed at the end of each TAP read
// batch, or earlier when it is full; when the port is full the flush waits for it in the
// netpoller, so this goroutine stops reading the TAP until the peer catches up, and the
// read buffers are free again only once the flush has returned with the pool empty.
type tapToPort struct {
	b     *bridge
	bufs  [][]byte // the pipeline's own read buffers
	sizes []int

	// With a shared-memory port (port.ShmSender) the TAP is read straight into free
	// slots of the port's ring: rd is this batch's read buffers, slots first, then bufs;
	// frame i < nShm is in slot i that shmRef's TxSlots handed out.
	cur    [][]byte // what the current batch was read into: bufs or rd
	rd     [][]byte
	slots  [][]byte
	shmRef *portRef
	nShm   int

	pool    *rxpool.Pool
	ref     *portRef         // the port of the batch being processed
	out     rxpool.Sender    // ref's BatchSender, or a blocking adapter
	hl      int              // ref's vnet header length (0: plain frames)
	accepts vnethdr.Offloads // ref's Accepts: what passes whole

	segs     [][]byte // scratch for SplitHeaders: header slots, after the port's header (Split: pool buffers)
	segBufs  [][]byte // the same reservations, header included
	segSizes []int
	payloads [][]byte // scratch for SplitHeaders: the segments' payloads in the read buffer
	hdr      vnethdr.Hdr
	outHdr   vnethdr.Hdr // the header written for the port

	capOut capSender  // out wrapped for --pcap-port, used while that capture is on
	flat   flatSender // out for a port that takes only contiguous frames

	// onRelease, if set (tests), is called with the read buffers when they are free
	// again, before the next TAP read: a test poisons them there to show that no byte
	// still queued lives in them.
	onRelease func(bufs [][]byte)
}

func newTapToPort(b *bridge) *tapToPort {
	pool, err := rxpool.New(b.cfg.rx, &b.rxStats)
	if err != nil {
		// parseFlags validated the same Config; only a programming error gets here.
		panic(err)
	}
	p := &tapToPort{
		b:        b,
		bufs:     make([][]byte, b.cfg.batch),
		sizes:    make([]int, b.cfg.batch),
		rd:       make([][]byte, b.cfg.batch),
		slots:    make([][]byte, b.cfg.batch),
		pool:     pool,
		segs:     make([][]byte, vnethdr.MaxSegments), // vnethdr.Plan admits no more
		segBufs:  make([][]byte, vnethdr.MaxSegments),
		segSizes: make([]int, vnethdr.MaxSegments),
		payloads: make([][]byte, vnethdr.MaxSegments),
	}
	b.rxBuffers.Store(int64(pool.Buffers()))
	for i := range p.bufs {
		p.bufs[i] = make([]byte, b.frameCap())
	}
	p.cur = p.bufs
	return p
}

// prepare returns the buffers for the next TAP read: free ring slots first when the port
// has a shared-memory ring, so large frames need no copy on their way to the peer.
func (p *tapToPort) prepare() [][]byte {
	p.cur = p.bufs
	ref := p.b.port.Load()
	if ref == nil || ref.shm == nil {
		return p.cur
	}
	k := ref.shm.TxSlots(p.slots, p.b.cfg.vnetHdrLen)
	if k == 0 {
		return p.cur
	}
	p.shmRef, p.nShm = ref, k
	copy(p.rd, p.slots[:k])
	copy(p.rd[k:], p.bufs[k:])
	p.cur = p.rd
	return p.cur
}

// slotsDone ends the batch's use of ring slots; the ring may be unmapped from here on
// if its port has been closed.
func (p *tapToPort) slotsDone() {
	if p.nShm > 0 {
		p.shmRef.shm.TxDone()
		p.shmRef, p.nShm = nil, 0
		clear(p.rd)
	}
}

func (p *tapToPort) process(n int) {
	b := p.b
	st := &b.t2p
	st.Batches.Add(1)
	st.Reads.Add(uint64(n))
	hl := b.cfg.vnetHdrLen
	if w := b.capture.tap.Writer(); w != nil {
		capTapFrames(w, p.cur, p.sizes, n, hl)
	}
	ref := b.port.Load()
	if ref == nil {
		st.Drops[DropNoPeer].Add(uint64(n))
		return
	}
	p.setPort(ref)
	for i := 0; i < n; i++ {
		if p.ref == nil {
			// The port failed mid-batch: the rest of the batch has nowhere to go.
			st.Drops[DropPortError].Add(uint64(n - i))
			return
		}
		pkt := p.cur[i][:p.sizes[i]]
		if err := p.hdr.Decode(pkt, hl); err != nil {
			st.Drops[DropMalformed].Add(1)
			continue
		}
		frame := pkt[hl:]
		// Per frame, not per negotiation: frames read under an older TUNSETOFFLOAD
		// setting are handled right too. A plain port accepts nothing, so only plain
		// frames pass it as they are.
		switch {
		case p.accepts.AcceptsFrame(&p.hdr):
			if p.hdr.IsGSO() {
				st.GSOPassthrough.Add(1)
			}
			if i < p.nShm && p.ref == p.shmRef && len(frame) >= p.shmRef.shmMin {
				p.stageShm(len(frame), i)
			} else {
				p.stage(frame)
			}
		case p.hdr.IsGSO():
			p.split(frame)
		default: // a partial checksum the port cannot take
			if vnethdr.CompleteChecksum(frame, &p.hdr) != nil {
				st.Drops[DropMalformed].Add(1)
				continue
			}
			st.CsumCompleted.Add(1)
			p.hdr.Flags &^= vnethdr.FlagNeedsCsum
			p.stage(frame)
		}
	}
	if p.ref != nil {
		p.flush(rxpool.ReasonBatchEnd)
	}
}

// setPort points the pipeline at ref's port, through its non-blocking interface when it
// has one.
func (p *tapToPort) setPort(ref *portRef) {
	if p.ref == ref {
		return
	}
	p.ref = ref
	p.hl, p.accepts = ref.hdrLen, ref.accepts
	switch s := ref.p.(type) {
	case port.VecSender:
		p.out = s
	case port.BatchSender:
		p.flat.inner = s
		p.out = &p.flat
	default:
		p.flat.inner = blockingSender{ref.p}
		p.out = &p.flat
	}
}

// stage stages one frame as it lies in the TAP read buffer, without copying it: a
// vector whose header slot holds the port's vnet header (built from p.hdr; nothing for
// a plain port) and whose body is the frame. The read buffer is not reused before the
// pool has sent it (process flushes before it returns; released checks).
func (p *tapToPort) stage(frame []byte) {
	head, ok := p.reserveVec(p.hl, len(frame))
	if !ok {
		return
	}
	if p.hl > 0 {
		p.portHeader(len(frame))
		_ = p.outHdr.Encode(head, p.hl) // cannot fail: head holds hl bytes
	}
	p.pool.CommitVec(frame)
	if p.pool.PerFrame() {
		p.flush(rxpool.ReasonFrame)
	}
}

// stageShm stages, instead of the frame of n bytes read into the batch's ring slot i,
// the descriptor record that names it (ShmSender.PutShmDesc): the frame itself is not
// copied. Frames shorter than the port's ShmMinFrame are staged inline instead.
func (p *tapToPort) stageShm(n int, i int) {
	head, ok := p.reserveVec(p.hl+p.shmRef.shmDesc, 0)
	if !ok {
		return
	}
	p.portHeader(n)
	_ = p.outHdr.Encode(head, p.hl)
	p.shmRef.shm.PutShmDesc(head[p.hl:], i, n)
	p.pool.CommitVec(nil)
	if p.pool.PerFrame() {
		p.flush(rxpool.ReasonFrame)
	}
}

// reserveVec reserves a vector of a headLen-byte header slot and a bodyLen-byte body in
// the pool, flushing it first when full. On false the frame has been counted as
// dropped.
func (p *tapToPort) reserveVec(headLen, bodyLen int) ([]byte, bool) {
	head, ok := p.pool.ReserveVec(headLen, bodyLen)
	if ok {
		return head, true
	}
	if !p.pool.Fits(headLen+bodyLen, 1) {
		p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
		return nil, false
	}
	if !p.flush(rxpool.ReasonPoolFull) {
		p.b.t2p.Drops[DropPortError].Add(1)
		return nil, false
	}
	if head, ok = p.pool.ReserveVec(headLen, bodyLen); !ok {
		p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
		return nil, false
	}
	return head, true
}

// released is where the batch's read buffers become free for the next TAP read (and
// its shared-memory slots go back to the ring, slotsDone). Every frame staged from them
// was sent, or discarded with a failed port, by the flush at the end of process, which
// returns only with the pool empty: while the port is full it waits inside Flush, and
// the TAP is not read meanwhile. So nothing can still point into them; if something
// did, it is dropped rather than sent with the next read's bytes in it.
func (p *tapToPort) released() {
	if p.pool.Borrowing() {
		staged, _ := p.pool.Queued()
		p.b.t2p.Drops[DropPortError].Add(uint64(staged))
		p.pool.Discard(rxpool.DropPortError)
	}
	if p.onRelease != nil {
		p.onRelease(p.cur)
	}
}
