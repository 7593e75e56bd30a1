package main

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

	"tapgro/coalescer"
	"tapgro/netmapio"
	"tapgro/rxpool"
	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// The bridge is the datapath: two pipelines, each one goroutine that owns its buffers, so
// nothing on the packet path takes a lock (design.md).
//
//	TAP ──ReadBatch──► decode vnet hdr ──► segment / complete csum ──► rxpool ──► Port
//	TAP ◄──Write────── coalescer (GRO) ◄── Port.ReadBatch
//
// The TAP→port goroutine lives as long as the TAP: while no peer is connected it keeps
// reading and discards (counted), as QEMU itself discards while its link is down
// (wire.md §3.3). The port→TAP goroutine lives as long as one connection.

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
	GSOSegmented  atomic.Uint64 // TAP→port: GSO frames split in software
	CsumCompleted atomic.Uint64 // TAP→port: NEEDS_CSUM completed in software
}

type bridgeConfig struct {
	vnetHdrLen  int
	batch       int
	gro         bool
	udpGRO      bool
	timerFlush  bool
	rscInterval time.Duration
	maxFlows    int
	tapAccepts  vnethdr.Offloads // what the TAP accepts on write (always: see wire.md §1.4)
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

type bridge struct {
	cfg bridgeConfig
	tap tapIO

	port atomic.Pointer[portRef] // current peer, nil while disconnected

	t2p dirStats
	p2t dirStats

	rxStats   rxpool.Stats // the TAP→port receive pool's counters
	rxBuffers atomic.Int64 // its size in buffers, once the pipeline has started

	// groKilled is set (once, never cleared) when the kernel refused a GSO write: from then
	// on frames go to the TAP one segment at a time, so the stream survives a kernel that
	// rejects valid GSO frames (research/gro.md §c.1).
	groKilled atomic.Bool
	onGROKill func(error) // called once, from the port→TAP goroutine

	coalMu sync.Mutex // guards coal between connections (metrics read it too)
	coal   *coalescer.Coalescer
}

// portRef wraps a Port so the TAP→port goroutine can detect a swap with a pointer compare.
type portRef struct{ p netmapio.Port }

func newBridge(cfg bridgeConfig, tap tapIO) *bridge {
	return &bridge{cfg: cfg, tap: tap}
}

// frameCap is the largest frame either side may hand us plus its vnet header: QEMU's
// NET_BUFSIZE covers the worst-case 65593-byte IPv6 GSO frame from a TAP (wire.md §1.7).
func (b *bridge) frameCap() int { return b.cfg.vnetHdrLen + netmapio.MaxFrame }

// runTapToPort reads the TAP until it is closed. It returns nil on Close.
func (b *bridge) runTapToPort() error {
	p := newTapToPort(b)
	for {
		n, err := b.tap.ReadBatch(p.bufs, p.sizes, 0)
		if n > 0 {
			p.process(n)
		}
		if err != nil {
			if errors.Is(err, unix.EAGAIN) {
				continue
			}
			return err
		}
	}
}

// tapToPort is the state of the TAP→port pipeline. Every frame for the port is staged
// in the receive pool (rxpool): plain frames are copied in, GSO frames are split
// straight into reserved pool buffers. The pool is flushed at the end of each TAP read
// batch, or earlier when it is full; when the port is full the flush waits for it in the
// netpoller, so this goroutine stops reading the TAP until the peer catches up.
type tapToPort struct {
	b     *bridge
	bufs  [][]byte
	sizes []int

	pool *rxpool.Pool
	ref  *portRef      // the port of the batch being processed
	out  rxpool.Sender // ref's BatchSender, or a blocking adapter

	segs     [][]byte // scratch for Split: views into the pool
	segSizes []int
	hdr      vnethdr.Hdr
}

// maxSegs is the most segments of one GSO frame: 64 KiB at the smallest sane MSS (64).
const maxSegs = 1024

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
		pool:     pool,
		segs:     make([][]byte, maxSegs),
		segSizes: make([]int, maxSegs),
	}
	b.rxBuffers.Store(int64(pool.Buffers()))
	for i := range p.bufs {
		p.bufs[i] = make([]byte, b.frameCap())
	}
	return p
}

