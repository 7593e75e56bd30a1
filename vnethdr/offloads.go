package vnethdr

import "strings"

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
	if h.Flags&FlagNeedsCsum != 0 && o&OffloadCSUM == 0 {
		return false
	}
	if h.GSOType&GSOECN != 0 && o&OffloadTSOECN == 0 {
		return false
	}
	switch h.GSOType &^ GSOECN {
	case GSONone:
		return true
	case GSOTCPv4:
		return o&OffloadTSO4 != 0
	case GSOTCPv6:
		return o&OffloadTSO6 != 0
	case GSOUDPL4:
		return o&OffloadUSO == OffloadUSO
	}
	return false
}
