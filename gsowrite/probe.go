package gsowrite

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"tapgro/vnethdr"
)

// Probe frames carry two segments of probePayload bytes.
const (
	probePayload = 8
	probeSegs    = 2
)

// ProbeCap is the longest probe frame behind a header of hdrLen bytes: IPv6 + TCP.
func ProbeCap(hdrLen int) int { return hdrLen + 14 + 40 + 20 + probePayload*probeSegs }

// AppendProbe appends to b (reusing its capacity, so a buffer of ProbeCap
// bytes makes it allocation-free) a small two-segment GSO frame of the given gso_type
// (TCPv4, TCPv6 or UDP_L4, with the ECN bit for TCP) over IPv4 or IPv6, behind a
// hdrLen-byte header: the frame the kernel must accept if it accepts GSO of that kind at
// all. The header is what a Linux TAP itself emits (NEEDS_CSUM, csum_start at the L4
// header, the L4 checksum field holding the pseudo-header sum, include/linux/virtio_net.h
// virtio_net_hdr_from_skb), and vnethdr.ValidatePeer admits it. Like the start-up probe
// it is addressed to a MAC that is not the TAP's: the stack drops it as
// PACKET_OTHERHOST in ip_rcv / ipv6_rcv, after tun_get_user has validated the header.
// Addresses are from 198.18.0.0/15 and fd00:198:18::/48, ports are discard (9).
func AppendProbe(b []byte, hdrLen int, gsoType uint8, ipv6 bool) []byte {
	udp := gsoType&^vnethdr.GSOECN == vnethdr.GSOUDPL4
	if gsoType&^vnethdr.GSOECN == vnethdr.GSOTCPv6 {
		ipv6 = true
	} else if !udp {
		ipv6 = false // TCPv4
	}
	l3Len, l4Len, proto, csumOff := 20, 20, uint8(unix.IPPROTO_TCP), 16
	if ipv6 {
		l3Len = 40
	}
	if udp {
		l4Len, proto, csumOff = 8, unix.IPPROTO_UDP, 6
	}
	const l3 = 14
	l4 := l3 + l3Len
	total := l4 + l4Len + probePayload*probeSegs
	n := hdrLen + total
	if cap(b)-len(b) < n {
		b = append(b, make([]byte, n)...)
	} else {
		b = b[:len(b)+n]
		clear(b[len(b)-n:])
	}
	pkt := b[len(b)-n:]
	h := vnethdr.Hdr{
		Flags:      vnethdr.FlagNeedsCsum,
		GSOType:    gsoType,
		HdrLen:     uint16(l4 + l4Len),
		GSOSize:    probePayload,
		CsumStart:  uint16(l4),
		CsumOffset: uint16(csumOff),
	}
	_ = h.Encode(pkt, hdrLen) // cannot fail: pkt holds hdrLen bytes and more
	f := pkt[hdrLen:]
	copy(f[0:6], []byte{0x02, 0x74, 0x61, 0x70, 0x67, 0x72}) // not the TAP's MAC: dropped as OTHERHOST
	copy(f[6:12], []byte{0x02, 0x74, 0x61, 0x70, 0x67, 0x73})
	var src, dst []byte
	if ipv6 {
		binary.BigEndian.PutUint16(f[12:], vnethdr.EtherTypeIPv6)
		ip := f[l3:l4]
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(total-l4))
		ip[6], ip[7] = proto, 64
		src, dst = ip[8:24], ip[24:40]
		copy(src, []byte{0xfd, 0, 0x01, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xfe})
		copy(dst, []byte{0xfd, 0, 0x01, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xfd})
	} else {
		binary.BigEndian.PutUint16(f[12:], vnethdr.EtherTypeIPv4)
		ip := f[l3:l4]
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(total-l3))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		ip[8] = 64
		ip[9] = proto
		src, dst = ip[12:16], ip[16:20]
		copy(src, []byte{198, 18, 255, 254})
		copy(dst, []byte{198, 18, 255, 253})
		binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip, 0))
	}
	l4h := f[l4:]
	binary.BigEndian.PutUint16(l4h[0:], 9) // discard
	binary.BigEndian.PutUint16(l4h[2:], 9)
	if udp {
		binary.BigEndian.PutUint16(l4h[4:], uint16(len(l4h)))
	} else {
		binary.BigEndian.PutUint32(l4h[4:], 1)
		binary.BigEndian.PutUint32(l4h[8:], 1)
		l4h[12] = 5 << 4
		l4h[13] = 0x10 // ACK
		binary.BigEndian.PutUint16(l4h[14:], 65535)
	}
	// NEEDS_CSUM: the field holds the pseudo-header sum, not inverted (virtio spec,
	// "Packet Transmission").
	binary.BigEndian.PutUint16(l4h[csumOff:], vnethdr.Fold(vnethdr.PseudoHeaderSum(proto, src, dst, len(l4h))))
	return b
}
