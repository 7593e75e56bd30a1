package datapath

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"tapgro/coalescer"
	"tapgro/kvlog"
	"tapgro/pcapio"
	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// Config is everything the engine needs to know before it starts.
type Config struct {
	VnetHdrLen  int           // the TAP's virtio_net_hdr length (10 or 12)
	Batch       int           // frames per read batch, both directions
	GRO         bool          // coalesce TCP port→TAP (--gro)
	UDPGRO      bool          // coalesce UDP port→TAP where the TAP takes USO (--udp-gro)
	TimerFlush  bool          // hold aggregates across reads, flushed on RSCInterval (--gro-flush timer)
	RSCInterval time.Duration // the timer flush's interval
	MaxFlows    int           // GRO flow table size (--gro-flows)
	RX          rxpool.Config // the TAP→port receive pool (--rx-* flags)

	// Offload is the operator's choice of the TAP's read offloads (--offload) and Port
	// what the configured port will take before any peer connects (netdev.Spec.PortCaps).
	Offload vnethdr.Choice
	Port    port.Caps

	// Capture: the starting files for each side ("" is off) and the writers' limits.
	PcapTap, PcapPort string
	Pcap              pcapio.Options

	// Trace, if set, is called with every GRO decision (port→TAP goroutine only).
	Trace func(r coalescer.Reason, frameLen int)
}

// Logger is kvlog's, the libraries' one contract. The engine's events are rare, never
// per packet (per-packet problems are counters, read through Snapshot).
type Logger = kvlog.Logger

// NopLogger discards everything (kvlog.Nop).
type NopLogger = kvlog.Nop

// TAP is what the engine needs of its TAP: *tapdev.Device, or the in-memory TAP of
// package tapdev/taptest.
type TAP interface {
	tapIO
	io.Closer
	Name() string
	// ProbeOffloads is what TUNSETOFFLOAD accepts; Accepts what writes may carry;
	// SetOffloads sets the read offloads and returns what was set.
	ProbeOffloads() vnethdr.Offloads
	Accepts() vnethdr.Offloads
	SetOffloads(vnethdr.Offloads) (vnethdr.Offloads, error)
}

var _ TAP = (*tapdev.Device)(nil)

// Engine moves frames between one TAP and whichever peer is connected, both ways.
type Engine struct {
	b   *bridge
	tap TAP
	log Logger
}

// New sets the engine up on an open TAP: it negotiates the TAP's read offloads for the
// configured port (and sets them with TUNSETOFFLOAD), probes whether the kernel takes
// GSO writes, and opens the starting capture files. Nothing runs until Serve.
func New(cfg Config, tap TAP, log Logger) (*Engine, error) {
	if log == nil {
		log = NopLogger{}
	}
	probed := tap.ProbeOffloads()
	// Writes may always carry partial checksums and TCP GSO; UDP_L4 GSO only where the
	// kernel knows it, which is what a successful USO probe shows (tapdev Accepts).
	accepts := tap.Accepts()
	in := negInput{TapProbed: probed, TapHdrLen: cfg.VnetHdrLen, TapWrite: accepts,
		Choice: cfg.Offload, Port: cfg.Port, GRO: cfg.GRO, UDPGRO: cfg.UDPGRO}
	neg := negotiate(in)
	set, err := tap.SetOffloads(neg.TapOffloads)
	if err != nil {
		return nil, fmt.Errorf("TUNSETOFFLOAD %s on %s: %w", neg.TapOffloads, tap.Name(), err)
	}
	neg.TapOffloads = set

	b := newBridge(bridgeConfig{
		vnetHdrLen:  cfg.VnetHdrLen,
		batch:       cfg.Batch,
		gro:         cfg.GRO,
		udpGRO:      cfg.UDPGRO,
		timerFlush:  cfg.TimerFlush,
		rscInterval: cfg.RSCInterval,
		maxFlows:    cfg.MaxFlows,
		tapAccepts:  accepts,
		tapEmits:    set,
		trace:       cfg.Trace,
		rx:          cfg.RX,
	}, tap)
	e := &Engine{b: b, tap: tap, log: log}
	var killOnce sync.Once
	b.onGROKill = func(err error) {
		killOnce.Do(func() {
			log.Warn("the kernel refused a GSO write; GRO is off from now on and frames go to the TAP segment by segment", "error", err)
		})
	}
	b.onOffloadKill = func(off vnethdr.Offloads, err error) {
		log.Warn("the kernel refused a valid GSO write; frames of this kind now go to the TAP segment by segment", "error", err, "offload", off.String())
	}
	b.onNoAlarm = func(err error) {
		log.Warn("timer flush without its alarm: aggregates may be held up to 1 ms past --rsc-interval on an idle port", "error", err)
	}
	if cfg.GRO {
		if err := probeGSOWrite(tap, cfg.VnetHdrLen); err != nil {
			b.groKilled.Store(true)
			log.Warn("start-up GSO probe failed: writing segments instead of GSO packets", "error", err)
		}
	}
	b.initNegotiation(in, neg, func(n *Negotiation) { log.Info("negotiated: " + n.String()) })

	b.capture.opt = cfg.Pcap
	if err := b.capture.set(&b.capture.tap, cfg.PcapTap); err != nil {
		return nil, fmt.Errorf("--pcap-tap: %w", err)
	}
	if err := b.capture.set(&b.capture.port, cfg.PcapPort); err != nil {
		b.capture.close()
		return nil, fmt.Errorf("--pcap-port: %w", err)
	}
	return e, nil
}

