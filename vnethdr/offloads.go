package vnethdr

import (
	"errors"
	"fmt"
	"strings"
)

// Offloads is a set of receive offloads, encoded with the TUN_F_* bit values so a mask can
// be handed to TUNSETOFFLOAD unchanged (TUN_F_* in include/uapi/linux/if_tun.h). On a
// backend it names what that backend may be handed: partial checksums (CSUM) and which GSO
// super-frames.
type Offloads uint32

const (
	OffloadCSUM   Offloads = 0x01 // TUN_F_CSUM: NEEDS_CSUM frames.
	OffloadTSO4   Offloads = 0x02 // TUN_F_TSO4
	OffloadTSO6   Offloads = 0x04 // TUN_F_TSO6
	OffloadTSOECN Offloads = 0x08 // TUN_F_TSO_ECN: GSO frames with GSOECN.
	OffloadUFO    Offloads = 0x10 // TUN_F_UFO: accepted and ignored by the kernel since 4.14.
	OffloadUSO4   Offloads = 0x20 // TUN_F_USO4 (Linux 6.2+, only together with USO6).
	OffloadUSO6   Offloads = 0x40 // TUN_F_USO6

	// OffloadUSO is the pair the kernel insists on setting together.
	OffloadUSO = OffloadUSO4 | OffloadUSO6
)

var offloadNames = [...]struct {
	bit  Offloads
	name string
}{
	{OffloadCSUM, "csum"}, {OffloadTSO4, "tso4"}, {OffloadTSO6, "tso6"},
	{OffloadTSOECN, "tso_ecn"}, {OffloadUFO, "ufo"}, {OffloadUSO4, "uso4"}, {OffloadUSO6, "uso6"},
}

// String lists the set as "csum,tso4,tso6" ("none" when empty).
func (o Offloads) String() string {
	if o == 0 {
		return "none"
	}
	var b strings.Builder
	for _, n := range offloadNames {
		if o&n.bit != 0 {
			if b.Len() > 0 {
				b.WriteByte(',')
			}
			b.WriteString(n.name)
		}
	}
	return b.String()
}

// AcceptsFrame reports whether a backend that accepts o can be handed a frame carrying h
// unchanged; otherwise the frame must be segmented and/or checksummed in software first.
func (o Offloads) AcceptsFrame(h *Hdr) bool {
	need, ok := h.Needs()
	return ok && o&need == need
}

// Needs returns the offloads a receiver must accept to be handed a frame with header h
// unchanged — CSUM for NEEDS_CSUM, TSO_ECN for the ECN bit, TSO4, TSO6 or the USO pair
// for the GSO type (the TUN_F_* bit each gso_type needs in drivers/net/tun.c
// set_offload) — and false for a gso_type no offload admits (UFO, unknown values).
func (h *Hdr) Needs() (Offloads, bool) {
	var need Offloads
	if h.Flags&FlagNeedsCsum != 0 {
		need |= OffloadCSUM
	}
	if h.GSOType&GSOECN != 0 {
		need |= OffloadTSOECN
	}
	switch h.GSOType &^ GSOECN {
	case GSONone:
	case GSOTCPv4:
		need |= OffloadTSO4
	case GSOTCPv6:
		need |= OffloadTSO6
	case GSOUDPL4:
		need |= OffloadUSO
	default:
		return 0, false
	}
	return need, true
}

// Kind is one kind of frame a sender may hand over with a virtio_net_hdr, named by the
// offload that lets a sender produce it (CSUM for a partial checksum, TSO4, TSO6,
// TSO_ECN, USO for GSO kinds), with a header of that kind. GSO headers carry
// NEEDS_CSUM: the kernel builds them from CHECKSUM_PARTIAL skbs
// (include/linux/virtio_net.h virtio_net_hdr_from_skb), and the virtio spec requires it.
type Kind struct {
	Offload Offloads
	Hdr     Hdr
}

// kinds are all the kinds; TSO_ECN comes once per IP version. UFO is none: no current
// kernel produces it (drivers/net/tun.c set_offload) and AcceptsFrame accepts it nowhere.
var kinds = [...]Kind{
	{OffloadCSUM, Hdr{Flags: FlagNeedsCsum}},
	{OffloadTSO4, Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv4}},
	{OffloadTSO6, Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv6}},
	{OffloadTSOECN, Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv4 | GSOECN}},
	{OffloadTSOECN, Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv6 | GSOECN}},
	{OffloadUSO, Hdr{Flags: FlagNeedsCsum, GSOType: GSOUDPL4}},
}

// Kinds returns every kind of frame with a header that carries an offload.
func Kinds() [len(kinds)]Kind { return kinds }

