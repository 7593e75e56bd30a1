package vnethdr

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// EtherTypes and IP protocol numbers ParseLayout understands.
const (
	EtherTypeIPv4   = 0x0800
	EtherTypeIPv6   = 0x86dd
	EtherTypeVLAN   = 0x8100 // 802.1Q C-tag
	EtherTypeQinQ   = 0x88a8 // 802.1ad S-tag
	ProtoTCP        = 6
	ProtoUDP        = 17
	ethHdrLen       = 14
	vlanTagLen      = 4
	ipv4MinHdrLen   = 20
	ipv6HdrLen      = 40
	tcpMinHdrLen    = 20
	udpHdrLen       = 8
	ipv6ExtHopByHop = 0
	ipv6ExtRouting  = 43
	ipv6ExtFragment = 44
	ipv6ExtDstOpts  = 60
)

// ErrNotIP means the frame is a well-formed Ethernet frame whose EtherType (after at most
// one VLAN tag) is neither IPv4 nor IPv6: ARP, LLDP, a second (QinQ) tag, … The caller
// passes it on untouched. It is a plain sentinel (no numbers, no allocation) because such
// frames are routine; Layout.EtherType holds the type that was found.
var ErrNotIP = errors.New("vnethdr: not an IPv4/IPv6 frame")

// ErrMalformed wraps every ParseLayout error about a frame whose headers are truncated or
// inconsistent (the message names the numbers). The caller drops the frame and counts it
// when it came from a peer; a GRO engine may instead pass it through unmerged.
var ErrMalformed = errors.New("vnethdr: malformed frame")

// Layout locates the headers of an Ethernet frame. Every offset counts from the first
// byte of the Ethernet header (not from a virtio_net_hdr), so Layout.L4Off is the value a
// correct virtio_net_hdr carries in csum_start (virtio spec, "Packet Transmission").
type Layout struct {
	// EtherType is the type after the (optional) VLAN tag.
	EtherType uint16
	// VLAN is true when one 802.1Q or 802.1ad tag follows the MAC addresses.
	VLAN bool
	// IPv6 distinguishes the two IP versions (EtherType says the same).
	IPv6 bool
	// Fragment is true for an IPv4 fragment (MF set or offset non-zero) or an IPv6 packet
	// carrying a Fragment header. Fragments are never segmentable or coalescable, and
	// their L4 header is not parsed (a non-first fragment has none).
	Fragment bool
	// Routed is true when an IPv6 Routing header still has Segments Left > 0: the L4
	// pseudo-header then uses the final destination from the Routing header, not the
	// IPv6 destination address (RFC 8200 §8.1), so the checksum cannot be computed from
	// the IPv6 header alone.
	Routed bool
	// L4Proto is the IPv4 protocol or the IPv6 next header after the walked extension
	// headers (or the one named by a Fragment header).
	L4Proto uint8
	// L3Off is where the IP header starts: 14, or 18 with a VLAN tag.
	L3Off int
	// L4Off is where the L4 header starts (after IPv4 options / IPv6 extension headers).
	L4Off int
	// PayloadOff is where the L4 payload starts: L4Off + TCP data offset × 4 or + 8 for
	// UDP. For fragments and protocols other than TCP/UDP it equals L4Off.
	PayloadOff int
	// End is where the IP packet ends as stated by the IP header (IPv4 total length, IPv6
	// 40 + payload length). frame[End:] is link-layer padding and belongs to no segment.
	End int
}

// HdrLen is the number of header bytes every segment of the frame replicates: the
// re-derived value of virtio_net_hdr.hdr_len (which itself is only a hint unless
// VIRTIO_NET_F_GUEST_HDRLEN was negotiated, virtio spec).
func (l *Layout) HdrLen() int { return l.PayloadOff }

// PayloadLen is the number of L4 payload bytes (0 for a pure ACK).
func (l *Layout) PayloadLen() int { return l.End - l.PayloadOff }

// IsTCP reports a parsed, unfragmented TCP segment.
func (l *Layout) IsTCP() bool { return l.L4Proto == ProtoTCP && !l.Fragment }

