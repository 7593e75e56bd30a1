package grotest

import (
	"encoding/binary"

	"tapgro/vnethdr"
)

// Protocol numbers and TCP flags the builders and cases use (IANA protocol numbers;
// RFC 9293 §3.1 for the flags, RFC 3168 §6.1 for ECE and CWR; RFC 8200 §4 for the
// IPv6 extension header types).
const (
	ProtoTCP     = 6
	ProtoUDP     = 17
	IPv6HopByHop = 0
	IPv6Routing  = 43
	IPv6Fragment = 44
	IPv6DstOpts  = 60

	TCPFIN = 0x01
	TCPSYN = 0x02
	TCPRST = 0x04
	TCPPSH = 0x08
	TCPACK = 0x10
	TCPURG = 0x20
	TCPECE = 0x40
	TCPCWR = 0x80

	// MSS is the payload of a full segment at MTU 1500 with TCP timestamps.
	MSS = 1448
)

// Test packet builders: Ethernet frames with correct IPv4 header and L4 checksums unless
// a spec asks otherwise. Addresses are from 198.18.0.0/15 and fd00:198:18::/64.

var (
	MACA = []byte{0x02, 0, 0, 0, 0, 0x0a}
	MACB = []byte{0x02, 0, 0, 0, 0, 0x0b}
	IP4A = []byte{198, 18, 0, 1}
	IP4B = []byte{198, 18, 0, 2}
	IP6A = []byte{0xfd, 0, 0x01, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}
	IP6B = []byte{0xfd, 0, 0x01, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}
	// TSOpts are the TCP options Linux sends on every segment, timestamps: NOP NOP
	// TS(10) tsval tsecr.
	TSOpts = func(val uint32) []byte {
		b := []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 7}
		binary.BigEndian.PutUint32(b[4:], val)
		return b
	}
)

// Spec describes one frame for Build; the zero value of a field is the builder's
// default (Build fills in MACs and addresses).
type Spec struct {
	V6, UDP   bool
	VLAN      bool
	TCI       uint16
	DstMAC    []byte
	SrcMAC    []byte
	Src, Dst  []byte
	Sport     uint16
	Dport     uint16
	Flags     uint8
	Seq, Ack  uint32
	Win       uint16
	N         int // payload bytes
	TTL, TOS  uint8
	ID        uint16
	DF, MF    bool
	FragOff   uint16 // in 8-byte units
	IPOpts    []byte // multiple of 4
	TCPOpts   []byte // multiple of 4
	FlowLabel uint32
	ExtType   uint8  // IPv6 extension header type (0: none unless Ext != nil)
	Ext       []byte // IPv6 extension headers; byte 0 (next header) is filled in unless ExtRaw
	ExtRaw    bool   // Ext is a whole chain whose next-header bytes the caller set
	BadL4     bool
	BadIP     bool
	ZeroUDP   bool
	Pad       int  // Ethernet padding after the IP packet
	Partial   bool // L4 checksum field holds only the pseudo-header sum (NEEDS_CSUM)
}

// PayloadByte makes every payload byte depend on its TCP sequence position, so a
// misplaced or duplicated byte changes the frame.
func PayloadByte(seq uint32, i int) byte { return byte((seq+uint32(i))*7 + uint32(i>>8)) }

