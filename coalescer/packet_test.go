package coalescer

import (
	"encoding/binary"
	"testing"

	"tapgro/vnethdr"
)

// Test packet builders: Ethernet frames with correct IPv4 header and L4 checksums unless
// a spec asks otherwise. Addresses are from 198.18.0.0/15 and fd00:198:18::/64.

var (
	macA = []byte{0x02, 0, 0, 0, 0, 0x0a}
	macB = []byte{0x02, 0, 0, 0, 0, 0x0b}
	ip4A = []byte{198, 18, 0, 1}
	ip4B = []byte{198, 18, 0, 2}
	ip6A = []byte{0xfd, 0, 0x01, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
	ip6B = []byte{0xfd, 0, 0x01, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}
	// Linux sends timestamps on every segment: NOP NOP TS(10) tsval tsecr.
	tsOpts = func(val uint32) []byte {
		b := []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 7}
		binary.BigEndian.PutUint32(b[4:], val)
		return b
	}
)

type spec struct {
	v6, udp   bool
	vlan      bool
	tci       uint16
	dstMAC    []byte
	srcMAC    []byte
	src, dst  []byte
	sport     uint16
	dport     uint16
	flags     uint8
	seq, ack  uint32
	win       uint16
	n         int // payload bytes
	ttl, tos  uint8
	id        uint16
	df, mf    bool
	fragOff   uint16 // in 8-byte units
	ipOpts    []byte // multiple of 4
	tcpOpts   []byte // multiple of 4
	flowLabel uint32
	extType   uint8  // IPv6 extension header type (0: none unless ext != nil)
	ext       []byte // IPv6 extension headers; byte 0 (next header) is filled in unless extRaw
	extRaw    bool   // ext is a whole chain whose next-header bytes the caller set
	badL4     bool
	badIP     bool
	zeroUDP   bool
	pad       int  // Ethernet padding after the IP packet
	partial   bool // L4 checksum field holds only the pseudo-header sum (NEEDS_CSUM)
}

// payloadByte makes every payload byte depend on its TCP sequence position, so a
// misplaced or duplicated byte changes the frame.
func payloadByte(seq uint32, i int) byte { return byte((seq+uint32(i))*7 + uint32(i>>8)) }

