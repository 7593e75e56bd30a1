//go:build linux

package vhostnet

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"tapgro/coalescer"
	"tapgro/kvlog"
	"tapgro/pcapio"
	"tapgro/quietlog"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// MaxFrame is the largest Ethernet frame a TAP hands over: 14 Ethernet + 4 VLAN + 40
// IPv6 + 65535 (drivers/net/tun.c tun_put_user, a GSO super-frame at its limit).
const MaxFrame = 65593

// Drop is why a frame was dropped, as the engine's datapath.Drop and the other reason
// types are: a typed index into Stats.Drops with a String that is its metric label.
type Drop int

const (
	DropTXBadHeader     Drop = iota // vnethdr.ValidatePeer refused the guest's header
	DropTXNotNegotiated             // NEEDS_CSUM or a GSO kind the guest did not ack (CSUM, HOST_*)
	DropTXRunt                      // shorter than an Ethernet header
	DropTXTooLong                   // longer than MaxFrame
	DropTXTAP                       // the TAP refused it (EINVAL, EIO: link down, …)
	DropTXDisabled                  // TX on a started but disabled ring: completed and discarded
	DropRXOffload                   // the TAP produced a frame kind the guest did not ack
	DropRXTruncated                 // the guest's chain(s) could not hold the frame
	DropRXTAP                       // the TAP read failed
	NumDrops
)

// dropNames are the reason labels of tapgro_dropped_total, whose direction label says
// which way (Drop.Dir): names the engine's drops share where the meaning is the same
// (malformed: the peer's header or frame failed validation; tap_error: the TAP refused
// the write or the read failed), vhost-user's own otherwise.
var dropNames = [NumDrops]string{"malformed", "not_negotiated", "runt", "too_long",
	"tap_error", "disabled", "offload_violation", "truncated", "tap_error"}

// IsRX says whether d is of the TAP → guest direction.
func (d Drop) IsRX() bool { return d >= DropRXOffload }

// Dir is d's direction label: port_to_tap (guest → TAP) or tap_to_port (TAP → guest),
// as the engine names them.
func (d Drop) Dir() string {
	if d.IsRX() {
		return "tap_to_port"
	}
	return "port_to_tap"
}

// String is d's reason label (with Dir, it names d uniquely).
func (d Drop) String() string {
	if d >= 0 && d < NumDrops {
		return dropNames[d]
	}
	return fmt.Sprintf("drop(%d)", int(d))
}

// Stats are the datapath counters, atomic, never reset. TX is guest → TAP, RX is TAP →
// guest; bytes are Ethernet bytes, the virtio-net header excluded. Kicks and calls are
// in BackendStats.
type Stats struct {
	TXFrames, TXBytes, TXGSO atomic.Uint64
	RXFrames, RXBytes, RXGSO atomic.Uint64
	RXChains                 atomic.Uint64 // RX descriptor chains used (num_buffers summed)
	// GSOSegmented counts TAP GSO frames cut into plain frames for a guest that cannot
	// take them whole (split.go); their segments count in RXFrames.
	GSOSegmented atomic.Uint64
	Drops        [NumDrops]atomic.Uint64
	// RXStalls counts the times the RX ring had too few buffers for the next frame, so
	// the worker stopped reading the TAP until the guest posted more and kicked.
	RXStalls atomic.Uint64
	// TXBlocked counts the times the TAP's send buffer was full (the batch ended and the
	// worker waited for the TAP).
	TXBlocked atomic.Uint64
	// TXHolds counts the holds TX workers took under bulk instead of waiting for a kick
	// (Config.TXHold).
	TXHolds atomic.Uint64
	// Linearized counts TX frames of more segments than one writev takes, copied.
	Linearized atomic.Uint64
	// GSOFallback counts guest GSO frames the TAP refused with EINVAL, sent again as
	// plain segments; TXSplit those of a kind the kernel refuses (its probe was refused
	// too), cut before the write (fallback.go).
	GSOFallback, TXSplit atomic.Uint64
	// WorkersLeft counts ring workers not joined at a ring's stop because they stayed
	// asleep in a write to an eventfd the front-end kept blocked (RingStopped).
	WorkersLeft atomic.Uint64
	// FeatureChanges counts SET_FEATURES applied to the TAP.
	FeatureChanges atomic.Uint64
	// Drains counts receive rings that handed the guest what they held before a
	// GET_VRING_BASE stopped them; RARPs the announcements put into the TAP after a
	// migration (migrate.go).
	Drains, RARPs atomic.Uint64
	// GRO are the counters of the engines that coalesce guest TCP segments toward the
	// TAP (gro.go), RSC those of the ones that coalesce TAP frames toward the guest
	// (rsc.go); the engines (one per ring worker) count into them across sessions.
	GRO, RSC coalescer.Stats
	// RXWaiting is 1 while an RX worker waits for the guest to post buffers, frames
	// waiting in the TAP; TXWaiting is 1 while a TX worker waits for the TAP to take a
	// frame (with several queue pairs: any worker). The health monitor watches them (a
	// wait that never ends is a stall).
	RXWaiting, TXWaiting atomic.Bool
	// Queues are the per-pair counters, index = queue pair; New sizes it.
	Queues []QueueStats
}

