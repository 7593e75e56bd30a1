package vnethdr

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// Test packet builder: Ethernet (+ optional VLAN) / IPv4 or IPv6 (+ options or extension
// headers) / TCP or UDP, with correct lengths and either a full L4 checksum or (partial)
// the pseudo-header sum the kernel leaves for NEEDS_CSUM. Addresses come from the
// benchmarking ranges 198.18.0.0/15 and fd00:198:18::/64.

var (
	src4 = []byte{198, 18, 0, 1}
	dst4 = []byte{198, 18, 0, 2}
	src6 = []byte{0xfd, 0, 0x01, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
	dst6 = []byte{0xfd, 0, 0x01, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}
)

const (
	tcpACK = 0x10
	tcpECE = 0x40
)

type pkt struct {
	v6       bool
	udp      bool
	vlan     bool
	ipID     uint16
	ipFrag   uint16 // IPv4 flags+offset field; 0x4000 (DF) when zero
	tos      uint8
	ipOpts   []byte  // IPv4 options, multiple of 4
	ext6     []uint8 // IPv6 extension header types to insert (8 bytes each)
	segsLeft uint8   // Segments Left of an inserted Routing header
	seq, ack uint32
	flags    uint8  // TCP flags; ACK when zero
	tcpOpts  []byte // multiple of 4
	payload  []byte
	partial  bool // L4 checksum field = pseudo-header sum (NEEDS_CSUM form)
	pad      int  // Ethernet padding after the IP packet
}

// build returns the frame and the offsets of its L3 and L4 headers and payload.
func (p pkt) build() (frame []byte, l3, l4, pay int) {
	var b []byte
	b = append(b, 0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1) // dst, src MAC
	et := uint16(EtherTypeIPv4)
	if p.v6 {
		et = EtherTypeIPv6
	}
	if p.vlan {
		b = binary.BigEndian.AppendUint16(b, EtherTypeVLAN)
		b = binary.BigEndian.AppendUint16(b, 42)
	}
	b = binary.BigEndian.AppendUint16(b, et)
	l3 = len(b)

	proto := uint8(ProtoTCP)
	l4hdr := 20 + len(p.tcpOpts)
	if p.udp {
		proto, l4hdr = ProtoUDP, 8
	}
	l4len := l4hdr + len(p.payload)

	if p.v6 {
		var ext []byte
		for i, t := range p.ext6 {
			next := proto
			if i+1 < len(p.ext6) {
				next = p.ext6[i+1]
			}
			h := []byte{next, 0, 1, 4, 0, 0, 0, 0} // PadN option for opts headers
			if t == ipv6ExtRouting {
				h = []byte{next, 0, 0, p.segsLeft, 0, 0, 0, 0}
			}
			if t == ipv6ExtFragment {
				h = []byte{next, 0, 0, 0, 0, 0, 0, 1}
			}
			ext = append(ext, h...)
		}
		first := proto
		if len(p.ext6) > 0 {
			first = p.ext6[0]
		}
		b = append(b, 0x60|p.tos>>4, p.tos<<4, 0x12, 0x34)
		b = binary.BigEndian.AppendUint16(b, uint16(len(ext)+l4len))
		b = append(b, first, 64)
		b = append(b, src6...)
		b = append(b, dst6...)
		b = append(b, ext...)
	} else {
		ihl := 20 + len(p.ipOpts)
		frag := p.ipFrag
		if frag == 0 {
			frag = 0x4000
		}
		b = append(b, 0x40|uint8(ihl/4), p.tos)
		b = binary.BigEndian.AppendUint16(b, uint16(ihl+l4len))
		b = binary.BigEndian.AppendUint16(b, p.ipID)
		b = binary.BigEndian.AppendUint16(b, frag)
		b = append(b, 64, proto, 0, 0)
		b = append(b, src4...)
		b = append(b, dst4...)
		b = append(b, p.ipOpts...)
		binary.BigEndian.PutUint16(b[l3+10:], refChecksum(b[l3:]))
	}
	l4 = len(b)
	if p.udp {
		b = binary.BigEndian.AppendUint16(b, 40000)
		b = binary.BigEndian.AppendUint16(b, 4789)
		b = binary.BigEndian.AppendUint16(b, uint16(l4len))
		b = append(b, 0, 0)
	} else {
		flags := p.flags
		if flags == 0 {
			flags = tcpACK
		}
		b = binary.BigEndian.AppendUint16(b, 40000)
		b = binary.BigEndian.AppendUint16(b, 5201)
		b = binary.BigEndian.AppendUint32(b, p.seq)
		b = binary.BigEndian.AppendUint32(b, p.ack)
		b = append(b, uint8(l4hdr/4)<<4, flags)
		b = binary.BigEndian.AppendUint16(b, 502)
		b = append(b, 0, 0, 0, 0) // checksum, urgent pointer
		b = append(b, p.tcpOpts...)
	}
	pay = len(b)
	b = append(b, p.payload...)
	csumField := l4 + 16
	if p.udp {
		csumField = l4 + 6
	}
	pseudo := refPseudo(p.v6, proto, l4len)
	if p.partial {
		binary.BigEndian.PutUint16(b[csumField:], ^refChecksum(pseudo))
	} else {
		c := refChecksum(append(pseudo, b[l4:]...))
		if p.udp && c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(b[csumField:], c)
	}
	for range p.pad {
		b = append(b, 0xee)
	}
	return b, l3, l4, pay
}

// refPseudo builds the pseudo-header bytes (RFC 793/768 for IPv4, RFC 8200 §8.1 for IPv6).
func refPseudo(v6 bool, proto uint8, l4len int) []byte {
	if v6 {
		return refPseudoAddr(src6, dst6, proto, l4len)
	}
	return refPseudoAddr(src4, dst4, proto, l4len)
}

func refPseudoAddr(src, dst []byte, proto uint8, l4len int) []byte {
	b := append(bytes.Clone(src), dst...)
	if len(src) == 16 {
		b = binary.BigEndian.AppendUint32(b, uint32(l4len))
		return append(b, 0, 0, 0, proto)
	}
	b = append(b, 0, proto)
	return binary.BigEndian.AppendUint16(b, uint16(l4len))
}

// refChecksum is a deliberately naive RFC 1071 internet checksum.
func refChecksum(b []byte) uint16 { return ^refFoldedSum(b, 0) }

// checkFrame re-parses a plain frame and verifies everything a receiver would: IPv4
// header checksum, IP/UDP lengths against the frame length, and the L4 checksum against
// the naive reference over pseudo-header + segment. It returns the layout.
func checkFrame(t testing.TB, b []byte) Layout {
	t.Helper()
	l, err := ParseLayout(b)
	if err != nil {
		t.Fatalf("output frame does not parse: %v", err)
	}
	if l.End != len(b) {
		t.Errorf("IP packet ends at %d, frame is %d bytes", l.End, len(b))
	}
	if !l.IPv6 && refChecksum(b[l.L3Off:l.L4Off]) != 0 {
		t.Errorf("IPv4 header checksum invalid: %x", b[l.L3Off:l.L4Off])
	}
	l4len := l.End - l.L4Off
	if l.L4Proto == ProtoUDP {
		if got := int(binary.BigEndian.Uint16(b[l.L4Off+4:])); got != l4len {
			t.Errorf("UDP length %d, want %d", got, l4len)
		}
		if binary.BigEndian.Uint16(b[l.L4Off+6:]) == 0 {
			t.Errorf("UDP checksum 0 (absent)")
		}
	}
	src, dst := b[l.L3Off+12:l.L3Off+16], b[l.L3Off+16:l.L3Off+20]
	if l.IPv6 {
		src, dst = b[l.L3Off+8:l.L3Off+24], b[l.L3Off+24:l.L3Off+40]
	}
	if c := refChecksum(append(refPseudoAddr(src, dst, l.L4Proto, l4len), b[l.L4Off:l.End]...)); c != 0 {
		t.Errorf("L4 checksum does not verify (residue %#04x)", c)
	}
	return l
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

func TestBuilderSelfCheck(t *testing.T) {
	// The builder must itself produce frames the reference verifier accepts, or every
	// test below would be comparing against garbage.
	for _, p := range []pkt{
		{payload: pattern(100, 1)},
		{v6: true, payload: pattern(101, 2)},
		{udp: true, vlan: true, payload: pattern(33, 3)},
		{v6: true, udp: true, ext6: []uint8{ipv6ExtHopByHop, ipv6ExtDstOpts}, payload: pattern(7, 4)},
		{ipOpts: []byte{1, 1, 1, 0}, tcpOpts: bytes.Repeat([]byte{1}, 12), payload: pattern(5, 5)},
	} {
		f, _, _, _ := p.build()
		checkFrame(t, f)
	}
}
