package coalescer

import (
	"encoding/binary"
	"hash/maphash"

	"tapgro/vnethdr"
)

// Header constants (include/uapi/linux/virtio_net.h, RFC 791/8200/9293/768).
const (
	ethHdrLen  = 14
	vlanHdrLen = 18
	ipv4HdrLen = 20 // IHL=5: the only IPv4 header length we coalesce
	ipv6HdrLen = 40
	tcpHdrLen  = 20
	udpHdrLen  = 8

	etherTypeIPv4 = 0x0800
	etherTypeIPv6 = 0x86dd
	etherTypeVLAN = 0x8100

	protoTCP = 6
	protoUDP = 17

	ipv6HopByHop = 0
	ipv6Routing  = 43
	ipv6Fragment = 44
	ipv6DstOpts  = 60

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
	tcpURG = 0x20
	tcpCWR = 0x80
)

// flowKey is the identity of a flow: everything that must be equal for two frames to
// belong to one aggregate, laid out at fixed offsets so that == and maphash see the
// same bytes (IPv4 addresses leave the IPv6 tail zero):
//
//	[0:12]  destination and source MAC
//	[12]    1 if an 802.1Q tag is present, [13:15] its TCI
//	[15]    IP version (4 or 6), [16] L4 protocol
//	[17:33] source address, [33:49] destination address
//	[49:53] source and destination port
//	[53:56] IPv6 flow label (20 bits)
type flowKey [56]byte

// pkt is what parse extracts from one frame; it lives in the Coalescer and is reused.
type pkt struct {
	key    flowKey
	hash   uint64
	keyed  bool // key filled in: the frame's flow is known and may be flushed
	hashed bool

	v6, udp bool
	l2      int // L3 offset: 14, or 18 with a VLAN tag
	l4Off   int // L4 header offset (after IPv6 extension headers)
	payOff  int // payload offset
	end     int // end of the IP packet (IP length, not frame length)
	payload int

	ipSig  uint32 // bytes that must be equal: v4 TOS, DF/reserved, TTL; v6 TC, hop limit
	id     uint16
	idMode uint8 // the IPv4 ID mode a merge would commit (set by mergeCheck)

	flags    uint8
	seq, ack uint32
	win      uint16

	// need is one past the last frame byte parse's decision depended on (bounds
	// checks against the frame length aside): Classify trusts a decision made on a
	// prefix only if need lies within it.
	need int
}

// reach records that parse's decision depends on frame bytes before n.
func (p *pkt) reach(n int) {
	if n > p.need {
		p.need = n
	}
}