// Endpoint is where connections come from: Next blocks until the next peer is
// connected. A netdev.Endpoint is one as it is; the engine asks no more of it, so that
// a test can hand it a single port (datapathtest.OneShot).
type Endpoint interface {
	Next(ctx context.Context) (port.Port, error)
	Addr() string
}

// DrainTimeout bounds how long shutdown waits for frames already read from the TAP to
// reach a port that has stopped taking them (a stopped or wedged peer): after it the
// port is closed and what is still queued is counted as port_error drops.
const DrainTimeout = 2 * time.Second

// Serve runs both pipelines until ctx ends: the TAP→port goroutine for as long as the
// TAP is open, and, for each connection ep yields (one at a time), a port→TAP goroutine
// until that peer leaves. It returns nil on shutdown, or the error that ended ep (wrapped
// with its address). On return the TAP is closed and capture files are flushed.
//
// On shutdown the TAP is closed first, so nothing new is read, and what was read is
// still delivered: the TAP→port goroutine finishes its batch and flushes the pool into
// the port before the port is closed. Frames still in the kernel's TAP queue are never
// read, so they are the kernel's drops, as for a NIC going down.
func (e *Engine) Serve(ctx context.Context, ep Endpoint) error {
	defer e.b.capture.close()
	tapErr := make(chan error, 1)
	tapDone := make(chan struct{})
	go func() { tapErr <- e.b.runTapToPort(); close(tapDone) }()
	drain := func() { drainTAP(e.tap, tapDone, DrainTimeout, e.log) }
	err := e.supervise(ctx, ep, drain)
	e.tap.Close()
	<-tapErr
	return err
}

// drainTAP closes the TAP and waits, at most limit, for the TAP→port goroutine (done)
// to deliver what it has read.
func drainTAP(tap io.Closer, done <-chan struct{}, limit time.Duration, log Logger) {
	tap.Close()
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.Warn("shutdown: the port took no more frames; dropping what is still queued for it", "waited", limit)
	}
}

// supervise hands each connection the endpoint yields to the datapath, one at a time,
// until ctx is cancelled.
func (e *Engine) supervise(ctx context.Context, ep Endpoint, drain func()) error {
	b, log := e.b, e.log
	for {
		p, err := ep.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("port %s: %w", ep.Addr(), err)
		}
		log.Info("port connected", "peer", p.Peer())
		// This peer's capabilities decide the TAP's offloads and the software steps.
		if _, err := b.portConnected(p); err != nil {
			log.Warn("cannot set the TAP's offloads for this peer; keeping the previous ones", "error", err)
		}
		// Before the TAP→port goroutine sees the port, so the two never write at once.
		e.announce(p)
		ref := newPortRef(p)
		b.port.Store(ref)

		done := make(chan error, 1)
		go func() { done <- b.runPortToTap(p) }()
		select {
		case err = <-done:
		case <-ctx.Done():
			drain()
			p.Close()
			err = <-done
		}
		b.port.CompareAndSwap(ref, nil)
		p.Close()
		if ctx.Err() != nil {
			log.Info("port closed for shutdown", "peer", p.Peer())
			return nil
		}
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, port.ErrClosed) {
			log.Warn("port connection ended with an error; waiting for the next one", "peer", p.Peer(), "error", err)
		} else {
			log.Info("port disconnected; waiting for the next connection", "peer", p.Peer())
		}
	}
}