// QueueStats are one queue pair's counters: frames and Ethernet bytes each way (TX is
// the pair's TX ring → its TAP queue, RX its TAP queue → its RX ring), and whether its
// TAP queue is attached (the kernel steers frames to it).
type QueueStats struct {
	TXFrames, TXBytes atomic.Uint64
	RXFrames, RXBytes atomic.Uint64
	Attached          atomic.Bool
	// RXWaiting and TXWaiting are the pair's own share of Stats.RXWaiting/TXWaiting,
	// so a health monitor sees one stalled pair while the others move.
	RXWaiting, TXWaiting atomic.Bool
}

// Config is one TAP and what to offer its guest.
type Config struct {
	// TAP is an open TAP; Net switches its header length and read offloads per session.
	// One queue pair is offered.
	TAP TAP
	// TAPs, instead of TAP, are the queues of one multiqueue TAP (tapdev.OpenQueues),
	// one per queue pair offered: pair i's rings move frames through TAPs[i].
	TAPs []TAP
	// Stats and BackendStats may be shared with a metrics exporter; nil allocates.
	Stats        *Stats
	BackendStats *vhostuser.Stats
	// Log gets session ends and unusual events as warnings, routine ones (each
	// session's negotiated features) as info; nil: kvlog.Nop. It is the Backend's
	// Log too.
	Log kvlog.Logger
	// MTU is the TAP's MTU as configured (0: not known); a guest MTU that differs
	// (NET_SET_MTU) is logged.
	MTU int
	// Pcap is the capture writers' options; PcapPath a capture to start with ("": off).
	Pcap     pcapio.Options
	PcapPath string
	// PcapTapPath is a capture of the TAP's side to start with ("": off).
	PcapTapPath string

	// GRO coalesces MTU-sized TCP segments the guest sends into GSO packets for the TAP
	// (gro.go) and, for a guest that acked GUEST_TSO4/6 while the TAP hands MTU frames,
	// TCP segments from the TAP into GSO packets for the guest (rsc.go) (--gro).
	GRO bool
	// TimerFlush holds guest → TAP aggregates across TX batches for at most RSCInterval
	// (--gro-flush timer, --rsc-interval); otherwise each batch's end flushes them.
	TimerFlush  bool
	RSCInterval time.Duration
	// MaxFlows is each engine's flow table size (--gro-flows); 0: the engine's default.
	MaxFlows int
	// Offload caps the TAP's read offloads (--offload): nil or Auto, what the guest
	// acked to receive (TapOffloads); otherwise that ∩ Set (off: none, so the TAP hands
	// MTU frames). SetOffloads changes it at run time.
	Offload *vnethdr.Choice
	// UDPGRO coalesces equal-sized UDP datagrams the guest sends into UDP GSO packets
	// for the TAP as well (--udp-gro; needs GRO and a TAP that probed USO). SetUDPGRO
	// changes it at run time.
	UDPGRO bool

	// How the guest learns of used buffers. By default once per batch, when the driver
	// asks (EVENT_IDX or VRING_AVAIL_F_NO_INTERRUPT). PerFrame publishes every frame on
	// its own (--rx-batch off: the baseline to measure against); the call still goes at
	// the batch's end, since no eventfd write is made under a ring's lock
	// (vhostuser/signal.go).
	// CallInterval > 0 moderates the receive queues' calls under load to one per
	// interval (--call-interval; vhostuser.Vring.SetCallModeration says what load is
	// and why a call owed is never lost).
	PerFrame     bool
	CallInterval time.Duration
	// PollWindow > 0 makes each TX worker watch its ring for that long after its pair's
	// RX worker handed the guest frames, before it sleeps on the kick (--vhost-poll;
	// vhostuser/wait.go says why and what it costs).
	PollWindow time.Duration
	// TXHold > 0 has a TX worker that moved bulk sleep this long with kicks off before
	// its next batch, instead of waiting for the next kick (--tx-hold; tx.go).
	TXHold time.Duration

	// Peers, if not empty, is who may be the front-end (peer.go): a connection from
	// anyone else is closed before its first message is read.
	Peers Peers
	// MaxMapped and AnyFSMemory are vhostuser.Config's: the most a session may map, and
	// whether guest memory may come from files outside tmpfs and hugetlbfs.
	MaxMapped   uint64
	AnyFSMemory bool
}