// IsUDP reports a parsed, unfragmented UDP datagram.
func (l *Layout) IsUDP() bool { return l.L4Proto == ProtoUDP && !l.Fragment }

// ParseLayout locates the Ethernet, IP and TCP/UDP headers of frame. It reads only
// headers, never writes, and allocates nothing unless it returns an ErrMalformed error.
//
// What it validates (and so what callers may rely on when err == nil):
//   - Ethernet: ≥ 14 bytes; one 802.1Q/802.1ad tag is skipped (needs ≥ 18 bytes). Any
//     other EtherType returns ErrNotIP with EtherType, VLAN and L3Off filled in.
//   - IPv4: version nibble 4, IHL ≥ 5 (options are allowed and skipped), IHL×4 ≤ total
//     length ≤ bytes available from L3Off. MF/fragment offset set Fragment.
//     The header checksum is NOT verified (see IPv4HeaderChecksumValid).
//   - IPv6: version nibble 6, 40 + payload length ≤ bytes available. Hop-by-Hop,
//     Routing and Destination Options headers are walked, each entirely within End;
//     a Fragment header (8 bytes, within End) stops the walk and sets Fragment.
//     Payload length 0 (jumbogram) is treated literally, so its extension headers do not
//     fit and it is reported malformed.
//   - TCP (not a fragment): 20 bytes within End, data offset 5..15, data offset × 4
//     within End. UDP (not a fragment): 8 bytes within End; the UDP length field is NOT
//     checked (GSO super-frames may not carry a meaningful one; callers that need it
//     compare it with End-L4Off). Other protocols: L4 header not examined.
//   - Nothing about L4 checksums, ports, flags or addresses is checked.
//
// So for a result with err == nil: L3Off < L4Off ≤ PayloadOff ≤ End ≤ len(frame).
func ParseLayout(frame []byte) (Layout, error) {
	var l Layout
	if len(frame) < ethHdrLen {
		return l, malformed("frame of %d bytes is shorter than an Ethernet header (%d)", len(frame), ethHdrLen)
	}
	l.L3Off = ethHdrLen
	l.EtherType = binary.BigEndian.Uint16(frame[12:])
	if l.EtherType == EtherTypeVLAN || l.EtherType == EtherTypeQinQ {
		if len(frame) < ethHdrLen+vlanTagLen {
			return l, malformed("VLAN-tagged frame of %d bytes is shorter than %d", len(frame), ethHdrLen+vlanTagLen)
		}
		l.VLAN = true
		l.L3Off += vlanTagLen
		l.EtherType = binary.BigEndian.Uint16(frame[16:])
	}
	var err error
	switch l.EtherType {
	case EtherTypeIPv4:
		err = l.parseIPv4(frame)
	case EtherTypeIPv6:
		err = l.parseIPv6(frame)
	default:
		return l, ErrNotIP
	}
	if err != nil {
		return l, err
	}
	return l, l.parseL4(frame)
}

func (l *Layout) parseIPv4(frame []byte) error {
	avail := len(frame) - l.L3Off
	if avail < ipv4MinHdrLen {
		return malformed("IPv4 header at %d needs %d bytes, frame has %d", l.L3Off, ipv4MinHdrLen, avail)
	}
	ip := frame[l.L3Off:]
	if v := ip[0] >> 4; v != 4 {
		return malformed("IPv4 EtherType but IP version %d", v)
	}
	ihl := int(ip[0]&0x0f) * 4
	if ihl < ipv4MinHdrLen {
		return malformed("IPv4 IHL %d bytes is below %d", ihl, ipv4MinHdrLen)
	}
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if total < ihl || total > avail {
		return malformed("IPv4 total length %d outside [IHL %d, %d bytes available]", total, ihl, avail)
	}
	fragField := binary.BigEndian.Uint16(ip[6:])
	l.Fragment = fragField&0x2000 != 0 || fragField&0x1fff != 0 // MF or offset
	l.L4Proto = ip[9]
	l.L4Off = l.L3Off + ihl
	l.End = l.L3Off + total
	return nil
}