// announce tells a new peer the TAP's MAC for each of its addresses (announce.go).
func (e *Engine) announce(p port.Port) {
	mac, addrs, err := e.b.tap.LinkInfo()
	if err != nil {
		e.log.Debug("cannot read the TAP's addresses; not announcing them", "error", err)
		return
	}
	frames := announceFrames(mac, addrs)
	if len(frames) == 0 {
		return
	}
	if hl := p.VnetHdrLen(); hl > 0 {
		// A header-carrying port (vnet-hdr=on, VALE) takes [header][frame]: an all-zero
		// header says "plain, fully checksummed".
		for i, f := range frames {
			frames[i] = append(make([]byte, hl, hl+len(f)), f...)
		}
	}
	if _, err := p.WriteBatch(frames); err != nil {
		e.log.Debug("announcing the TAP's addresses failed", "error", err)
		return
	}
	e.log.Debug("announced the TAP's addresses to the peer", "mac", mac.String(), "addrs", len(frames))
}

// ---- runtime switches ----

// SetGRO switches TCP coalescing (port→TAP) on or off at run time and returns the
// negotiation that results. A kernel that refused GSO keeps it off whatever is asked.
func (e *Engine) SetGRO(on bool) *Negotiation { return e.b.SetGRO(on) }

// SetUDPGRO switches UDP coalescing (port→TAP) on or off at run time.
func (e *Engine) SetUDPGRO(on bool) *Negotiation { return e.b.SetUDPGRO(on) }

// SetOffloads replaces the --offload choice and renegotiates; it returns the TAP's read
// offloads now set. On a TUNSETOFFLOAD failure the previous mask stays in force.
func (e *Engine) SetOffloads(c vnethdr.Choice) (vnethdr.Offloads, error) {
	return e.b.SetTapOffloadChoice(c)
}

// CaptureSide names one of the two capture points.
type CaptureSide int

const (
	CaptureTap  CaptureSide = iota // frames as the TAP sees them
	CapturePort                    // frames as the peer sees them
)

// SetCapture starts capture of side into path, or stops it for path "".
func (e *Engine) SetCapture(side CaptureSide, path string) error {
	c := &e.b.capture
	if side == CaptureTap {
		return c.set(&c.tap, path)
	}
	return c.set(&c.port, path)
}

// Close stops both captures, flushing them (Serve does so too when it returns). It is
// for a process that set the engine up and then failed before Serve.
func (e *Engine) Close() error { return e.b.capture.close() }

// ReopenCapture rotates both live capture files (SIGHUP).
func (e *Engine) ReopenCapture() error { return e.b.capture.reopen() }

// ---- state ----

// Dir is one direction's counters at the moment of a Snapshot.
type Dir struct {
	Reads   uint64 // frames read from the near side
	Batches uint64 // read batches processed
	Frames  uint64 // frames (towards the TAP: packets) delivered to the far side
	Bytes   uint64 // Ethernet bytes delivered

	Drops [NumDrops]uint64 // frames dropped, by reason

	GSOSegmented   uint64 // GSO frames split in software
	GSOPassthrough uint64 // GSO frames handed on whole
	GSOFallback    uint64 // port→TAP: GSO writes the kernel refused (EINVAL), re-sent segmented
	CsumCompleted  uint64 // TAP→port: partial checksums completed in software
}

// Drop is a reason a frame was dropped.
type Drop int

const (
	DropNoPeer    Drop = iota // TAP→port: nobody connected
	DropMalformed             // a bad vnet header, or headers that cannot be segmented
	DropPortError             // TAP→port: the port failed mid-batch
	DropTapEIO                // port→TAP: the TAP's link is down
	DropTapError              // port→TAP: other write errors
	NumDrops
)