func be16(b []byte) uint16 { return binary.BigEndian.Uint16(b) }
func be32(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

// parse reads the headers of frame into p and returns ReasonStarted when the frame may
// be coalesced (subject to matching its flow's aggregate), or the reason it must pass
// through. Every offset is bounds-checked before use; nothing here panics on any input.
// p.keyed is set as soon as the flow is identifiable, even if the frame is ineligible,
// so the caller can flush the flow before the frame overtakes its held data.
func (c *Coalescer) parse(f []byte, p *pkt) Reason {
	p.keyed, p.hashed = false, false
	p.need = ethHdrLen
	if len(f) < ethHdrLen {
		return ReasonMalformed
	}
	p.key = flowKey{}
	copy(p.key[0:12], f[0:12])
	l2, et := ethHdrLen, be16(f[12:])
	if et == etherTypeVLAN {
		if len(f) < vlanHdrLen {
			return ReasonMalformed
		}
		p.reach(vlanHdrLen)
		p.key[12] = 1
		p.key[13], p.key[14] = f[14], f[15]
		l2, et = vlanHdrLen, be16(f[16:])
	}
	p.l2 = l2
	switch et {
	case etherTypeIPv4:
		return c.parse4(f, p)
	case etherTypeIPv6:
		return c.parse6(f, p)
	}
	return ReasonNotTCPUDP
}

func (c *Coalescer) parse4(f []byte, p *pkt) Reason {
	ip := f[p.l2:]
	p.reach(p.l2 + ipv4HdrLen)
	if len(ip) < ipv4HdrLen || ip[0]>>4 != 4 {
		return ReasonMalformed
	}
	ihl := int(ip[0]&0x0f) * 4
	tot := int(be16(ip[2:]))
	if ihl < ipv4HdrLen || tot < ihl || tot > len(ip) {
		return ReasonMalformed
	}
	proto := ip[9]
	if proto != protoTCP && proto != protoUDP {
		return ReasonNotTCPUDP
	}
	frag := be16(ip[6:])
	if frag&0x1fff == 0 && tot >= ihl+4 {
		// First fragment or whole datagram: the ports are readable.
		p.reach(p.l2 + ihl + 4)
		p.key[15], p.key[16] = 4, proto
		copy(p.key[17:21], ip[12:16])
		copy(p.key[33:37], ip[16:20])
		copy(p.key[49:53], ip[ihl:ihl+4])
		p.keyed = true
	}
	if ihl != ipv4HdrLen {
		return ReasonIPOptions
	}
	if frag&0x3fff != 0 {
		return ReasonFragment
	}
	if vnethdr.Fold(vnethdr.Sum(ip[:ipv4HdrLen], 0)) != 0xffff {
		return ReasonBadChecksum
	}
	p.v6 = false
	p.l4Off = p.l2 + ipv4HdrLen
	p.end = p.l2 + tot
	// TOS byte (ECN included), the flag bits (reserved, DF; MF is 0 here) and TTL must
	// be equal across an aggregate (Linux include/net/gro.h inet_gro_flush).
	p.ipSig = uint32(ip[1])<<16 | uint32(frag>>13)<<8 | uint32(ip[8])
	p.id = be16(ip[4:])
	return c.parseL4(f, proto, p)
}

func (c *Coalescer) parse6(f []byte, p *pkt) Reason {
	ip := f[p.l2:]
	p.reach(p.l2 + ipv6HdrLen)
	if len(ip) < ipv6HdrLen || ip[0]>>4 != 6 {
		return ReasonMalformed
	}
	end := ipv6HdrLen + int(be16(ip[4:]))
	if end > len(ip) {
		return ReasonMalformed
	}
	nh := ip[6]
	off := ipv6HdrLen
	reason := ReasonStarted
	// Walk the extension headers Linux ipv6_gro_receive pulls (ipv6_gro_pull_exthdrs:
	// Hop-by-Hop, Routing, Destination Options, all INET6_PROTO_GSO_EXTHDR in
	// net/ipv6/exthdrs_offload.c); mergeCheck then requires byte-identical chains. A
	// Fragment header ends GRO there too (no offload registered), but the walk goes on
	// for a first fragment's ports so it still flushes its flow. Every header is at
	// least 8 bytes and must lie within the packet, so the loop ends.
walk:
	for {
		switch nh {
		case protoTCP, protoUDP:
			break walk
		case ipv6HopByHop, ipv6Routing, ipv6DstOpts:
			p.reach(p.l2 + off + 8)
			if off+8 > end {
				return ReasonMalformed
			}
			n := (int(ip[off+1]) + 1) * 8
			if off+n > end {
				return ReasonMalformed
			}
			if nh == ipv6Routing && ip[off+3] != 0 && reason == ReasonStarted {
				// Segments left: the L4 pseudo-header uses the final destination
				// (RFC 8200 section 8.1), not the IPv6 destination our checksum check
				// and the GSO output's pseudo-header sum use; Linux's own check
				// (ip6_gro_compute_pseudo) fails on it the same way, and vnethdr.Split
				// refuses such a packet.
				reason = ReasonExtHeader
			}
			nh, off = ip[off], off+n
		case ipv6Fragment:
			p.reach(p.l2 + off + 8)
			if off+8 > end {
				return ReasonMalformed
			}
			if be16(ip[off+2:])&0xfff8 != 0 {
				return ReasonFragment // not the first fragment: no ports
			}
			nh, off = ip[off], off+8
			reason = ReasonFragment
		default:
			return ReasonNotTCPUDP
		}
	}
	if off+4 <= end {
		p.reach(p.l2 + off + 4)
		p.key[15], p.key[16] = 6, nh
		copy(p.key[17:49], ip[8:40])
		copy(p.key[49:53], ip[off:off+4])
		p.key[53], p.key[54], p.key[55] = ip[1]&0x0f, ip[2], ip[3]
		p.keyed = true
	}
	if reason != ReasonStarted {
		return reason
	}
	p.v6 = true
	p.l4Off = p.l2 + off
	p.end = p.l2 + end
	// Traffic class (ECN included) and hop limit must be equal; the flow label is part
	// of the key (Linux ipv6_gro_receive).
	tc := ip[0]<<4 | ip[1]>>4
	p.ipSig = 1<<24 | uint32(tc)<<8 | uint32(ip[7])
	p.id = 0
	return c.parseL4(f, nh, p)
}

func (c *Coalescer) parseL4(f []byte, proto uint8, p *pkt) Reason {
	l4 := f[p.l4Off:p.end]
	if proto == protoUDP {
		p.udp, p.flags = true, 0
		p.reach(p.l4Off + udpHdrLen)
		if len(l4) < udpHdrLen || int(be16(l4[4:])) != len(l4) {
			return ReasonMalformed
		}
		p.payOff = p.l4Off + udpHdrLen
		p.payload = p.end - p.payOff
		switch {
		case !c.cfg.UDP:
			return ReasonDisabled
		case l4[6] == 0 && l4[7] == 0:
			// No checksum: nothing to verify, so never merged (Linux udp_gro_receive).
			return ReasonNoChecksum
		case p.payload == 0:
			return ReasonShortSegment
		}
		return ReasonStarted
	}
	p.udp = false
	p.reach(p.l4Off + tcpHdrLen)
	if len(l4) < tcpHdrLen {
		return ReasonMalformed
	}
	doff := int(l4[12]>>4) * 4
	if doff < tcpHdrLen || doff > len(l4) {
		return ReasonMalformed
	}
	p.payOff = p.l4Off + doff
	p.payload = p.end - p.payOff
	p.flags = l4[13]
	p.seq, p.ack, p.win = be32(l4[4:]), be32(l4[8:]), be16(l4[14:])
	switch {
	case c.cfg.DisableTCP:
		return ReasonDisabled
	case p.flags&tcpSYN != 0:
		return ReasonSyn
	case p.flags&(tcpRST|tcpURG) != 0:
		return ReasonFinRstUrg
	case p.flags&tcpACK == 0:
		return ReasonFlagsChanged
	case p.payload == 0 && p.flags&tcpFIN != 0:
		return ReasonFinRstUrg
	case p.payload == 0:
		// Pure ACKs pass immediately (gVisor edd7fd2e6: a held handshake ACK broke
		// accept backlogs); Add refines this to DupAck when it can tell.
		return ReasonPureAck
	case p.flags&tcpCWR != 0 && !c.cfg.ECN:
		// Without GSO_ECN on the output a CWR segment cannot be described: GSO would
		// copy CWR onto every segment or drop it.
		return ReasonCWR
	}
	return ReasonStarted
}

// hashOf returns the flow hash of p's key, computing it at most once per frame.
func (c *Coalescer) hashOf(p *pkt) uint64 {
	if !p.hashed {
		p.hash = maphash.Bytes(c.seed, p.key[:])
		p.hashed = true
	}
	return p.hash
}