func (p *tapToPort) process(n int) {
	b := p.b
	st := &b.t2p
	st.Batches.Add(1)
	st.Reads.Add(uint64(n))
	ref := b.port.Load()
	if ref == nil {
		st.DropNoPeer.Add(uint64(n))
		return
	}
	p.setPort(ref)
	hl := b.cfg.vnetHdrLen
	for i := 0; i < n; i++ {
		if p.ref == nil {
			// The port failed mid-batch: the rest of the batch has nowhere to go.
			st.DropPortError.Add(uint64(n - i))
			return
		}
		pkt := p.bufs[i][:p.sizes[i]]
		if err := p.hdr.Decode(pkt, hl); err != nil {
			st.DropMalformed.Add(1)
			continue
		}
		frame := pkt[hl:]
		if !p.hdr.IsGSO() {
			if p.hdr.Flags&vnethdr.FlagNeedsCsum != 0 {
				if vnethdr.CompleteChecksum(frame, &p.hdr) != nil {
					st.DropMalformed.Add(1)
					continue
				}
				st.CsumCompleted.Add(1)
			}
			p.stage(frame)
			continue
		}
		p.split(frame)
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
	if s, ok := ref.p.(netmapio.BatchSender); ok {
		p.out = s
	} else {
		p.out = blockingSender{ref.p}
	}
}

// stage copies one plain frame into the pool (one memcpy of at most the MTU).
func (p *tapToPort) stage(frame []byte) {
	buf, ok := p.pool.Reserve(len(frame))
	if !ok {
		if !p.pool.Fits(len(frame), 1) {
			p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
			return
		}
		if !p.flush(rxpool.ReasonPoolFull) {
			p.b.t2p.DropPortError.Add(1)
			return
		}
		if buf, ok = p.pool.Reserve(len(frame)); !ok {
			p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
			return
		}
	}
	p.pool.Commit(copy(buf, frame))
	if p.pool.PerFrame() {
		p.flush(rxpool.ReasonFrame)
	}
}

// split segments one GSO frame straight into pool buffers. All segments are reserved
// before Split runs (the pool is flushed first when they do not fit), so a frame is
// never half-staged.
func (p *tapToPort) split(frame []byte) {
	st := &p.b.t2p
	lay, err := vnethdr.ParseLayout(frame)
	if err != nil || p.hdr.GSOSize == 0 {
		st.DropMalformed.Add(1)
		return
	}
	payload := len(frame) - lay.PayloadOff
	segCap := lay.PayloadOff + int(p.hdr.GSOSize)
	nseg := (payload + int(p.hdr.GSOSize) - 1) / int(p.hdr.GSOSize)
	if nseg < 1 || nseg > maxSegs {
		st.DropMalformed.Add(1)
		return
	}
	if !p.pool.Fits(segCap, nseg) {
		p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
		return
	}
	if !p.reserve(segCap, nseg) {
		if !p.flush(rxpool.ReasonPoolFull) {
			st.DropPortError.Add(1)
			return
		}
		if !p.reserve(segCap, nseg) { // cannot happen: it Fits an empty pool
			p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
			return
		}
	}
	n, err := vnethdr.Split(frame, &p.hdr, p.segs[:nseg], p.segSizes[:nseg])
	if err != nil {
		p.pool.Cancel()
		st.DropMalformed.Add(1)
		return
	}
	st.GSOSegmented.Add(1)
	for i := 0; i < n; i++ {
		p.pool.Commit(p.segSizes[i])
	}
	p.pool.Cancel() // segments Split did not need, if any
	if p.pool.PerFrame() {
		p.flush(rxpool.ReasonFrame)
	}
}

// reserve claims nseg segments of segCap bytes, or none.
func (p *tapToPort) reserve(segCap, nseg int) bool {
	for i := 0; i < nseg; i++ {
		buf, ok := p.pool.Reserve(segCap)
		if !ok {
			p.pool.Cancel()
			return false
		}
		p.segs[i] = buf
	}
	return true
}

// flush hands everything staged to the port and reports whether the port is still
// usable. A failing port is closed so its port→TAP goroutine ends and the supervisor
// waits for the next peer; the frames it could not take are counted, not retried, like
// a NIC whose cable was pulled.
func (p *tapToPort) flush(why rxpool.Reason) bool {
	st := &p.b.t2p
	staged, _ := p.pool.Queued()
	n, bytes, err := p.pool.Flush(p.out, why)
	st.Frames.Add(uint64(n))
	st.Bytes.Add(uint64(bytes))
	if err == nil {
		return true
	}
	st.DropPortError.Add(uint64(staged - n))
	p.pool.Discard(rxpool.DropPortError)
	p.ref.p.Close()
	p.b.port.CompareAndSwap(p.ref, nil)
	p.ref, p.out = nil, nil
	return false
}

// blockingSender adapts a Port without BatchSender: WriteBatch blocks until everything
// is sent, so it never reports ErrWouldBlock and the pool never waits on it.
type blockingSender struct{ p netmapio.Port }

func (s blockingSender) TryWriteBatch(frames [][]byte) (int, error) { return s.p.WriteBatch(frames) }
func (s blockingSender) WaitWritable(time.Time) error               { return nil }
func (s blockingSender) Room() (int, int)                           { return math.MaxInt, math.MaxInt }

// tapWriter writes the coalescer's output to the TAP. It belongs to the port→TAP
// goroutine of whichever connection is live (one at a time), so it needs no lock.
type tapWriter struct {
	b   *bridge
	hdr vnethdr.Hdr

	// fallback buffers are allocated on first use: only a kernel that refuses GSO needs them.
	fallback      [][]byte
	fallbackViews [][]byte
	fallbackSize  []int
}

// coalescerConfig derives the GRO engine's settings from what the TAP accepts.
func (b *bridge) coalescerConfig() coalescer.Config {
	return coalescer.Config{
		MaxFlows:    b.cfg.maxFlows,
		MaxSegments: 64,
		VnetHdrLen:  b.cfg.vnetHdrLen,
		DisableTCP:  !b.cfg.gro || b.groKilled.Load(),
		UDP:         b.cfg.gro && b.cfg.udpGRO && !b.groKilled.Load() && b.cfg.tapAccepts&vnethdr.OffloadUSO == vnethdr.OffloadUSO,
		ECN:         b.cfg.tapAccepts&vnethdr.OffloadTSOECN != 0,
		Trace:       b.cfg.trace,
	}
}

// coalescerFor returns the bridge's single GRO engine, creating it on first use. It is
// kept across connections so its memory is allocated once and its counters keep counting.
func (b *bridge) coalescerFor() *coalescer.Coalescer {
	b.coalMu.Lock()
	defer b.coalMu.Unlock()
	if b.coal == nil {
		w := &tapWriter{b: b}
		b.coal = coalescer.New(b.coalescerConfig(), w.write)
	} else {
		b.coal.SetConfig(b.coalescerConfig())
	}
	return b.coal
}

// portToTap is one connection's port→TAP pipeline: its read buffers carry vnetHdrLen
// bytes of headroom so a frame the GRO engine passes through gets its header written in
// place, never copied.
type portToTap struct {
	b     *bridge
	bufs  [][]byte
	views [][]byte // bufs[i][vnetHdrLen:], what Port.ReadBatch fills
	sizes []int
}

func newPortToTap(b *bridge) *portToTap {
	hl := b.cfg.vnetHdrLen
	p := &portToTap{
		b:     b,
		bufs:  make([][]byte, b.cfg.batch),
		views: make([][]byte, b.cfg.batch),
		sizes: make([]int, b.cfg.batch),
	}
	for i := range p.bufs {
		p.bufs[i] = make([]byte, b.frameCap())
		p.views[i] = p.bufs[i][hl:]
	}
	return p
}

// runPortToTap moves frames from one connected port to the TAP until the port fails or
// is closed; it returns that error.
func (b *bridge) runPortToTap(port netmapio.Port) error { return newPortToTap(b).run(port) }

func (p *portToTap) run(port netmapio.Port) error {
	b := p.b
	hl := b.cfg.vnetHdrLen
	bufs, views, sizes := p.bufs, p.views, p.sizes
	coal := b.coalescerFor()
	st := &b.p2t
	killed := b.groKilled.Load()
	interval := b.cfg.rscInterval.Nanoseconds()
	armed := false // a read deadline is set for the timer flush
	for {
		n, err := port.ReadBatch(views, sizes)
		now := time.Now().UnixNano()
		if n > 0 {
			st.Batches.Add(1)
			st.Reads.Add(uint64(n))
			for i := 0; i < n; i++ {
				coal.Add(bufs[i][:hl+sizes[i]], nil, now)
			}
			// A read batch is what one read from the peer delivered, not what fits in
			// our buffers: flush only once nothing more is buffered (research/gro.md §d).
			if !b.cfg.timerFlush && !port.Pending() {
				coal.Flush()
			}
			if k := b.groKilled.Load(); k != killed {
				killed = k
				coal.SetConfig(b.coalescerConfig())
			}
		}
		if b.cfg.timerFlush {
			// Timer mode (QEMU RSC's rsc_interval): hold aggregates across reads, and let
			// the read deadline be the timer, armed only while something is held.
			coal.FlushExpired(now, interval)
			if oldest, ok := coal.Oldest(); ok {
				port.SetReadDeadline(time.Unix(0, oldest+interval))
				armed = true
			} else if armed {
				port.SetReadDeadline(time.Time{})
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

// write is the coalescer's output: one write() per packet, which is the point of GRO.
func (w *tapWriter) write(pkt []byte) {
	st := &w.b.p2t
	_, err := w.b.tap.Write(pkt)
	if err == nil {
		st.Frames.Add(1)
		st.Bytes.Add(uint64(len(pkt) - w.b.cfg.vnetHdrLen))
		return
	}
	switch {
	case errors.Is(err, unix.EINVAL) && w.isGSO(pkt):
		w.writeSegmented(pkt, err)
	case errors.Is(err, unix.EIO):
		st.DropTapEIO.Add(1)
	default:
		st.DropTapError.Add(1)
	}
}

func (w *tapWriter) isGSO(pkt []byte) bool {
	return w.hdr.Decode(pkt, w.b.cfg.vnetHdrLen) == nil && w.hdr.IsGSO()
}

// writeSegmented re-sends a GSO packet the kernel refused as plain segments and turns GRO
// off for good: a kernel that rejects one valid GSO frame rejects them all
// (research/gro.md §c.1). w.hdr holds the refused packet's header (set by isGSO).
func (w *tapWriter) writeSegmented(pkt []byte, cause error) {
	b := w.b
	st := &b.p2t
	hl := b.cfg.vnetHdrLen
	st.GSOFallback.Add(1)
	if !b.groKilled.Swap(true) && b.onGROKill != nil {
		b.onGROKill(cause)
	}
	if w.fallback == nil {
		w.fallback = make([][]byte, maxSegs)
		w.fallbackViews = make([][]byte, maxSegs)
		w.fallbackSize = make([]int, maxSegs)
		for i := range w.fallback {
			w.fallback[i] = make([]byte, b.frameCap())
			w.fallbackViews[i] = w.fallback[i][hl:]
		}
	}
	n, err := vnethdr.Split(pkt[hl:], &w.hdr, w.fallbackViews, w.fallbackSize)
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
		st.Frames.Add(1)
		st.Bytes.Add(uint64(w.fallbackSize[i]))
	}
}