// Sends reports whether a sender whose offload set is o may hand over a frame of kind k:
// exactly when it would accept that frame itself, since TUNSETOFFLOAD is the reader
// telling the TAP what it accepts (drivers/net/tun.c set_offload), and what a backend
// advertises it may receive is what its peer may send.
func (o Offloads) Sends(k *Kind) bool { return o.AcceptsFrame(&k.Hdr) }

// Partition sorts the kinds of frame a sender with offload set sent may produce by what
// a receiver accepting o must do with them, by the same rule AcceptsFrame applies to each
// frame: whole are the kinds it takes unchanged; refused the others, which are split
// (GSO kinds) or checksummed (CSUM) first. A bit may be in both: TSO_ECN with TSO4 taken
// and TSO6 refused, say. Negotiation plans with this; the datapath asks AcceptsFrame.
func (o Offloads) Partition(sent Offloads) (whole, refused Offloads) {
	for i := range kinds {
		k := &kinds[i]
		switch {
		case !sent.Sends(k):
		case o.AcceptsFrame(&k.Hdr):
			whole |= k.Offload
		default:
			refused |= k.Offload
		}
	}
	return whole, refused
}

// Normalize drops the bits whose prerequisites are missing, exactly as the kernel would
// refuse them (drivers/net/tun.c set_offload, set by TUNSETOFFLOAD): nothing without
// CSUM, TSO_ECN only with TSO4 or TSO6, USO4 and USO6 only as a pair. Bits tapgro does
// not know (e.g. the UDP-tunnel bits of Linux 6.17) go too: set_offload fails the whole
// call with EINVAL on a bit the running kernel does not know. It is the one statement of that rule: the TAP applies it before TUNSETOFFLOAD,
// negotiation before it plans, and ParseChoice refuses what it would silently drop.
func (o Offloads) Normalize() Offloads {
	o &= OffloadCSUM | OffloadTSO4 | OffloadTSO6 | OffloadTSOECN | OffloadUFO | OffloadUSO
	if o&OffloadCSUM == 0 {
		return 0
	}
	if o&(OffloadTSO4|OffloadTSO6) == 0 {
		o &^= OffloadTSOECN
	}
	if o&OffloadUSO != OffloadUSO {
		o &^= OffloadUSO
	}
	return o
}

// OffloadByName looks up one offload by the name String prints, or by the ethtool-style
// aliases "ecn" (tso_ecn) and "uso" (the USO pair). Flags, the environment and the
// control socket all name offloads through it.
func OffloadByName(name string) (Offloads, bool) {
	switch name {
	case "ecn":
		return OffloadTSOECN, true
	case "uso":
		return OffloadUSO, true
	case "uso4", "uso6":
		// One half of a pair the kernel sets only whole is not a choice anyone can make.
		return 0, false
	}
	for _, n := range offloadNames {
		if n.name == name {
			return n.bit, true
		}
	}
	return 0, false
}

// Choice is an operator's choice of the TAP's read offloads (--offload, TAPGRO_OFFLOAD,
// `tapgro ctl offload`): Auto (everything the kernel accepts that tapgro can finish in
// software), or an explicit Set (0 is "off").
type Choice struct {
	Auto bool
	Set  Offloads
}

// String is "auto", "off" or the list.
func (c Choice) String() string {
	if c.Auto {
		return "auto"
	}
	if c.Set == 0 {
		return "off"
	}
	return c.Set.String()
}

// ErrNeedsCsum is ParseChoice's error for a list without csum.
var ErrNeedsCsum = errors.New("every offload needs csum as well (the kernel rejects TSO/USO without TUN_F_CSUM)")

// ParseChoice parses "auto", "off" (or "none") or a comma-separated list of offload names
// (OffloadByName). A list must include csum: the kernel processes no other bit without it,
// and refusing here beats a silently smaller mask from TUNSETOFFLOAD later.
func ParseChoice(s string) (Choice, error) {
	switch s {
	case "auto", "":
		return Choice{Auto: true}, nil
	case "off", "none":
		return Choice{}, nil
	}
	var set Offloads
	for _, name := range strings.Split(s, ",") {
		bit, ok := OffloadByName(strings.TrimSpace(name))
		if !ok {
			return Choice{}, fmt.Errorf("unknown offload %q (want auto, off, or a list of csum,tso4,tso6,tso_ecn,uso,ufo)", name)
		}
		set |= bit
	}
	if set&OffloadCSUM == 0 {
		return Choice{}, ErrNeedsCsum
	}
	return Choice{Set: set}, nil
}