// Net is the datapath between one TAP and one vhost-user-net device: one queue pair per
// TAP queue. It is the vhostuser.Handler of its Backend.
type Net struct {
	vhostuser.NopHandler
	pairs   []*queuePair
	backend *vhostuser.Backend
	stats   *Stats
	log     kvlog.Logger
	probed  vnethdr.Offloads
	mtu     int

	groOn atomic.Bool // coalescing (--gro, SetGRO): TX workers take it up per batch, RX through rscMode
	// tapKilled are the GSO kinds the kernel refuses on write (vnethdr.Offloads), and
	// groKilled says TCP's went with them (fallback.go): both sticky.
	tapKilled   atomic.Uint32
	groKilled   atomic.Bool
	timerFlush  bool
	rscInterval time.Duration
	maxFlows    int
	udpGRO      atomic.Bool // coalesce UDP toward the TAP too (--udp-gro, SetUDPGRO)

	perFrame     bool          // publish every frame (Config.PerFrame)
	callInterval time.Duration // receive queues' call moderation (Config.CallInterval)
	pollWindow   time.Duration // TX rings' poll window (Config.PollWindow)
	txHold       time.Duration // TX workers' hold under bulk (Config.TXHold)

	// capture records every frame that crosses, as the guest sent or received it
	// (--pcap-port, `tapgro ctl pcap port=…`); tapCap as the TAP took or handed it
	// (--pcap-tap, `tapgro ctl pcap tap=…`): they differ where GRO merged, RSC
	// coalesced, a frame was cut for the guest or split for the kernel.
	capture pcapio.Point
	tapCap  pcapio.Point
	pcapOpt pcapio.Options
	// acked is the last SET_FEATURES, for status (tapOffl the TAP offloads it set).
	acked    atomic.Uint64
	ackedOK  atomic.Bool
	tapOffl  atomic.Uint64
	guestMTU atomic.Int64

	// mu is held shared by every ring batch and exclusively to change the TAP's header
	// length and offloads, so that a change lands between batches.
	mu         sync.RWMutex
	tapHdr     int                // TAP vnet header length in effect (under mu)
	features   vhostuser.Features // the last SET_FEATURES (under mu)
	offload    vnethdr.Choice     // --offload, or the last SetOffloads (under mu)
	offloadCap vnethdr.Offloads   // TUNSETOFFLOAD never exceeds it (under mu)
	rxAllow    vnethdr.Offloads   // frame kinds the guest acked to receive (under mu)
	txAllow    vnethdr.Offloads   // frame kinds the guest acked to send (under mu)
	guestCsm   bool               // GUEST_CSUM acked (under mu)
	mrg        bool               // MRG_RXBUF acked (under mu)
	rscMode    bool               // RX coalesces TAP frames for the guest (rsc.go; under mu)
	rscECN     bool               // GUEST_ECN acked: RSC may emit GSO_ECN (under mu)

	wmu     sync.Mutex
	workers map[vhostuser.Queue]*worker

	// waitMu orders the updates of the shared wait flags from several workers.
	waitMu               sync.Mutex
	rxWaiters, txWaiters int

	// qmu serializes attaching and detaching TAP queues (queuePair.attached).
	qmu sync.Mutex

	serveMu sync.Mutex
	active  atomic.Pointer[activeConn]
	peers   Peers

	// gates keep what a front-end makes the Net log to a readable rate (peerLine).
	gates struct{ features, tapErr, mtu, rarp, ended, peer quietlog.Gate }
}

