package datapath

import (
	"fmt"
	"strings"

	"tapgro/port"
	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// Offload negotiation: tapgro's core plays the part virtio-net plays in QEMU
// (hw/net/virtio-net.c virtio_net_get_features and virtio_net_apply_guest_offloads ask
// the peer through NetClientInfo's offload callbacks). It asks each side what it can
// carry and accept and decides what the TAP may hand us (TUNSETOFFLOAD) and, per
// direction, which software steps run. negotiate is a pure function of its inputs so
// every combination is table-tested; New calls it at start and the supervisor again on
// every (re)connect (portConnected), because the peer's capabilities change with the
// peer.
//
// The datapath does not depend on the steps for correctness: it decides per frame
// (tapToPort.process, portToTap.run, tapWriter.write) whether the far side accepts that
// frame's header, so frames read under an older TAP setting are still handled right.
// The steps describe what will happen, for the log line, the metrics and `tapgro ctl`.

var _ port.Backend = (*tapdev.Device)(nil)

// AutoOffloads (--offload auto) is every TAP read offload tapgro can finish in software for any port:
// one 64 KB read replaces ~45 MTU reads, and splitting in userspace costs less than the
// read syscalls it saves. UFO is absent: the kernel accepts TUN_F_UFO and has ignored it
// since Linux 4.14 (drivers/net/tun.c set_offload).
const AutoOffloads = vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 |
	vnethdr.OffloadTSOECN | vnethdr.OffloadUSO

// capsOf reads a connected port's capabilities. What it may hand us is learnt by
// asking for everything tapgro can take (SetOffloads), as virtio-net asks its peer.
func capsOf(p port.Port) port.Caps {
	be := port.BackendOf(p)
	c := port.Caps{State: be.State(), HdrLen: be.VnetHdrLen(), Accepts: be.Accepts()}
	if c.HdrLen > 0 {
		c.Emits, _ = be.SetOffloads(AutoOffloads | vnethdr.OffloadUFO)
	}
	return c
}

// negInput is everything negotiation depends on.
type negInput struct {
	TapProbed vnethdr.Offloads // read offloads the kernel takes (tapdev ProbeOffloads)
	TapHdrLen int              // the TAP's vnet header length (10 or 12)
	TapWrite  vnethdr.Offloads // what the TAP takes on write (tapdev Accepts), minus offloads a kernel refused
	Choice    vnethdr.Choice   // --offload (or `tapgro ctl offload`)
	Port      port.Caps
	GRO       bool // --gro, and not killed by a refused GSO write
	UDPGRO    bool // --udp-gro
}

// Step is one piece of software work (or its absence) in one direction.
type Step uint16

const (
	// StepPassthrough: frames with a GSO or partial-checksum header go on whole, with
	// their header (the far side accepts them).
	StepPassthrough Step = 1 << iota
	// StepSplit: GSO frames of some kind the far side cannot take are segmented in
	// software (vnethdr.Split; CWR only on the first segment, so ECN is handled).
	StepSplit
	// StepCsum: partial checksums the far side cannot take are completed in software.
	StepCsum
	// StepHdrConvert: the header is rewritten between 10 and 12 bytes (num_buffers 0).
	StepHdrConvert
	// StepGRO: plain TCP segments are coalesced into GSO packets (port→TAP only).
	StepGRO
	// StepUDPGRO: plain UDP datagrams are coalesced into UDP_L4 GSO packets.
	StepUDPGRO
)

// StepNames lists every step with its name, in the order String prints them.
var StepNames = [...]struct {
	Step Step
	Name string
}{
	{StepPassthrough, "passthrough"}, {StepSplit, "split"}, {StepCsum, "csum"},
	{StepHdrConvert, "hdr_convert"}, {StepGRO, "gro"}, {StepUDPGRO, "udp_gro"},
}

// String is "passthrough+gro"; "plain" when frames only get copied.
func (s Step) String() string {
	var parts []string
	for _, n := range StepNames {
		if s&n.Step != 0 {
			parts = append(parts, n.Name)
		}
	}
	if len(parts) == 0 {
		return "plain"
	}
	return strings.Join(parts, "+")
}

// Negotiation is the outcome.
type Negotiation struct {
	TapOffloads vnethdr.Offloads // the TUNSETOFFLOAD mask to set
	TapWrite    vnethdr.Offloads // what frames to the TAP may carry
	Port        port.Caps
	T2P, P2T    Step
}

// String is the one info line: `tap offloads=csum,tso4,tso6 port=stream(...)
// tap->port=passthrough port->tap=passthrough+gro`.
func (n *Negotiation) String() string {
	return fmt.Sprintf("tap offloads=%s port=%s tap->port=%s port->tap=%s", n.TapOffloads, n.Port.State, n.T2P, n.P2T)
}

// negotiate decides the TAP's read offloads and the software steps of both directions.
func negotiate(in negInput) Negotiation {
	n := Negotiation{Port: in.Port, TapWrite: in.TapWrite}
	port := in.Port

	// What the TAP may hand us: the choice, within what the kernel takes. UFO is
	// ignored by the kernel and never worth asking for.
	want := in.Choice.Set
	if in.Choice.Auto {
		want = AutoOffloads
	}
	want &= in.TapProbed &^ vnethdr.OffloadUFO
	// ECN-marked GSO frames only when the port takes them whole, or when tapgro splits
	// TCP GSO for this port anyway (Split keeps CWR on the first segment only). A port
	// that takes TSO but not TSO_ECN would otherwise force a split of exactly the
	// frames of flows under congestion; the kernel segments those itself instead.
	if port.Accepts&(vnethdr.OffloadTSO4|vnethdr.OffloadTSO6) != 0 && port.Accepts&vnethdr.OffloadTSOECN == 0 {
		want &^= vnethdr.OffloadTSOECN
	}
	n.TapOffloads = want.Normalize()

	// The steps follow from the same rule the datapath applies to each frame
	// (Offloads.AcceptsFrame, through Partition): a kind of frame the sender may produce
	// passes whole when the receiver accepts it, else a GSO kind is split and a partial
	// checksum completed. steps_test.go runs frames of every kind through both pipelines
	// to hold the two to each other.

	// TAP → port.
	whole, refused := portAccepts(port.HdrLen, port.Accepts).Partition(n.TapOffloads)
	n.T2P |= kindSteps(whole, refused)
	if port.HdrLen > 0 && port.HdrLen != in.TapHdrLen {
		n.T2P |= StepHdrConvert
	}

	// Port → TAP: what the TAP takes on write (partial checksums always, tapTakes); GSO
	// kinds it refuses are split before the write.
	if port.HdrLen > 0 {
		n.P2T |= kindSteps(tapTakes(in.TapWrite).Partition(port.Emits))
		if port.Emits&vnethdr.OffloadUFO != 0 {
			// A peer that may send UFO (a VALE port, by QEMU's rule that a netmap port
			// with a header has UFO, net/netmap.c) is announced as split, as before; a
			// UFO frame that does arrive is dropped by vnethdr.ValidatePeer as
			// unsupported (no kernel since 4.14 builds one, drivers/net/tun.c set_offload).
			n.P2T |= StepSplit
		}
		if port.HdrLen != in.TapHdrLen {
			n.P2T |= StepHdrConvert
		}
	}
	if in.GRO {
		n.P2T |= StepGRO
		if in.UDPGRO && in.TapWrite&vnethdr.OffloadUSO == vnethdr.OffloadUSO {
			n.P2T |= StepUDPGRO
		}
	}
	return n
}

// kindSteps are the steps of one direction given which kinds of frame pass whole and
// which are refused (vnethdr.Offloads.Partition): passthrough for any kind passed whole,
// split for a refused GSO kind, csum for a refused partial checksum.
func kindSteps(whole, refused vnethdr.Offloads) Step {
	var s Step
	if whole != 0 {
		s |= StepPassthrough
	}
	if refused&^vnethdr.OffloadCSUM != 0 {
		s |= StepSplit
	}
	if refused&vnethdr.OffloadCSUM != 0 {
		s |= StepCsum
	}
	return s
}
