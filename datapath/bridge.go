package datapath

import (
	"errors"
	"math"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/alarm"
	"tapgro/coalescer"
	"tapgro/pcapio"
	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/sockport"
	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// The bridge is the datapath: two pipelines, each one goroutine that owns its buffers, so
// nothing on the packet path takes a lock.
//
//	TAP ──ReadBatch──► decode vnet hdr ──► segment / complete csum ──► rxpool ──► Port
//	TAP ◄──Write────── coalescer (GRO) ◄── Port.ReadBatch
//
// The TAP→port goroutine lives as long as the TAP: while no peer is connected it keeps
// reading and discards (counted), as QEMU itself discards while its link is down
// (QEMU net/net.c qemu_deliver_packet_iov returns the size unsent for a link-down peer). The port→TAP goroutine lives as long as one connection.
//
// Towards another tapgro on the same host (vnet-hdr=on over UNIX, sockport/shm.go) the
// TAP is read straight into the port's shared ring slots and only a descriptor is
// staged for a large frame; on the far side the frame is written to the TAP from the
// slot it arrived in, so neither pipeline copies it.

// dirStats counts one direction. Drops are split by reason so an operator can tell a
// missing peer from a malformed frame from a kernel refusal.
type dirStats struct {
	Frames  atomic.Uint64 // frames delivered to the far side
	Bytes   atomic.Uint64
	Batches atomic.Uint64 // read batches processed
	Reads   atomic.Uint64 // frames read from the near side

	DropNoPeer    atomic.Uint64 // TAP→port: nobody connected
	DropMalformed atomic.Uint64 // bad vnet header or headers that cannot be segmented
	DropPortError atomic.Uint64 // TAP→port: the port failed mid-batch
	DropTapEIO    atomic.Uint64 // port→TAP: TAP link is down
	DropTapError  atomic.Uint64 // port→TAP: other write errors
	GSOFallback   atomic.Uint64 // port→TAP: GSO writes refused with EINVAL and re-sent segmented
	GSOSegmented  atomic.Uint64 // GSO frames split in software (TAP→port: for the port; port→TAP: kinds the TAP refuses)
	// GSOPassthrough counts GSO frames handed on whole: TAP→port to a port that accepts
	// them (vnet-hdr), port→TAP from a vnet-hdr port to the TAP.
	GSOPassthrough atomic.Uint64
	CsumCompleted  atomic.Uint64 // TAP→port: NEEDS_CSUM completed in software
}

type bridgeConfig struct {
	vnetHdrLen  int
	batch       int
	gro         bool
	udpGRO      bool
	timerFlush  bool
	rscInterval time.Duration
	maxFlows    int
	tapAccepts  vnethdr.Offloads // what the TAP accepts on write (tapdev Device.Accepts)
	tapEmits    vnethdr.Offloads // what TUNSETOFFLOAD allowed the TAP to hand us
	trace       func(r coalescer.Reason, frameLen int)
	rx          rxpool.Config // the TAP→port receive pool (--rx-* flags)
}

// tapIO is what the pipelines need of the TAP; *tapdev.Device implements it, and tests
// substitute an in-memory device so the pipelines run without privileges.
type tapIO interface {
	ReadBatch(bufs [][]byte, sizes []int, offset int) (int, error)
	Write(pkt []byte) (int, error)
	LinkInfo() (net.HardwareAddr, []netip.Prefix, error)
	Stats() *tapdev.Stats
}

var _ tapIO = (*tapdev.Device)(nil)

// vectorTap is a TAP that takes one frame gathered from several buffers in one
// writev(2) (tapdev.Device.Writev). The GRO engine's aggregates go out that way, their
// payloads straight from the port's read buffers; a TAP without it gets them copied
// together first.
type vectorTap interface {
	Writev(iov [][]byte) (int, error)
}

var _ vectorTap = (*tapdev.Device)(nil)

type bridge struct {
	cfg bridgeConfig
	tap tapIO

	port atomic.Pointer[portRef] // current peer, nil while disconnected

	t2p dirStats
	p2t dirStats

	rxStats   rxpool.Stats // the TAP→port receive pool's counters
	rxBuffers atomic.Int64 // its size in buffers, once the pipeline has started

	// groKilled is set (once, never cleared) when the kernel refused a TCP GSO write and
	// tapgro's own probe frame of that kind too (tapWriter.refusedGSO), or the start-up
	// probe: from then on frames go to the TAP one segment at a time, so the stream
	// survives a kernel that rejects valid GSO frames.
	groKilled atomic.Bool
	onGROKill func(error) // called once, from the port→TAP goroutine

	// tapKilled are the offloads (TSO4, TSO6, TSO_ECN, USO) whose GSO writes the kernel
	// refused with EINVAL although the frame was valid, and refused a probe frame of the
	// same kind as well (tapWriter.refusedGSO): from then on frames of that kind are split
	// before the write (sticky, like groKilled). onOffloadKill is called once per
	// offload, from the port→TAP goroutine.
	tapKilled     atomic.Uint32
	onOffloadKill func(vnethdr.Offloads, error)

	// onNoAlarm is called, from a port→TAP goroutine, when the timer flush could not
	// get its alarm (package alarm) for a connection.
	onNoAlarm func(error)

	// Runtime switches (offload_control.go): read by the port→TAP goroutine at batch boundaries
	// whenever reconf changed.
	groOn    atomic.Bool
	udpGROOn atomic.Bool
	reconf   atomic.Uint32

	// neg is the last negotiation (negotiate.go), for metrics and `tapgro ctl status`;
	// negMu serialises renegotiation and guards negIn.
	neg   atomic.Pointer[Negotiation]
	negMu sync.Mutex
	negIn negInput
	// onNegotiated, if set, is called (under negMu) with every new negotiation.
	onNegotiated func(*Negotiation)

	// capture (capture.go): frames crossing each side, written when a Writer is set.
	capture captures

	// groRefMin is the GRO engine's RefMinPayload (groRefMinPayload; tests lower it).
	groRefMin int

	coalMu     sync.Mutex // guards coal between connections (metrics read it too)
	coal       *coalescer.Coalescer
	coalWriter *tapWriter // coal's output; owned by the live port→TAP goroutine
}

// portRef wraps a Port so the TAP→port goroutine can detect a swap with a pointer compare.
// hdrLen and accepts are read once when the port is adopted (newPortRef).
type portRef struct {
	p       port.Port
	hdrLen  int              // vnet header in front of every frame to and from the port
	accepts vnethdr.Offloads // what the port may be handed whole
	shm     port.ShmSender   // set when large frames may go through a shared-memory ring
}

func newPortRef(p port.Port) *portRef {
	r := &portRef{p: p, hdrLen: p.VnetHdrLen()}
	r.accepts = portAccepts(r.hdrLen, p.Accepts())
	if s, ok := p.(port.ShmSender); ok && s.ShmActive() {
		r.shm = s
	}
	return r
}

func newBridge(cfg bridgeConfig, tap tapIO) *bridge {
	b := &bridge{cfg: cfg, tap: tap, groRefMin: groRefMinPayload}
	b.capture.tap.name, b.capture.port.name = "tap", "port"
	b.groOn.Store(cfg.gro)
	b.udpGROOn.Store(cfg.udpGRO)
	return b
}

// frameCap is the largest frame either side may hand us plus its vnet header: QEMU's
// NET_BUFSIZE covers the worst-case IPv6 GSO frame a TAP read can return, 14 + 4 (VLAN)
// + 40 + 65535 = 65593 bytes (drivers/net/tun.c tun_put_user).
func (b *bridge) frameCap() int { return b.cfg.vnetHdrLen + port.MaxFrame }

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

	// With a shared-memory port (sockport/shm.go) the TAP is read straight into free
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
		st.DropNoPeer.Add(uint64(n))
		return
	}
	p.setPort(ref)
	for i := 0; i < n; i++ {
		if p.ref == nil {
			// The port failed mid-batch: the rest of the batch has nowhere to go.
			st.DropPortError.Add(uint64(n - i))
			return
		}
		pkt := p.cur[i][:p.sizes[i]]
		if err := p.hdr.Decode(pkt, hl); err != nil {
			st.DropMalformed.Add(1)
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
			if i < p.nShm && p.ref == p.shmRef && len(frame) >= sockport.ShmMinFrame {
				p.stageShm(len(frame), i)
			} else {
				p.stage(frame)
			}
		case p.hdr.IsGSO():
			p.split(frame)
		default: // a partial checksum the port cannot take
			if vnethdr.CompleteChecksum(frame, &p.hdr) != nil {
				st.DropMalformed.Add(1)
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
// the descriptor record that names it (sockport/shm.go): the frame itself is not copied.
func (p *tapToPort) stageShm(n int, i int) {
	head, ok := p.reserveVec(p.hl+sockport.ShmDescLen, 0)
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
		p.b.t2p.DropPortError.Add(1)
		return nil, false
	}
	if head, ok = p.pool.ReserveVec(headLen, bodyLen); !ok {
		p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
		return nil, false
	}
	return head, true
}

// split segments one GSO frame without copying its payload: each segment is a vector
// of its headers, built by vnethdr.SplitHeaders in the segment's header slot (behind an
// all-zero vnet header for a vnet-hdr port), and its payload, a slice of the TAP read
// buffer that the L4 checksum was summed over in place. All segments are reserved
// before anything is built (the pool is flushed first when they do not fit), so a frame
// is never half-staged. Headers too long for a slot (rxpool.HeadCap: only IPv6 with
// long extension headers) take the copying path, splitCopy.
func (p *tapToPort) split(frame []byte) {
	st := &p.b.t2p
	pl, err := vnethdr.Plan(frame, &p.hdr)
	if err != nil {
		st.DropMalformed.Add(1)
		return
	}
	segCap, nseg := p.hl+pl.SegCap, pl.Segments
	if !p.pool.Fits(segCap, nseg) {
		p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
		return
	}
	headLen := p.hl + pl.HdrLen
	if headLen > rxpool.HeadCap {
		p.splitCopy(frame, pl)
		return
	}
	mss := pl.SegCap - pl.HdrLen
	if !p.reserveSegs(true, headLen, mss, nseg) {
		return
	}
	n, err := vnethdr.SplitHeaders(frame, &p.hdr, p.segs[:nseg], p.payloads[:nseg])
	p.finishSplit(n, err, func(i int) { p.pool.CommitVec(p.payloads[i]) })
	clear(p.payloads[:n])
}

// finishSplit commits the n segments a split of the reserved ones produced, each behind
// an all-zero header (commit(i) commits segment i), and hands back the rest; err means
// the frame was malformed, and nothing is committed.
func (p *tapToPort) finishSplit(n int, err error, commit func(i int)) {
	if err != nil {
		p.pool.Cancel()
		p.b.t2p.DropMalformed.Add(1)
		return
	}
	p.b.t2p.GSOSegmented.Add(1)
	for i := 0; i < n; i++ {
		// A plain segment behind an all-zero header: a stale GSO header on a segment
		// makes the receiver treat it as a super-frame.
		vnethdr.Zero(p.segBufs[i], p.hl)
		commit(i)
	}
	p.pool.Cancel() // segments the split did not need, if any
	if p.pool.PerFrame() {
		p.flush(rxpool.ReasonFrame)
	}
}

// reserveSegs claims nseg segments for one GSO frame, or none: vectors of headLen
// header bytes and up to bodyMax payload bytes (vec), or pool buffers of headLen bytes.
// When they do not fit now the pool is flushed first; on false the frame has been
// counted as dropped.
func (p *tapToPort) reserveSegs(vec bool, headLen, bodyMax, nseg int) bool {
	if p.tryReserveSegs(vec, headLen, bodyMax, nseg) {
		return true
	}
	if !p.flush(rxpool.ReasonPoolFull) {
		p.b.t2p.DropPortError.Add(1)
		return false
	}
	if !p.tryReserveSegs(vec, headLen, bodyMax, nseg) { // cannot happen: they Fit an empty pool
		p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
		return false
	}
	return true
}

func (p *tapToPort) tryReserveSegs(vec bool, headLen, bodyMax, nseg int) bool {
	for i := 0; i < nseg; i++ {
		var buf []byte
		var ok bool
		if vec {
			buf, ok = p.pool.ReserveVec(headLen, bodyMax)
		} else {
			buf, ok = p.pool.Reserve(headLen)
		}
		if !ok {
			p.pool.Cancel()
			return false
		}
		p.segBufs[i] = buf
		p.segs[i] = buf[p.hl:]
	}
	return true
}

// splitCopy segments one GSO frame (plan pl, which Fits the pool) straight into pool
// buffers with the copying vnethdr.Split: the path for headers longer than a header
// slot.
func (p *tapToPort) splitCopy(frame []byte, pl vnethdr.SplitPlan) {
	segCap, nseg := p.hl+pl.SegCap, pl.Segments
	if !p.reserveSegs(false, segCap, 0, nseg) {
		return
	}
	n, err := vnethdr.Split(frame, &p.hdr, p.segs[:nseg], p.segSizes[:nseg])
	p.finishSplit(n, err, func(i int) { p.pool.Commit(p.hl + p.segSizes[i]) })
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
		p.b.t2p.DropPortError.Add(uint64(staged))
		p.pool.Discard(rxpool.DropPortError)
	}
	if p.onRelease != nil {
		p.onRelease(p.cur)
	}
}

// flush hands everything staged to the port and reports whether the port is still
// usable. A failing port is dropped from the TAP→port side; the frames it could not take
// are counted, not retried, like a NIC whose cable was pulled. When the peer has simply
// gone (EPIPE, ECONNRESET) the port is left open for its port→TAP goroutine, which reads
// what the peer sent before it went, up to the end of the stream, and then ends the
// connection; any other failure closes the port at once.
func (p *tapToPort) flush(why rxpool.Reason) bool {
	st := &p.b.t2p
	staged, _ := p.pool.Queued()
	out := p.out
	if w := p.b.capture.port.Writer(); w != nil {
		p.capOut = capSender{inner: out, w: w, hl: p.hl, shm: p.ref.shm}
		out = &p.capOut
	}
	n, bytes, err := p.pool.Flush(out, why)
	st.Frames.Add(uint64(n))
	st.Bytes.Add(uint64(bytes))
	if err == nil {
		return true
	}
	st.DropPortError.Add(uint64(staged - n))
	p.pool.Discard(rxpool.DropPortError)
	if !errors.Is(err, unix.EPIPE) && !errors.Is(err, unix.ECONNRESET) {
		p.ref.p.Close()
	}
	p.b.port.CompareAndSwap(p.ref, nil)
	p.ref, p.out = nil, nil
	return false
}

// flatSender delivers the pool's Vecs to a port that takes only contiguous frames (a
// netmap port, or a Port without BatchSender): a Vec with header bytes is copied
// together into scratch first — for such a port the copy the pool no longer makes —
// and a Vec that is all body passes as it is. The scratch is allocated on first use.
type flatSender struct {
	inner   port.BatchSender
	frames  [][]byte
	scratch []byte
}

// flatScratch holds at least one largest frame with its vnet header.
const flatScratch = 1 << 20

func (s *flatSender) TryWriteVecs(v []port.Vec) (int, error) {
	if s.frames == nil {
		s.frames = make([][]byte, 512)
		s.scratch = make([]byte, flatScratch)
	}
	k, off := 0, 0
	for k < len(v) && k < len(s.frames) {
		x := &v[k]
		h := x.Head[port.VecHeadroom:]
		if len(h) == 0 {
			s.frames[k] = x.Body
			k++
			continue
		}
		n := x.Len()
		if off+n > len(s.scratch) {
			break
		}
		b := s.scratch[off : off+n : off+n]
		copy(b[copy(b, h):], x.Body)
		s.frames[k] = b
		off += n
		k++
	}
	n, err := s.inner.TryWriteBatch(s.frames[:k])
	clear(s.frames[:k])
	return n, err
}

func (s *flatSender) WaitWritable(d time.Time) error { return s.inner.WaitWritable(d) }
func (s *flatSender) Room() (int, int)               { return s.inner.Room() }

// blockingSender adapts a Port without BatchSender: WriteBatch blocks until everything
// is sent, so it never reports ErrWouldBlock and the pool never waits on it.
type blockingSender struct{ p port.Port }

func (s blockingSender) TryWriteBatch(frames [][]byte) (int, error) { return s.p.WriteBatch(frames) }
func (s blockingSender) WaitWritable(time.Time) error               { return nil }
func (s blockingSender) Room() (int, int)                           { return math.MaxInt, math.MaxInt }

// tapWriter writes the coalescer's output to the TAP. It belongs to the port→TAP
// goroutine of whichever connection is live (one at a time), so it needs no lock.
type tapWriter struct {
	b   *bridge
	hdr vnethdr.Hdr
	vec vectorTap // the TAP's vectored write, nil if it has none

	// flat is where writev copies an aggregate together for the paths that need it in
	// one piece (capture, a refused or unsupported vectored write); allocated on first use.
	flat []byte

	// hdrPort is set while the live connection's port carries vnet headers: its GSO
	// frames reach write() whole and may be of a kind the TAP does not take.
	hdrPort bool

	// fallback buffers are allocated on first use: only a kernel that refuses GSO, or a
	// GSO kind from a vnet-hdr port the TAP does not take, needs them.
	slab          []byte
	fallback      [][]byte
	fallbackViews [][]byte
	fallbackSize  []int

	probe []byte // the probe frame written when the kernel refuses a GSO write
}

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

// tapWrite is what frames written to the TAP may carry: what the kernel accepts on
// write, minus the offloads it has refused since.
func (b *bridge) tapWrite() vnethdr.Offloads {
	return b.cfg.tapAccepts &^ vnethdr.Offloads(b.tapKilled.Load())
}

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

	// A port that lends frames in place (from its peer's shared-memory ring, or its own
	// read buffer; sockport/shm.go): lent[i] is set for such a frame, and cur[i] is the
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

// write is the coalescer's output: one write() per packet, which is the point of GRO.
func (w *tapWriter) write(pkt []byte) {
	st := &w.b.p2t
	if w.hdrPort && w.refused(pkt) {
		// A GSO kind from the port that the TAP does not take (or no longer takes).
		st.GSOSegmented.Add(1)
		w.split(pkt)
		return
	}
	_, err := w.b.tap.Write(pkt)
	if err == nil {
		if c := w.b.capture.tap.Writer(); c != nil {
			c.WriteFrame(time.Now(), pkt[w.b.cfg.vnetHdrLen:])
		}
		st.Frames.Add(1)
		st.Bytes.Add(uint64(len(pkt) - w.b.cfg.vnetHdrLen))
		return
	}
	switch {
	case errors.Is(err, unix.EINVAL) && w.isGSO(pkt):
		w.refusedGSO(pkt, err)
	case errors.Is(err, unix.EIO):
		st.DropTapEIO.Add(1)
	default:
		st.DropTapError.Add(1)
	}
}

// writev is the coalescer's vectored output (coalescer.SetEmitV): an aggregate whose
// payloads are still in the port's read buffers, iov[0] its vnet header and rewritten
// headers, the rest its payloads, written with one writev(2) and so copied only by the
// kernel. The rare paths that need the packet in one piece (capture, a vnet-hdr port's
// GSO kind the TAP does not take, a write refused with EINVAL, a TAP without vectored
// writes) get a flat copy and go through write.
func (w *tapWriter) writev(iov [][]byte) {
	if w.vec == nil || w.hdrPort || w.b.capture.tap.Writer() != nil {
		w.write(w.flatten(iov))
		return
	}
	st := &w.b.p2t
	n, err := w.vec.Writev(iov)
	if err == nil {
		st.Frames.Add(1)
		st.Bytes.Add(uint64(n - w.b.cfg.vnetHdrLen))
		return
	}
	switch {
	case errors.Is(err, tapdev.ErrUnsupported):
		w.vec = nil
		w.write(w.flatten(iov))
	case errors.Is(err, unix.EINVAL) && w.isGSO(iov[0]):
		w.refusedGSO(w.flatten(iov), err)
	case errors.Is(err, unix.EIO):
		st.DropTapEIO.Add(1)
	default:
		st.DropTapError.Add(1)
	}
}

// flatten copies iov together into w.flat.
func (w *tapWriter) flatten(iov [][]byte) []byte {
	if w.flat == nil {
		w.flat = make([]byte, 0, w.b.frameCap())
	}
	f := w.flat[:0]
	for _, b := range iov {
		f = append(f, b...)
	}
	w.flat = f[:0]
	return f
}

func (w *tapWriter) isGSO(pkt []byte) bool {
	return w.hdr.Decode(pkt, w.b.cfg.vnetHdrLen) == nil && w.hdr.IsGSO()
}

// refusedGSO handles a GSO packet the kernel refused with EINVAL (w.hdr holds its
// header, set by isGSO). The packet is re-sent as plain segments. Whether the offload is
// turned off for good — and GRO with it for TCP, since a kernel with a GSO bug rejects
// every valid frame of that kind (Tailscale met one in Linux 6.6.44) — is decided by
// evidence about the kernel, not about the packet:
//
//   - the packet must pass vnethdr.ValidatePeer, the kernel's own write-side rules
//     (drivers/net/tun.c tun_get_user, include/linux/virtio_net.h
//     virtio_net_hdr_to_skb). Everything that gets here was either built by the GRO
//     engine or admitted by that same check in addWithHeaders, so this only re-states
//     the condition; a packet failing it is dropped as malformed and proves nothing;
//   - and a probe frame tapgro builds itself, of the same GSO kind (gso_type with its ECN
//     bit, IP version), must be refused with EINVAL too. If the kernel takes the probe it
//     objected to that one packet, not to the offload: nothing is turned off, so a
//     peer's crafted header can cost at most its own packet. A probe that fails in
//     another way (EIO: the link went down) says nothing either way and kills nothing.
func (w *tapWriter) refusedGSO(pkt []byte, cause error) {
	b := w.b
	st := &b.p2t
	hl := b.cfg.vnetHdrLen
	if vnethdr.ValidatePeer(pkt[hl:], &w.hdr) != nil {
		st.DropMalformed.Add(1)
		return
	}
	st.GSOFallback.Add(1)
	if w.probeRefused(pkt[hl:]) {
		w.kill(offloadOf(&w.hdr), cause)
	}
	w.split(pkt)
}

// probeRefused writes a probe frame of the kind of frame (its header in w.hdr) to the
// TAP and reports whether the kernel refused it with EINVAL. It allocates only the first
// time.
func (w *tapWriter) probeRefused(frame []byte) bool {
	hl := w.b.cfg.vnetHdrLen
	if w.probe == nil {
		w.probe = make([]byte, 0, probeFrameCap(hl))
	}
	ipv6 := false
	if l, err := vnethdr.ParseLayout(frame); err == nil {
		ipv6 = l.IPv6
	}
	w.probe = appendProbeFrame(w.probe[:0], hl, w.hdr.GSOType, ipv6)
	_, err := w.b.tap.Write(w.probe)
	return errors.Is(err, unix.EINVAL)
}

// kill turns the offloads off for good (sticky until restart): frames of that kind
// are split before the write from now on, and for TCP the GRO engine stops building them.
func (w *tapWriter) kill(off vnethdr.Offloads, cause error) {
	b := w.b
	if off&^vnethdr.OffloadUSO != 0 || off == 0 {
		// TCP GSO refused: the GRO engine's TCP output is the same kind.
		if !b.groKilled.Swap(true) && b.onGROKill != nil {
			b.onGROKill(cause)
		}
	}
	if off != 0 {
		if old := vnethdr.Offloads(b.tapKilled.Or(uint32(off))); old&off != off {
			b.reconf.Add(1) // the engine's UDP/ECN settings follow tapWrite
			if b.onOffloadKill != nil {
				b.onOffloadKill(off&^old, cause)
			}
		}
	}
}

// split writes the GSO packet pkt (its header decoded into w.hdr) to the TAP as plain
// segments.
func (w *tapWriter) split(pkt []byte) {
	b := w.b
	st := &b.p2t
	hl := b.cfg.vnetHdrLen
	frame := pkt[hl:]
	pl, err := vnethdr.Plan(frame, &w.hdr)
	if err != nil {
		st.DropMalformed.Add(1)
		return
	}
	// One slab, carved into nseg segments of hl + headers + gso_size; it grows to the
	// largest frame seen and is then reused, so only the first fallback allocates.
	segCap, nseg := hl+pl.SegCap, pl.Segments
	if w.fallbackSize == nil {
		// vnethdr.Plan admits no more segments, and ValidatePeer no more than it.
		w.fallback = make([][]byte, vnethdr.MaxSegments)
		w.fallbackViews = make([][]byte, vnethdr.MaxSegments)
		w.fallbackSize = make([]int, vnethdr.MaxSegments)
	}
	if need := segCap * nseg; len(w.slab) < need {
		w.slab = make([]byte, need)
	}
	for i := 0; i < nseg; i++ {
		w.fallback[i] = w.slab[i*segCap : (i+1)*segCap]
		w.fallbackViews[i] = w.fallback[i][hl:]
	}
	n, err := vnethdr.Split(frame, &w.hdr, w.fallbackViews[:nseg], w.fallbackSize[:nseg])
	if err != nil {
		st.DropMalformed.Add(1)
		return
	}
	for i := 0; i < n; i++ {
		out := w.fallback[i][:hl+w.fallbackSize[i]]
		vnethdr.Zero(out, hl)
		if _, err := b.tap.Write(out); err != nil {
			st.DropTapError.Add(1)
			continue
		}
		if c := b.capture.tap.Writer(); c != nil {
			c.WriteFrame(time.Now(), out[hl:])
		}
		st.Frames.Add(1)
		st.Bytes.Add(uint64(w.fallbackSize[i]))
	}
}