// peerLine writes to out (n.log.Warn or n.log.Info) a line a front-end's doing caused,
// through gate g (package quietlog): when key changes, or now and then, with the count
// of the lines left out meanwhile under "left_out".
func (n *Net) peerLine(g *quietlog.Gate, key string, out func(msg string, kv ...any), msg string, kv ...any) {
	ok, held := g.Pass(key)
	if !ok {
		return
	}
	if held > 0 {
		kv = append(kv, "left_out", held)
	}
	out(msg, kv...)
}

// queuePair is one queue pair's own state: its TAP queue and counters. Its workers are
// in Net.workers; everything else (features, header length, offloads, capture, the
// shared Stats) is the Net's.
type queuePair struct {
	index    int
	tap      TAP
	stats    *QueueStats
	attached bool // the TAP queue is attached (under Net.qmu)
	// tx is the pair's TX ring while it runs, for the RX worker's Poke (poll window);
	// rx its RX ring, for the TX worker's NoteLoad (call moderation).
	tx, rx atomic.Pointer[queueRef]
}

// queueRef holds a Queue for atomic.Pointer.
type queueRef struct{ q vhostuser.Queue }

// New checks cfg, probes the TAP's offloads and builds the Backend.
func New(cfg Config) (*Net, error) {
	taps := cfg.TAPs
	switch {
	case cfg.TAP != nil && len(taps) > 0:
		return nil, errors.New("vhostnet: give TAP or TAPs, not both")
	case cfg.TAP != nil:
		taps = []TAP{cfg.TAP}
	case len(taps) == 0:
		return nil, errors.New("vhostnet: a TAP is required")
	case len(taps) > 128:
		// 2·pairs rings must fit SET_VRING_KICK's 8-bit index (vhostuser.NewBackend).
		return nil, fmt.Errorf("vhostnet: %d TAP queues, at most 128 queue pairs", len(taps))
	}
	for _, t := range taps {
		if t == nil {
			return nil, errors.New("vhostnet: a nil TAP queue")
		}
	}
	n := &Net{stats: cfg.Stats, log: cfg.Log, mtu: cfg.MTU, pcapOpt: cfg.Pcap,
		workers: map[vhostuser.Queue]*worker{}}
	if n.stats == nil {
		n.stats = new(Stats)
	}
	n.peers = cfg.Peers
	n.timerFlush, n.rscInterval, n.maxFlows = cfg.TimerFlush, cfg.RSCInterval, cfg.MaxFlows
	n.groOn.Store(cfg.GRO)
	n.perFrame, n.callInterval, n.pollWindow, n.txHold = cfg.PerFrame, cfg.CallInterval, cfg.PollWindow, cfg.TXHold
	if n.timerFlush && n.rscInterval <= 0 {
		return nil, errors.New("vhostnet: TimerFlush needs an RSCInterval")
	}
	n.offload, n.offloadCap = vnethdr.Choice{Auto: true}, ^vnethdr.Offloads(0)
	if c := cfg.Offload; c != nil {
		n.offload = *c
		if !c.Auto {
			n.offloadCap = c.Set
		}
	}
	n.udpGRO.Store(cfg.UDPGRO)
	if n.log == nil {
		n.log = kvlog.Nop{}
	}
	if len(n.stats.Queues) != len(taps) {
		n.stats.Queues = make([]QueueStats, len(taps))
	}
	for i, t := range taps {
		n.pairs = append(n.pairs, &queuePair{index: i, tap: t, stats: &n.stats.Queues[i], attached: true})
		n.stats.Queues[i].Attached.Store(true)
	}
	// Offloads and the header length are the device's, not a queue's (drivers/net/tun.c:
	// set_offload acts on tun->dev, TUNSETVNETHDRSZ on tun->vnet_hdr_sz), so queue 0
	// speaks for all of them.
	n.probed = n.pairs[0].tap.ProbeOffloads()
	n.tapHdr = n.pairs[0].tap.VnetHdrLen()
	n.resetQueues()
	b, err := vhostuser.NewBackend(vhostuser.Config{
		Features:    n.offer(),
		Rings:       2 * len(n.pairs),
		QueueNum:    len(n.pairs), // QEMU net/vhost-user.c compares it with queues= (pairs)
		Writable:    isRX,
		HeaderLen:   hdrLenFor,
		NetMTU:      true,
		RARP:        n.sendRARP,
		Handler:     n,
		Stats:       cfg.BackendStats,
		Log:         n.log,
		MaxMapped:   cfg.MaxMapped,
		AnyFSMemory: cfg.AnyFSMemory,
	})
	if err != nil {
		return nil, err
	}
	n.backend = b
	if cfg.PcapPath != "" {
		if err := n.SetCapture(cfg.PcapPath); err != nil {
			return nil, err
		}
	}
	if cfg.PcapTapPath != "" {
		if err := n.SetTapCapture(cfg.PcapTapPath); err != nil {
			n.CloseCapture()
			return nil, err
		}
	}
	return n, nil
}