func build(s spec) []byte {
	if s.dstMAC == nil {
		s.dstMAC, s.srcMAC = macB, macA
	}
	if s.src == nil {
		if s.v6 {
			s.src, s.dst = ip6A, ip6B
		} else {
			s.src, s.dst = ip4A, ip4B
		}
	}
	var l4 []byte
	proto := uint8(protoTCP)
	if s.udp {
		proto = protoUDP
		l4 = make([]byte, 8, 8+s.n)
		binary.BigEndian.PutUint16(l4[0:], s.sport)
		binary.BigEndian.PutUint16(l4[2:], s.dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(8+s.n))
	} else {
		l4 = make([]byte, 20+len(s.tcpOpts), 20+len(s.tcpOpts)+s.n)
		binary.BigEndian.PutUint16(l4[0:], s.sport)
		binary.BigEndian.PutUint16(l4[2:], s.dport)
		binary.BigEndian.PutUint32(l4[4:], s.seq)
		binary.BigEndian.PutUint32(l4[8:], s.ack)
		l4[12] = byte(len(l4)/4) << 4
		l4[13] = s.flags
		binary.BigEndian.PutUint16(l4[14:], s.win)
		copy(l4[20:], s.tcpOpts)
	}
	for i := range s.n {
		l4 = append(l4, payloadByte(s.seq, i))
	}
	var pseudo uint64
	if s.v6 {
		pseudo = vnethdr.PseudoHeaderSum(proto, s.src, s.dst, len(l4))
	} else {
		pseudo = vnethdr.PseudoHeaderSum(proto, s.src, s.dst, len(l4))
	}
	off := 16
	if s.udp {
		off = 6
	}
	if s.partial {
		binary.BigEndian.PutUint16(l4[off:], vnethdr.Fold(pseudo))
	} else {
		cs := vnethdr.Checksum(l4, pseudo)
		if s.udp && cs == 0 {
			cs = 0xffff
		}
		if s.zeroUDP {
			cs = 0
		}
		if s.badL4 {
			cs ^= 0x0101
		}
		binary.BigEndian.PutUint16(l4[off:], cs)
	}

	f := append([]byte{}, s.dstMAC...)
	f = append(f, s.srcMAC...)
	if s.vlan {
		f = append(f, 0x81, 0x00, byte(s.tci>>8), byte(s.tci))
	}
	if s.v6 {
		f = append(f, 0x86, 0xdd)
		ip := make([]byte, 40)
		ip[0] = 6<<4 | s.tos>>4
		ip[1] = s.tos<<4 | byte(s.flowLabel>>16)&0x0f
		ip[2], ip[3] = byte(s.flowLabel>>8), byte(s.flowLabel)
		ip[6] = proto
		ip[7] = s.ttl
		copy(ip[8:], s.src)
		copy(ip[24:], s.dst)
		var ext []byte
		if s.ext != nil {
			ext = append([]byte{}, s.ext...)
			if !s.extRaw {
				ext[0] = proto
			}
			ip[6] = s.extType
		}
		binary.BigEndian.PutUint16(ip[4:], uint16(len(ext)+len(l4)))
		f = append(f, ip...)
		f = append(f, ext...)
	} else {
		f = append(f, 0x08, 0x00)
		ip := make([]byte, 20+len(s.ipOpts))
		ip[0] = 4<<4 | byte(len(ip)/4)
		ip[1] = s.tos
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+len(l4)))
		binary.BigEndian.PutUint16(ip[4:], s.id)
		fr := s.fragOff
		if s.df {
			fr |= 0x4000
		}
		if s.mf {
			fr |= 0x2000
		}
		binary.BigEndian.PutUint16(ip[6:], fr)
		ip[8] = s.ttl
		ip[9] = proto
		copy(ip[12:], s.src)
		copy(ip[16:], s.dst)
		copy(ip[20:], s.ipOpts)
		cs := vnethdr.Checksum(ip, 0)
		if s.badIP {
			cs ^= 0x0101
		}
		binary.BigEndian.PutUint16(ip[10:], cs)
		f = append(f, ip...)
	}
	f = append(f, l4...)
	return append(f, make([]byte, s.pad)...)
}

// flow produces consecutive segments of one connection: seq and IPv4 ID advance.
type flow struct {
	s   spec
	seq uint32
	id  uint16
}

func newFlow(kind string, mods ...func(*spec)) *flow {
	s := spec{flags: tcpACK, ack: 0x1000, win: 502, ttl: 64, df: true, sport: 40000, dport: 5201}
	switch kind {
	case "tcp4":
		s.tcpOpts = tsOpts(1)
	case "tcp6":
		s.v6, s.tcpOpts = true, tsOpts(1)
	case "udp4":
		s.udp, s.flags = true, 0
	case "udp6":
		s.udp, s.v6, s.flags = true, true, 0
	default:
		panic(kind)
	}
	for _, m := range mods {
		m(&s)
	}
	return &flow{s: s, seq: 1000, id: 100}
}

// seg returns the next segment with n payload bytes; mods apply last (and may
// override seq/id). The flow advances by n bytes and one ID whatever the mods do.
func (f *flow) seg(n int, mods ...func(*spec)) []byte {
	s := f.s
	s.seq, s.id, s.n = f.seq, f.id, n
	for _, m := range mods {
		m(&s)
	}
	f.seq += uint32(n)
	f.id++
	return build(s)
}