// Build returns the Ethernet frame s describes.
func Build(s Spec) []byte {
	if s.DstMAC == nil {
		s.DstMAC, s.SrcMAC = MACB, MACA
	}
	if s.Src == nil {
		if s.V6 {
			s.Src, s.Dst = IP6A, IP6B
		} else {
			s.Src, s.Dst = IP4A, IP4B
		}
	}
	var l4 []byte
	proto := uint8(ProtoTCP)
	if s.UDP {
		proto = ProtoUDP
		l4 = make([]byte, 8, 8+s.N)
		binary.BigEndian.PutUint16(l4[0:], s.Sport)
		binary.BigEndian.PutUint16(l4[2:], s.Dport)
		binary.BigEndian.PutUint16(l4[4:], uint16(8+s.N))
	} else {
		l4 = make([]byte, 20+len(s.TCPOpts), 20+len(s.TCPOpts)+s.N)
		binary.BigEndian.PutUint16(l4[0:], s.Sport)
		binary.BigEndian.PutUint16(l4[2:], s.Dport)
		binary.BigEndian.PutUint32(l4[4:], s.Seq)
		binary.BigEndian.PutUint32(l4[8:], s.Ack)
		l4[12] = byte(len(l4)/4) << 4
		l4[13] = s.Flags
		binary.BigEndian.PutUint16(l4[14:], s.Win)
		copy(l4[20:], s.TCPOpts)
	}
	for i := range s.N {
		l4 = append(l4, PayloadByte(s.Seq, i))
	}
	var pseudo uint64
	if s.V6 {
		pseudo = vnethdr.PseudoHeaderSum(proto, s.Src, s.Dst, len(l4))
	} else {
		pseudo = vnethdr.PseudoHeaderSum(proto, s.Src, s.Dst, len(l4))
	}
	off := 16
	if s.UDP {
		off = 6
	}
	if s.Partial {
		binary.BigEndian.PutUint16(l4[off:], vnethdr.Fold(pseudo))
	} else {
		cs := vnethdr.Checksum(l4, pseudo)
		if s.UDP && cs == 0 {
			cs = 0xffff
		}
		if s.ZeroUDP {
			cs = 0
		}
		if s.BadL4 {
			cs ^= 0x0101
		}
		binary.BigEndian.PutUint16(l4[off:], cs)
	}

	f := append([]byte{}, s.DstMAC...)
	f = append(f, s.SrcMAC...)
	if s.VLAN {
		f = append(f, 0x81, 0x00, byte(s.TCI>>8), byte(s.TCI))
	}
	if s.V6 {
		f = append(f, 0x86, 0xdd)
		ip := make([]byte, 40)
		ip[0] = 6<<4 | s.TOS>>4
		ip[1] = s.TOS<<4 | byte(s.FlowLabel>>16)&0x0f
		ip[2], ip[3] = byte(s.FlowLabel>>8), byte(s.FlowLabel)
		ip[6] = proto
		ip[7] = s.TTL
		copy(ip[8:], s.Src)
		copy(ip[24:], s.Dst)
		var ext []byte
		if s.Ext != nil {
			ext = append([]byte{}, s.Ext...)
			if !s.ExtRaw {
				ext[0] = proto
			}
			ip[6] = s.ExtType
		}
		binary.BigEndian.PutUint16(ip[4:], uint16(len(ext)+len(l4)))
		f = append(f, ip...)
		f = append(f, ext...)
	} else {
		f = append(f, 0x08, 0x00)
		ip := make([]byte, 20+len(s.IPOpts))
		ip[0] = 4<<4 | byte(len(ip)/4)
		ip[1] = s.TOS
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+len(l4)))
		binary.BigEndian.PutUint16(ip[4:], s.ID)
		fr := s.FragOff
		if s.DF {
			fr |= 0x4000
		}
		if s.MF {
			fr |= 0x2000
		}
		binary.BigEndian.PutUint16(ip[6:], fr)
		ip[8] = s.TTL
		ip[9] = proto
		copy(ip[12:], s.Src)
		copy(ip[16:], s.Dst)
		copy(ip[20:], s.IPOpts)
		cs := vnethdr.Checksum(ip, 0)
		if s.BadIP {
			cs ^= 0x0101
		}
		binary.BigEndian.PutUint16(ip[10:], cs)
		f = append(f, ip...)
	}
	f = append(f, l4...)
	return append(f, make([]byte, s.Pad)...)
}

// Flow produces consecutive segments of one connection: seq and IPv4 ID advance.
type Flow struct {
	Spec Spec // what every segment starts from; a test may change it between segments
	seq  uint32
	id   uint16
}

// NewFlow starts a flow of kind tcp4, tcp6, udp4 or udp6 (TCP with timestamps, as
// Linux sends), with mods applied to every segment.
func NewFlow(kind string, mods ...func(*Spec)) *Flow {
	s := Spec{Flags: TCPACK, Ack: 0x1000, Win: 502, TTL: 64, DF: true, Sport: 40000, Dport: 5201}
	switch kind {
	case "tcp4":
		s.TCPOpts = TSOpts(1)
	case "tcp6":
		s.V6, s.TCPOpts = true, TSOpts(1)
	case "udp4":
		s.UDP, s.Flags = true, 0
	case "udp6":
		s.UDP, s.V6, s.Flags = true, true, 0
	default:
		panic(kind)
	}
	for _, m := range mods {
		m(&s)
	}
	return &Flow{Spec: s, seq: 1000, id: 100}
}