// Backend is the vhost-user back-end (for ServeConn-style use and its Stats).
func (n *Net) Backend() *vhostuser.Backend { return n.backend }

// HdrLen is the TAP's (and the guest's) virtio-net header length in effect.
func (n *Net) HdrLen() int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.tapHdr
}

// Stats are the datapath counters.
func (n *Net) Stats() *Stats { return n.stats }

// BackendStats are the protocol counters (messages, rejected chains, kicks, calls).
func (n *Net) BackendStats() *vhostuser.Stats { return n.backend.Stats() }

// worker is one ring's goroutine; q is its pair (the TAP queue it uses).
type worker struct {
	v     vhostuser.Queue
	q     *queuePair
	stop  atomic.Bool
	drain drainSlot // RingStopping's request (migrate.go)
	done  chan struct{}
}

// pair is ring v's queue pair: ring 2·i is pair i's RX, 2·i+1 its TX (virtio spec
// "Network Device / Virtqueues"). The Backend has exactly 2·len(pairs) rings, so the
// index is in range; nil otherwise, defensively.
func (n *Net) pair(v vhostuser.Queue) *queuePair {
	if i := v.Index() / 2; i >= 0 && i < len(n.pairs) {
		return n.pairs[i]
	}
	return nil
}

// RingStarted starts the ring's worker on its pair's TAP queue. An RX ring that starts
// enabled (no PROTOCOL_FEATURES: vhost-user.rst "Ring states") gets its queue attached.
func (n *Net) RingStarted(v vhostuser.Queue) {
	q := n.pair(v)
	if q == nil {
		return
	}
	if isRX(v.Index()) {
		// Only toward the guest's receive path. A TX completion held back holds back
		// a sender whose socket buffer waits for it: tried with the TCG guests
		// (benchtool -guests -before), a guest's UDP_SEGMENT sender lost 10-40 %.
		v.SetCallModeration(n.callInterval)
		q.rx.Store(&queueRef{v})
		if v.Enabled() {
			n.setAttached(q, true)
		}
	}
	w := &worker{v: v, q: q, done: make(chan struct{})}
	n.wmu.Lock()
	n.workers[v] = w
	n.wmu.Unlock()
	if isRX(v.Index()) {
		go n.rxLoop(w)
	} else {
		v.SetPollWindow(n.pollWindow)
		q.tx.Store(&queueRef{v})
		go n.txLoop(w)
	}
}