// Spec mutators.
func withFlags(fl uint8) func(*spec)  { return func(s *spec) { s.flags = fl } }
func orFlags(fl uint8) func(*spec)    { return func(s *spec) { s.flags |= fl } }
func withTTL(v uint8) func(*spec)     { return func(s *spec) { s.ttl = v } }
func withTOS(v uint8) func(*spec)     { return func(s *spec) { s.tos = v } }
func withID(v uint16) func(*spec)     { return func(s *spec) { s.id = v } }
func withDF(v bool) func(*spec)       { return func(s *spec) { s.df = v } }
func withSeq(v uint32) func(*spec)    { return func(s *spec) { s.seq = v } }
func withAck(v uint32) func(*spec)    { return func(s *spec) { s.ack = v } }
func withOpts(o []byte) func(*spec)   { return func(s *spec) { s.tcpOpts = o } }
func withLabel(v uint32) func(*spec)  { return func(s *spec) { s.flowLabel = v } }
func withPort(v uint16) func(*spec)   { return func(s *spec) { s.sport = v } }
func withVLAN(tci uint16) func(*spec) { return func(s *spec) { s.vlan, s.tci = true, tci } }
func withPad(n int) func(*spec)       { return func(s *spec) { s.pad = n } }

var (
	badL4     = func(s *spec) { s.badL4 = true }
	badIP     = func(s *spec) { s.badIP = true }
	zeroUDP   = func(s *spec) { s.zeroUDP = true }
	partialL4 = func(s *spec) { s.partial = true }
	withIPOpt = func(s *spec) { s.ipOpts = []byte{1, 1, 1, 0} } // NOP NOP NOP EOL
	withMF    = func(s *spec) { s.mf = true }
	dstOpts   = func(s *spec) { s.extType, s.ext = ipv6DstOpts, []byte{0, 0, 1, 4, 0, 0, 0, 0} }
	fragHdr   = func(s *spec) { s.extType, s.ext = ipv6Fragment, []byte{0, 0, 0, 0, 0, 0, 0, 1} }
	// dstOptsPad is a Destination Options header whose PadN option carries v, so two
	// headers of the same type and length can differ in one byte.
	dstOptsPad = func(v byte) func(*spec) {
		return func(s *spec) { s.extType, s.ext, s.extRaw = ipv6DstOpts, []byte{0, 0, 1, 4, v, 0, 0, 0}, false }
	}
	// hbhDstOpts is a two-header chain: Hop-by-Hop (16 bytes) then Destination Options
	// (8 bytes), then the L4 header.
	hbhDstOpts = func(s *spec) {
		proto := byte(protoTCP)
		if s.udp {
			proto = protoUDP
		}
		s.extType, s.extRaw = ipv6HopByHop, true
		s.ext = []byte{
			ipv6DstOpts, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			proto, 0, 1, 4, 0, 0, 0, 0,
		}
	}
	// routingHdr is a Routing header (type 4 layout, no addresses) with segLeft
	// segments left.
	routingHdr = func(segLeft byte) func(*spec) {
		return func(s *spec) { s.extType, s.ext = ipv6Routing, []byte{0, 0, 4, segLeft, 0, 0, 0, 0} }
	}
)

// outPkt is one emitted packet, copied.
type outPkt struct {
	hdr   vnethdr.Hdr
	frame []byte
}

// harness wraps a Coalescer and records its output.
type harness struct {
	t   testing.TB
	c   *Coalescer
	vl  int
	out []outPkt
}

func newHarness(t testing.TB, cfg Config) *harness {
	h := &harness{t: t, vl: cfg.VnetHdrLen}
	if h.vl == 0 {
		cfg.VnetHdrLen, h.vl = vnethdr.Len, vnethdr.Len
	}
	h.c = New(cfg, func(pkt []byte) {
		var o outPkt
		if err := o.hdr.Decode(pkt, h.vl); err != nil {
			t.Fatalf("emitted %d bytes, shorter than the header", len(pkt))
		}
		o.frame = append([]byte(nil), pkt[h.vl:]...)
		h.out = append(h.out, o)
	})
	return h
}

// add offers frame (copied into a buffer with headroom) with arrival header in.
func (h *harness) add(frame []byte, in *vnethdr.Hdr) {
	buf := make([]byte, h.vl+len(frame))
	// Garbage in the headroom: the engine must write a fresh header, never pass it on.
	for i := range h.vl {
		buf[i] = 0xee
	}
	copy(buf[h.vl:], frame)
	h.c.Add(buf, in, 0)
}