// Seg returns the next segment with n payload bytes; mods apply last (and may
// override seq/id). The flow advances by n bytes and one ID whatever the mods do.
func (f *Flow) Seg(n int, mods ...func(*Spec)) []byte {
	s := f.Spec
	s.Seq, s.ID, s.N = f.seq, f.id, n
	for _, m := range mods {
		m(&s)
	}
	f.seq += uint32(n)
	f.id++
	return Build(s)
}

// WithFlags and the functions after it are Spec mutators, the options NewFlow and
// Flow.Seg take: each sets one field.
func WithFlags(fl uint8) func(*Spec)  { return func(s *Spec) { s.Flags = fl } }
func OrFlags(fl uint8) func(*Spec)    { return func(s *Spec) { s.Flags |= fl } }
func WithTTL(v uint8) func(*Spec)     { return func(s *Spec) { s.TTL = v } }
func WithTOS(v uint8) func(*Spec)     { return func(s *Spec) { s.TOS = v } }
func WithID(v uint16) func(*Spec)     { return func(s *Spec) { s.ID = v } }
func WithDF(v bool) func(*Spec)       { return func(s *Spec) { s.DF = v } }
func WithSeq(v uint32) func(*Spec)    { return func(s *Spec) { s.Seq = v } }
func WithAck(v uint32) func(*Spec)    { return func(s *Spec) { s.Ack = v } }
func WithOpts(o []byte) func(*Spec)   { return func(s *Spec) { s.TCPOpts = o } }
func WithLabel(v uint32) func(*Spec)  { return func(s *Spec) { s.FlowLabel = v } }
func WithPort(v uint16) func(*Spec)   { return func(s *Spec) { s.Sport = v } }
func WithVLAN(tci uint16) func(*Spec) { return func(s *Spec) { s.VLAN, s.TCI = true, tci } }
func WithPad(n int) func(*Spec)       { return func(s *Spec) { s.Pad = n } }

var (
	BadL4     = func(s *Spec) { s.BadL4 = true }
	BadIP     = func(s *Spec) { s.BadIP = true }
	ZeroUDP   = func(s *Spec) { s.ZeroUDP = true }
	PartialL4 = func(s *Spec) { s.Partial = true }
	WithIPOpt = func(s *Spec) { s.IPOpts = []byte{1, 1, 1, 0} } // NOP NOP NOP EOL
	WithMF    = func(s *Spec) { s.MF = true }
	DstOpts   = func(s *Spec) { s.ExtType, s.Ext = IPv6DstOpts, []byte{0, 0, 1, 4, 0, 0, 0, 0} }
	FragHdr   = func(s *Spec) { s.ExtType, s.Ext = IPv6Fragment, []byte{0, 0, 0, 0, 0, 0, 0, 1} }
	// DstOptsPad is a Destination Options header whose PadN option carries v, so two
	// headers of the same type and length can differ in one byte.
	DstOptsPad = func(v byte) func(*Spec) {
		return func(s *Spec) { s.ExtType, s.Ext, s.ExtRaw = IPv6DstOpts, []byte{0, 0, 1, 4, v, 0, 0, 0}, false }
	}
	// HbhDstOpts is a two-header chain: Hop-by-Hop (16 bytes) then Destination Options
	// (8 bytes), then the L4 header.
	HbhDstOpts = func(s *Spec) {
		proto := byte(ProtoTCP)
		if s.UDP {
			proto = ProtoUDP
		}
		s.ExtType, s.ExtRaw = IPv6HopByHop, true
		s.Ext = []byte{
			IPv6DstOpts, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			proto, 0, 1, 4, 0, 0, 0, 0,
		}
	}
	// RoutingHdr is a Routing header (type 4 layout, no addresses) with segLeft
	// segments left.
	RoutingHdr = func(segLeft byte) func(*Spec) {
		return func(s *Spec) { s.ExtType, s.Ext = IPv6Routing, []byte{0, 0, 4, segLeft, 0, 0, 0, 0} }
	}
)