var dropNames = [NumDrops]string{"no_peer", "malformed", "port_error", "tap_link_down", "tap_error"}

func (d Drop) String() string { return dropNames[d] }

// Capture is one capture point's state.
type Capture struct {
	State   string // "off", or the file with its counts (and why it stopped, if it did)
	Frames  uint64 // frames written, over all files this side has had
	Dropped uint64 // frames the capture could not write
}

// Snapshot is the engine's state at one moment: the only way to read it. Counters are
// read one by one, so two of them may be a few frames apart under traffic.
type Snapshot struct {
	TapToPort, PortToTap Dir

	// GRO is the GRO engine's counters, nil until the first connection created it.
	GRO *coalescer.Stats
	// Pool is the TAP→port receive pool's counters; PoolBuffers its size (0 until the
	// TAP→port pipeline started).
	Pool        *rxpool.Stats
	PoolBuffers int
	// Tap is the TAP device's own counters.
	Tap *tapdev.Stats

	Negotiation    *Negotiation     // the last negotiation (nil before the first)
	Offload        vnethdr.Choice   // the operator's current --offload choice
	TapProbed      vnethdr.Offloads // the read offloads the kernel takes
	GROOn          bool             // --gro / SetGRO
	GROKilled      bool             // the kernel refused GSO writes: GRO is off for good
	UDPGROOn       bool             // --udp-gro / SetUDPGRO
	OffloadsKilled vnethdr.Offloads // offloads whose GSO writes the kernel refused

	Connected  bool   // a peer is connected
	Peer       string // its description ("" while disconnected)
	PeerUnread int    // bytes the peer sent that are not read yet; -1 when unknown

	CaptureTap, CapturePort Capture
}

// Dropped is a direction's dropped frames, every reason summed: for TAP→port also the
// frames the receive pool could not take because they were larger than it.
func (s *Snapshot) Dropped(d *Dir) uint64 {
	var n uint64
	for _, v := range d.Drops {
		n += v
	}
	if d == &s.TapToPort && s.Pool != nil {
		n += s.Pool.Drops[rxpool.DropTooBig].Load()
	}
	return n
}

// inQueuer is a port that can tell how many received bytes wait unread (SIOCINQ).
type inQueuer interface{ InQueue() (int, error) }

// Snapshot reads the engine's state.
func (e *Engine) Snapshot() Snapshot {
	b := e.b
	s := Snapshot{
		TapToPort:   b.t2p.load(),
		PortToTap:   b.p2t.load(),
		Pool:        &b.rxStats,
		PoolBuffers: int(b.rxBuffers.Load()),
		Tap:         b.tap.Stats(),
		Negotiation: b.neg.Load(),
		GROOn:       b.groOn.Load(), GROKilled: b.groKilled.Load(), UDPGROOn: b.udpGROOn.Load(),
		OffloadsKilled: vnethdr.Offloads(b.tapKilled.Load()),
		PeerUnread:     -1,
		CaptureTap:     b.capture.tap.snapshot(),
		CapturePort:    b.capture.port.snapshot(),
	}
	b.coalMu.Lock()
	if b.coal != nil {
		s.GRO = b.coal.Stats()
	}
	b.coalMu.Unlock()
	b.negMu.Lock()
	s.Offload, s.TapProbed = b.negIn.Choice, b.negIn.TapProbed
	b.negMu.Unlock()
	if ref := b.port.Load(); ref != nil {
		s.Connected, s.Peer = true, ref.p.Peer()
		if q, ok := ref.p.(inQueuer); ok {
			if n, err := q.InQueue(); err == nil {
				s.PeerUnread = n
			}
		}
	}
	return s
}

func (d *dirStats) load() Dir {
	out := Dir{
		Reads: d.Reads.Load(), Batches: d.Batches.Load(), Frames: d.Frames.Load(), Bytes: d.Bytes.Load(),
		GSOSegmented: d.GSOSegmented.Load(), GSOPassthrough: d.GSOPassthrough.Load(),
		GSOFallback: d.GSOFallback.Load(), CsumCompleted: d.CsumCompleted.Load(),
	}
	for r := range d.Drops {
		out.Drops[r] = d.Drops[r].Load()
	}
	return out
}