func (l *Layout) parseIPv6(frame []byte) error {
	l.IPv6 = true
	avail := len(frame) - l.L3Off
	if avail < ipv6HdrLen {
		return malformed("IPv6 header at %d needs %d bytes, frame has %d", l.L3Off, ipv6HdrLen, avail)
	}
	ip := frame[l.L3Off:]
	if v := ip[0] >> 4; v != 6 {
		return malformed("IPv6 EtherType but IP version %d", v)
	}
	plen := int(binary.BigEndian.Uint16(ip[4:]))
	if ipv6HdrLen+plen > avail {
		return malformed("IPv6 payload length %d exceeds the %d bytes available", plen, avail-ipv6HdrLen)
	}
	l.End = l.L3Off + ipv6HdrLen + plen
	nh := ip[6]
	off := l.L3Off + ipv6HdrLen
	// Every extension header is at least 8 bytes, so this loop runs at most
	// 65535/8 times even on hostile input.
	for {
		switch nh {
		case ipv6ExtHopByHop, ipv6ExtRouting, ipv6ExtDstOpts:
			if l.End-off < 8 {
				return malformed("IPv6 extension header %d at %d needs 8 bytes, %d left", nh, off, l.End-off)
			}
			n := (int(frame[off+1]) + 1) * 8
			if n > l.End-off {
				return malformed("IPv6 extension header %d at %d is %d bytes, %d left", nh, off, n, l.End-off)
			}
			if nh == ipv6ExtRouting && frame[off+3] != 0 {
				l.Routed = true
			}
			nh = frame[off]
			off += n
			continue
		case ipv6ExtFragment:
			if l.End-off < 8 {
				return malformed("IPv6 fragment header at %d needs 8 bytes, %d left", off, l.End-off)
			}
			l.Fragment = true
			nh = frame[off]
			off += 8
		}
		break
	}
	l.L4Proto = nh
	l.L4Off = off
	return nil
}

func (l *Layout) parseL4(frame []byte) error {
	l.PayloadOff = l.L4Off
	if l.Fragment {
		return nil
	}
	left := l.End - l.L4Off
	switch l.L4Proto {
	case ProtoTCP:
		if left < tcpMinHdrLen {
			return malformed("TCP header at %d needs %d bytes, %d left", l.L4Off, tcpMinHdrLen, left)
		}
		doff := int(frame[l.L4Off+12]>>4) * 4
		if doff < tcpMinHdrLen || doff > left {
			return malformed("TCP data offset %d bytes outside [%d, %d left]", doff, tcpMinHdrLen, left)
		}
		l.PayloadOff = l.L4Off + doff
	case ProtoUDP:
		if left < udpHdrLen {
			return malformed("UDP header at %d needs %d bytes, %d left", l.L4Off, udpHdrLen, left)
		}
		l.PayloadOff = l.L4Off + udpHdrLen
	}
	return nil
}

// IPv4HeaderChecksumValid reports whether the IPv4 header of a frame parsed into l sums
// to 0xffff. It is false for IPv6 layouts.
func (l *Layout) IPv4HeaderChecksumValid(frame []byte) bool {
	if l.IPv6 {
		return false
	}
	return Fold(Sum(frame[l.L3Off:l.L4Off], 0)) == 0xffff
}

// PseudoHeaderSum returns the unfolded L4 pseudo-header sum for frame (parsed into l)
// with the given L4 length, using the addresses in the IP header.
func (l *Layout) PseudoHeaderSum(frame []byte, l4Len int) uint64 {
	if l.IPv6 {
		return PseudoHeaderSum(l.L4Proto, frame[l.L3Off+8:l.L3Off+24], frame[l.L3Off+24:l.L3Off+40], l4Len)
	}
	return PseudoHeaderSum(l.L4Proto, frame[l.L3Off+12:l.L3Off+16], frame[l.L3Off+16:l.L3Off+20], l4Len)
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}
