package main

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/coalescer"
	"tapgro/netmapio"
	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// The bridge is the datapath: two pipelines, each one goroutine that owns its buffers, so
// nothing on the packet path takes a lock (design.md).
//
//	TAP ──ReadBatch──► decode vnet hdr ──► segment / complete csum ──► Port.WriteBatch
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

// tapToPort is the state of the TAP→port pipeline. Segments produced by software GSO are
// carved out of one preallocated arena; everything queued in out is sent with a single
// WriteBatch at the end of each TAP read batch (or earlier when the arena runs out).
type tapToPort struct {
	b     *bridge
	bufs  [][]byte
	sizes []int

	arena []byte
	used  int

	segs     [][]byte // scratch for Split: views into arena
	segSizes []int
	out      [][]byte
	hdr      vnethdr.Hdr
}

const (
	arenaSize = 4 << 20 // 4 MiB: a whole batch of 64 KB GSO frames split at MTU 1500
	maxOut    = 512     // frames per WriteBatch (IOV_MAX 1024 / 2 iovecs per framed record)
	maxSegs   = 1024    // segments per GSO frame: 64 KiB at the smallest sane MSS (64)
)

func newTapToPort(b *bridge) *tapToPort {
	p := &tapToPort{
		b:        b,
		bufs:     make([][]byte, b.cfg.batch),
		sizes:    make([]int, b.cfg.batch),
		arena:    make([]byte, arenaSize),
		segs:     make([][]byte, maxSegs),
		segSizes: make([]int, maxSegs),
		out:      make([][]byte, 0, maxOut),
	}
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
	hl := b.cfg.vnetHdrLen
	for i := 0; i < n; i++ {
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
			p.queue(ref, frame)
			continue
		}
		p.split(ref, frame)
	}
	p.flush(ref)
}

// split segments one GSO frame into the arena. The arena is flushed first when the
// segments would not fit, so a frame is never half-queued.
func (p *tapToPort) split(ref *portRef, frame []byte) {
	st := &p.b.t2p
	lay, err := vnethdr.ParseLayout(frame)
	if err != nil || p.hdr.GSOSize == 0 {
		st.DropMalformed.Add(1)
		return
	}
	payload := len(frame) - lay.PayloadOff
	segCap := lay.PayloadOff + int(p.hdr.GSOSize)
	nseg := (payload + int(p.hdr.GSOSize) - 1) / int(p.hdr.GSOSize)
	if nseg < 1 || nseg > maxSegs || nseg*segCap > len(p.arena) {
		st.DropMalformed.Add(1)
		return
	}
	if p.used+nseg*segCap > len(p.arena) || len(p.out)+nseg > maxOut {
		p.flush(ref)
	}
	for i := 0; i < nseg; i++ {
		p.segs[i] = p.arena[p.used : p.used+segCap : p.used+segCap]
		p.used += segCap
	}
	n, err := vnethdr.Split(frame, &p.hdr, p.segs[:nseg], p.segSizes[:nseg])
	if err != nil {
		st.DropMalformed.Add(1)
		return
	}
	st.GSOSegmented.Add(1)
	for i := 0; i < n; i++ {
		p.queue(ref, p.segs[i][:p.segSizes[i]])
	}
}

func (p *tapToPort) queue(ref *portRef, frame []byte) {
	if len(p.out) == maxOut {
		p.flush(ref)
	}
	p.out = append(p.out, frame)
}

// flush hands everything queued to the port in one WriteBatch. A failing port is closed
// so its port→TAP goroutine ends and the supervisor waits for the next peer; the frames
// it could not take are counted, not retried, like a NIC whose cable was pulled.
func (p *tapToPort) flush(ref *portRef) {
	st := &p.b.t2p
	if len(p.out) > 0 {
		n, err := ref.p.WriteBatch(p.out)
		st.Frames.Add(uint64(n))
		for _, f := range p.out[:n] {
			st.Bytes.Add(uint64(len(f)))
		}
		if err != nil {
			st.DropPortError.Add(uint64(len(p.out) - n))
			ref.p.Close()
			p.b.port.CompareAndSwap(ref, nil)
		}
	}
	clear(p.out)
	p.out = p.out[:0]
	p.used = 0
}

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