// RingStopped joins the ring's worker. The ring is already stopped (Wait and Begin
// return ErrStopped); a worker parked on the TAP is woken with a deadline in the past,
// cleared once it has returned.
func (n *Net) RingStopped(v vhostuser.Queue) {
	n.wmu.Lock()
	w := n.workers[v]
	delete(n.workers, v)
	n.wmu.Unlock()
	if w == nil {
		return
	}
	w.stop.Store(true)
	past := time.Unix(1, 0)
	tap := w.q.tap
	if isRX(v.Index()) {
		w.q.rx.Store(nil)
		tap.SetReadDeadline(past)
	} else {
		w.q.tx.Store(nil)
		tap.SetWriteDeadline(past)
	}
	select {
	case <-w.done:
	case <-time.After(joinLimit):
		// Only a write to an eventfd the front-end keeps blocked can hold a worker this
		// long: vhostuser unjams it meanwhile, but a front-end that fills the counter
		// again as fast as it is emptied can keep it asleep. The worker holds no lock
		// and, once the write returns, leaves at its next look at w.stop; the session
		// and the next one go on without it.
		n.stats.WorkersLeft.Add(1)
		n.log.Warn("vhostnet: a ring's worker did not return after the ring's stop (asleep in a write to an eventfd "+
			"the front-end keeps blocked); left behind", "ring", v.Index(), "waited", joinLimit)
	}
	if isRX(v.Index()) {
		tap.SetReadDeadline(time.Time{})
	} else {
		tap.SetWriteDeadline(time.Time{})
	}
}

// joinLimit bounds how long RingStopped waits for a ring's worker.
const joinLimit = 5 * time.Second

// VringEnabled maps SET_VRING_ENABLE of a pair's RX ring onto its TAP queue, as QEMU's
// own TAP back-end does (net/tap-linux.c tap_fd_enable/tap_fd_disable via
// hw/net/virtio-net.c peer_attach/peer_detach): a disabled pair's queue is detached, so
// the kernel steers its frames to the attached queues instead of into a queue no ring
// drains (drivers/net/tun.c tun_select_queue), and attached again on enable. QEMU
// enables and disables both rings of a pair together (hw/virtio/vhost-user.c
// vhost_user_set_vring_enable); the TX ring's state needs no TAP change, since TX on a
// disabled ring is discarded before the TAP.
func (n *Net) VringEnabled(v vhostuser.Queue, on bool) {
	if q := n.pair(v); q != nil && isRX(v.Index()) {
		n.setAttached(q, on)
	}
}

// setAttached attaches or detaches q's TAP queue (TUNSETQUEUE). A single-queue TAP has
// no queue to detach (tun_set_queue refuses it without IFF_MULTI_QUEUE): with one pair
// the queue stays attached and a disabled RX ring simply leaves frames in the TAP.
func (n *Net) setAttached(q *queuePair, on bool) {
	if len(n.pairs) < 2 {
		return
	}
	n.qmu.Lock()
	defer n.qmu.Unlock()
	if q.attached == on {
		return
	}
	if err := q.tap.SetQueueEnabled(on); err != nil {
		n.log.Warn("vhostnet: a queue pair's TAP queue could not be attached or detached",
			"pair", q.index, "attach", on, "error", err)
		return
	}
	q.attached = on
	q.stats.Attached.Store(on)
}

// resetQueues puts the TAP queues in their state between sessions: pair 0's attached,
// the others detached. A vhost-user ring starts disabled once PROTOCOL_FEATURES is acked
// (vhost-user.rst "Ring states") and QEMU enables the pairs the guest uses; until then
// (and while no front-end is connected) frames wait in the one queue every front-end
// uses, as with a single-queue TAP.
func (n *Net) resetQueues() {
	for _, q := range n.pairs {
		n.setAttached(q, q.index == 0)
	}
}

// setWaiting raises or lowers one direction's wait (RX: for guest buffers with frames
// in the TAP; TX: for the TAP to take a frame) for pair q and for the whole port.
func (n *Net) setWaiting(q *queuePair, rx, on bool) {
	d := -1
	if on {
		d = 1
	}
	if rx {
		q.stats.RXWaiting.Store(on)
	} else {
		q.stats.TXWaiting.Store(on)
	}
	n.waitMu.Lock()
	if rx {
		n.rxWaiters += d
		n.stats.RXWaiting.Store(n.rxWaiters > 0)
	} else {
		n.txWaiters += d
		n.stats.TXWaiting.Store(n.txWaiters > 0)
	}
	n.waitMu.Unlock()
}

