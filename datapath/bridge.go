package datapath

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"tapgro/coalescer"
	"tapgro/port"
	"tapgro/rxpool"
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
//
// This file is what both pipelines share: the bridge, its configuration and counters,
// and the connected port as the TAP→port goroutine sees it (portRef). Each stage has
// its own file: tap_to_port.go (read the TAP, decide, stage), tap_to_port_split.go
// (segment GSO frames), tap_to_port_flush.go (deliver to the port), port_to_tap.go
// (read the port, feed the GRO engine), tap_writer.go (write to the TAP), and
// bridge_vnet.go (what only ports carrying a vnet header need).

// dirStats counts one direction. Drops are split by reason so an operator can tell a
// missing peer from a malformed frame from a kernel refusal.
type dirStats struct {
	Frames  atomic.Uint64 // frames delivered to the far side
	Bytes   atomic.Uint64
	Batches atomic.Uint64 // read batches processed
	Reads   atomic.Uint64 // frames read from the near side

	Drops [NumDrops]atomic.Uint64 // by Drop reason (engine.go)

	GSOFallback  atomic.Uint64 // port→TAP: GSO writes refused with EINVAL and re-sent segmented
	GSOSegmented atomic.Uint64 // GSO frames split in software (TAP→port: for the port; port→TAP: kinds the TAP refuses)
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
	// With shm: the smallest frame sent through the ring and the length of the
	// descriptor sent instead (ShmSender.ShmMinFrame, ShmDescLen).
	shmMin, shmDesc int
}

func newPortRef(p port.Port) *portRef {
	r := &portRef{p: p, hdrLen: p.VnetHdrLen()}
	r.accepts = portAccepts(r.hdrLen, p.Accepts())
	if s, ok := p.(port.ShmSender); ok && s.ShmActive() {
		r.shm, r.shmMin, r.shmDesc = s, s.ShmMinFrame(), s.ShmDescLen()
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