// SetMTU takes NET_SET_MTU: the MTU QEMU advises the guest (-device …,host_mtu=N). It
// is always accepted — refusing it makes QEMU fail vhost_net_start and leaves the guest
// a NIC that carries nothing (hw/net/virtio-net.c virtio_net_vhost_status) — and a
// difference from the TAP's MTU is logged: the TAP takes frames larger than its MTU
// (drivers/net/tun.c tun_get_user checks no MTU), but the host sends the guest nothing
// larger than the TAP's MTU, so the two directions would differ.
func (n *Net) SetMTU(mtu int) error {
	n.guestMTU.Store(int64(mtu))
	if n.mtu != 0 && mtu != n.mtu {
		n.peerLine(&n.gates.mtu, fmt.Sprint(mtu), n.log.Warn,
			"vhostnet: the guest's MTU differs from the TAP's: give tapgro --mtu <guest_mtu> or the NIC host_mtu=<tap_mtu>",
			"guest_mtu", mtu, "tap_mtu", n.mtu)
	}
	return nil
}

// SessionEnded logs the end of a session, forgets its features and puts the TAP queues
// back in their state between sessions (every ring is stopped by now).
func (n *Net) SessionEnded(err error) {
	n.ackedOK.Store(false)
	n.guestMTU.Store(0)
	n.resetQueues()
	if err != nil {
		n.peerLine(&n.gates.ended, quietlog.Key(err.Error()), n.log.Warn, "vhostnet: session ended", "error", err)
	}
}

// SetCapture starts capture of the frames the guest sends and receives into path,
// moves it, or stops it (path ""). Frames are recorded as the guest sees them, GSO
// frames whole and the virtio-net header left out (pcapio).
func (n *Net) SetCapture(path string) error { return n.capture.Set(path, n.pcapOpt) }

// SetTapCapture is SetCapture for the TAP's side: each frame as the TAP took or handed
// it.
func (n *Net) SetTapCapture(path string) error { return n.tapCap.Set(path, n.pcapOpt) }

// ReopenCapture rotates the live capture files (SIGHUP).
func (n *Net) ReopenCapture() error {
	return errors.Join(n.capture.Reopen(), n.tapCap.Reopen())
}

// CloseCapture stops capture on both sides, flushing the files.
func (n *Net) CloseCapture() error {
	return errors.Join(n.capture.Set("", n.pcapOpt), n.tapCap.Set("", n.pcapOpt))
}

// Capture is the port side's capture point (its state and counters), TapCapture the
// TAP side's.
func (n *Net) Capture() *pcapio.Point    { return &n.capture }
func (n *Net) TapCapture() *pcapio.Point { return &n.tapCap }

// State is what the operator surfaces show of the device: whether a front-end is
// connected, the features its guest acked (valid: SET_FEATURES came in this session),
// the TAP offloads they set, the header length and the guest's MTU (0: not told).
type State struct {
	Connected   bool
	Acked       vhostuser.Features
	AckedValid  bool
	Offered     uint64
	TapOffloads vnethdr.Offloads
	TapProbed   vnethdr.Offloads
	GuestMTU    int
	// QueuePairs offered, and which of their TAP queues are attached.
	QueuePairs int
	Attached   []bool
}

// State reads the device's state.
func (n *Net) State() State {
	return State{
		Connected:   n.active.Load() != nil,
		Acked:       vhostuser.Features{Bits: n.acked.Load(), HdrLen: n.HdrLen()},
		AckedValid:  n.ackedOK.Load(),
		Offered:     n.offer(),
		TapOffloads: vnethdr.Offloads(n.tapOffl.Load()),
		TapProbed:   n.probed,
		GuestMTU:    int(n.guestMTU.Load()),
		QueuePairs:  len(n.pairs),
		Attached:    n.attachedQueues(),
	}
}

func (n *Net) attachedQueues() []bool {
	a := make([]bool, len(n.pairs))
	for i, q := range n.pairs {
		a[i] = q.stats.Attached.Load()
	}
	return a
}
