package vnethdr

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors returned by CompleteChecksum, Plan and Split. Each is returned wrapped with
// the numbers involved; test with errors.Is. None of them means the pipeline is broken:
// the caller drops that one frame, counts it under the sentinel's name, and carries on.
var (
	// ErrUnsupportedGSO: gso_type is UFO (GSOUDP, IP fragmentation that no current
	// kernel produces: drivers/net/tun.c set_offload accepts TUN_F_UFO but enables nothing for
	// it) or not a virtio value at all. Drop + count; it means the sender ignored the offloads
	// it was given.
	ErrUnsupportedGSO = errors.New("vnethdr: unsupported gso_type")

	// ErrBadHeader: the virtio_net_hdr contradicts the frame it came with — gso_size 0,
	// csum_start/csum_offset out of bounds or not pointing at the L4 checksum field, a
	// GSO type that does not match the L3/L4 headers, a GSO fragment, or an empty
	// payload. Drop + count (a peer sending these is buggy or hostile).
	ErrBadHeader = errors.New("vnethdr: virtio_net_hdr inconsistent with frame")

	// ErrTooManySegments: the frame needs more segments than len(out) or len(sizes).
	// Nothing was written. Drop + count. 128 buffers cover a 64 KiB frame down to an MSS
	// of 512 and every USO frame a kernel emits (see the package doc).
	ErrTooManySegments = errors.New("vnethdr: too many segments for the output buffers")

	// ErrShortBuffer: some out[i] is shorter than the segment it must hold. Nothing was
	// written. Drop + count; out buffers should be at least hdr_len + gso_size long.
	ErrShortBuffer = errors.New("vnethdr: output buffer too small for segment")
)

// CompleteChecksum finishes the partial checksum of a non-GSO frame carrying
// NEEDS_CSUM, in place: it sums frame[csum_start:] — which includes the checksum field at
// csum_start+csum_offset, already holding the pseudo-header sum — and stores the
// complement there (virtio spec, "Packet Transmission"). Like the kernel's
// skb_checksum_help it stores 0xffff instead of 0: for UDP a zero means "no checksum", for
// TCP 0xffff is the equivalent ones'-complement value. The sum runs to the end of frame, so
// frame must not include link-layer padding the sender did not checksum (a TAP read never
// has any).
//
// A frame without NEEDS_CSUM is left untouched (nil). It allocates nothing on success.
func CompleteChecksum(frame []byte, h *Hdr) error {
	if h.Flags&FlagNeedsCsum == 0 {
		return nil
	}
	if h.IsGSO() {
		return fmt.Errorf("%w: CompleteChecksum on GSO frame (gso_type %#x); use Split", ErrBadHeader, h.GSOType)
	}
	if h.Flags&FlagRSCInfo != 0 {
		return fmt.Errorf("%w: NEEDS_CSUM together with RSC_INFO (csum fields hold counters)", ErrBadHeader)
	}
	start, field := int(h.CsumStart), int(h.CsumStart)+int(h.CsumOffset)
	if start >= len(frame) || field+2 > len(frame) {
		return fmt.Errorf("%w: csum_start %d + csum_offset %d + 2 exceeds frame length %d",
			ErrBadHeader, h.CsumStart, h.CsumOffset, len(frame))
	}
	binary.BigEndian.PutUint16(frame[field:], nonZero(Checksum(frame[start:], 0)))
	return nil
}

// Split segments the GSO super-frame frame (an Ethernet frame; the virtio_net_hdr is
// already decoded into h) into plain, fully checksummed Ethernet frames, one per
// gso_size bytes of payload: segment i is written to out[i][:sizes[i]]. It follows
// Linux tcp_gso_segment / __udp_gso_segment (net/ipv4/tcp_offload.c, udp_offload.c) and
// wireguard-go's gsoSplit (tun/offload_linux.go):
//
//   - headers are re-derived with ParseLayout; h.HdrLen is never used (the kernel puts
//     skb_headlen there, include/linux/virtio_net.h virtio_net_hdr_from_skb);
//   - with NEEDS_CSUM, csum_start must equal the L4 offset and csum_offset must be 16
//     (TCP) or 6 (UDP), exactly what the kernel's own segmentation insists on;
//   - IPv4: ID = first ID + i, total length and header checksum recomputed; IPv6:
//     payload length recomputed; Ethernet/VLAN, IPv4 options and IPv6 extension headers
//     are copied unchanged into every segment;
//   - TCP (GSOTCPv4/GSOTCPv6, with or without GSOECN): seq += i×gso_size, FIN and PSH kept
//     only on the last segment, CWR only on the first;
//   - USO (GSOUDPL4): every segment is a whole UDP datagram with its own length;
//   - every L4 checksum is computed from scratch over pseudo-header + segment (a UDP
//     result of 0 is sent as 0xffff), so a bad incoming partial sum cannot leak out.
//
// A payload that fits in one segment yields one frame. Link-layer padding after the IP
// packet is dropped. Nothing is written unless every segment fits, and out[i] must not
// overlap frame. It allocates nothing on success.
func Split(frame []byte, h *Hdr, out [][]byte, sizes []int) (n int, err error) {
	pl, err := plan(frame, h)
	if err != nil {
		return 0, err
	}
	l := pl.l
	hdrLen, payload, mss, nseg := l.PayloadOff, l.PayloadLen(), int(h.GSOSize), pl.Segments
	if nseg > len(out) || nseg > len(sizes) {
		return 0, fmt.Errorf("%w: %d payload bytes at gso_size %d need %d segments, have %d buffers and %d sizes",
			ErrTooManySegments, payload, mss, nseg, len(out), len(sizes))
	}
	for i := range nseg {
		seg := min(mss, payload-i*mss)
		if len(out[i]) < hdrLen+seg {
			return 0, fmt.Errorf("%w: segment %d needs %d bytes, out[%d] has %d",
				ErrShortBuffer, i, hdrLen+seg, i, len(out[i]))
		}
	}

	sf := newSegFields(frame, &pl)
	for i := range nseg {
		first := i * mss
		seg := min(mss, payload-first)
		b := out[i][:hdrLen+seg]
		copy(b, frame[:hdrLen])
		copy(b[hdrLen:], frame[hdrLen+first:hdrLen+first+seg])
		sf.fix(b[:hdrLen], b[hdrLen:], i, nseg)
		sizes[i] = len(b)
	}
	return nseg, nil
}

// SplitHeaders is Split without the payload copy, for a sender that writes each segment
// as two pieces (an iovec pair): it writes segment i's headers — the same bytes Split
// puts in out[i][:HdrLen], L4 checksum included — into hdrs[i][:HdrLen] and sets
// payloads[i] to the slice of frame that Split would copy behind them, so
// hdrs[i][:HdrLen] followed by payloads[i] is byte for byte Split's segment i. The
// checksum is summed over the header slot and then over the payload in place (the
// L4 header is a whole number of 16-bit words, 4×data offset for TCP and 8 for UDP, so
// the two sums chain, RFC 1071 §2(A)); frame is only read, never written, so the
// payload slices stay valid as long as frame does. HdrLen is Plan's. Every check is
// Split's; nothing is written unless every hdrs[i] holds HdrLen bytes, and hdrs[i]
// must not overlap frame. It allocates nothing on success.
func SplitHeaders(frame []byte, h *Hdr, hdrs [][]byte, payloads [][]byte) (n int, err error) {
	pl, err := plan(frame, h)
	if err != nil {
		return 0, err
	}
	l := pl.l
	hdrLen, payload, mss, nseg := l.PayloadOff, l.PayloadLen(), int(h.GSOSize), pl.Segments
	if nseg > len(hdrs) || nseg > len(payloads) {
		return 0, fmt.Errorf("%w: %d payload bytes at gso_size %d need %d segments, have %d header slots and %d payload views",
			ErrTooManySegments, payload, mss, nseg, len(hdrs), len(payloads))
	}
	for i := range nseg {
		if len(hdrs[i]) < hdrLen {
			return 0, fmt.Errorf("%w: segment %d needs %d header bytes, hdrs[%d] has %d",
				ErrShortBuffer, i, hdrLen, i, len(hdrs[i]))
		}
	}
	sf := newSegFields(frame, &pl)
	for i := range nseg {
		first := i * mss
		seg := min(mss, payload-first)
		b := hdrs[i][:hdrLen]
		copy(b, frame[:hdrLen])
		p := frame[hdrLen+first : hdrLen+first+seg : hdrLen+first+seg]
		sf.fix(b, p, i, nseg)
		payloads[i] = p
	}
	return nseg, nil
}

// segFields are the fields of the original frame that every segment's headers derive
// from, read once before any output is produced (the output may be written before the
// next segment is built, and Split's out must not overlap frame anyway).
type segFields struct {
	l        Layout
	proto    uint8
	csumOff  int
	ipID     uint16
	seq      uint32
	tcpFlags uint8
	mss      int
}

func newSegFields(frame []byte, pl *gsoPlan) segFields {
	l := pl.l
	sf := segFields{l: l, proto: pl.proto, csumOff: pl.csumOff, mss: pl.SegCap - pl.HdrLen}
	if !l.IPv6 {
		sf.ipID = binary.BigEndian.Uint16(frame[l.L3Off+4:])
	}
	if pl.proto == ProtoTCP {
		sf.seq = binary.BigEndian.Uint32(frame[l.L4Off+4:])
		sf.tcpFlags = frame[l.L4Off+13]
	}
	return sf
}

// fix turns b, a copy of the original's headers (HdrLen bytes), into segment i of nseg
// whose payload is p: IP lengths, IPv4 ID and header checksum, TCP sequence number and
// flags or UDP length, and the L4 checksum over pseudo-header, b's L4 header and p.
func (sf *segFields) fix(b, p []byte, i, nseg int) {
	l := &sf.l
	segLen := len(b) + len(p)
	ip := b[l.L3Off:l.L4Off]
	if l.IPv6 {
		binary.BigEndian.PutUint16(ip[4:], uint16(segLen-l.L3Off-ipv6HdrLen))
	} else {
		binary.BigEndian.PutUint16(ip[2:], uint16(segLen-l.L3Off))
		binary.BigEndian.PutUint16(ip[4:], sf.ipID+uint16(i))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], Checksum(ip, 0))
	}
	l4 := b[l.L4Off:]
	l4Len := len(l4) + len(p)
	if sf.proto == ProtoTCP {
		binary.BigEndian.PutUint32(l4[4:], sf.seq+uint32(i*sf.mss))
		f := sf.tcpFlags
		if i != nseg-1 {
			f &^= tcpFIN | tcpPSH
		}
		if i != 0 {
			f &^= tcpCWR
		}
		l4[13] = f
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(l4Len))
	}
	l4[sf.csumOff], l4[sf.csumOff+1] = 0, 0
	csum := Checksum(p, Sum(l4, l.PseudoHeaderSum(b, l4Len)))
	if sf.proto == ProtoUDP {
		csum = nonZero(csum)
	}
	binary.BigEndian.PutUint16(l4[sf.csumOff:], csum)
}

// SplitPlan is what Split will make of one GSO frame, known before it runs so a caller
// can reserve the output buffers first.
type SplitPlan struct {
	HdrLen   int // header bytes every segment repeats: Ethernet/VLAN, IP with options or extension headers, TCP/UDP
	SegCap   int // the longest segment: HdrLen + gso_size (only the last may be shorter)
	Segments int // ⌈payload / gso_size⌉ ≥ 1
}

// Plan checks that Split can segment frame (its virtio_net_hdr decoded into h) and
// returns the plan: every check Split makes, and at most MaxSegments segments (the
// output buffers a receiver keeps; ErrTooManySegments beyond). A nil error means that
// Split, given Segments buffers of at least SegCap bytes, succeeds. It is the one
// statement of the segment arithmetic (segments of gso_size payload bytes each behind a
// copy of the headers, as tcp_gso_segment and __udp_gso_segment cut them,
// net/ipv4/tcp_offload.c and udp_offload.c); ValidatePeer and Split use it too. It
// allocates nothing on success.
func Plan(frame []byte, h *Hdr) (SplitPlan, error) {
	pl, err := plan(frame, h)
	if err != nil {
		return SplitPlan{}, err
	}
	if pl.Segments > MaxSegments {
		return SplitPlan{}, fmt.Errorf("%w: %d payload bytes at gso_size %d need %d segments, more than %d",
			ErrTooManySegments, pl.l.PayloadLen(), h.GSOSize, pl.Segments, MaxSegments)
	}
	return pl.SplitPlan, nil
}

// gsoPlan is a SplitPlan with what Split needs besides: the frame's layout and the L4
// protocol and checksum field offset the GSO type implies.
type gsoPlan struct {
	SplitPlan
	l       Layout
	proto   uint8
	csumOff int
}

// plan is Plan without the segment limit, which differs by caller (ValidatePeer holds USO
// to MaxUSOSegments, Split to its buffers). The rules are the kernel's own segmentation
// rules (tcp_gso_segment, __udp_gso_segment):
//   - gso_type is TCPv4 or TCPv6 (either with the ECN bit) or UDP_L4 (without it); UFO
//     and unknown values are ErrUnsupportedGSO;
//   - gso_size > 0, and the headers parse (ParseLayout) as IPv4 for TCPv4, IPv6 for
//     TCPv6, either for UDP_L4, carrying TCP resp. UDP, not a fragment, with no IPv6
//     Routing header with segments left (its L4 checksum uses another address);
//   - with NEEDS_CSUM, csum_start is the L4 header and csum_offset its checksum field
//     (16 TCP, 6 UDP); NEEDS_CSUM together with RSC_INFO is refused (the checksum
//     fields then hold counters);
//   - the payload is not empty.
func plan(frame []byte, h *Hdr) (gsoPlan, error) {
	var pl gsoPlan
	gsoType := h.GSOType &^ GSOECN
	switch gsoType {
	case GSOTCPv4, GSOTCPv6:
		pl.proto, pl.csumOff = ProtoTCP, 16
	case GSOUDPL4:
		if h.GSOType&GSOECN != 0 {
			return pl, fmt.Errorf("%w: gso_type %#x: ECN bit on UDP_L4", ErrBadHeader, h.GSOType)
		}
		pl.proto, pl.csumOff = ProtoUDP, 6
	case GSONone:
		return pl, fmt.Errorf("%w: Split on a non-GSO frame (gso_type %#x)", ErrBadHeader, h.GSOType)
	default:
		return pl, fmt.Errorf("%w: %#x", ErrUnsupportedGSO, h.GSOType)
	}
	if h.GSOSize == 0 {
		return pl, fmt.Errorf("%w: gso_size 0 with gso_type %#x", ErrBadHeader, h.GSOType)
	}
	l, err := ParseLayout(frame)
	if err != nil {
		return pl, fmt.Errorf("%w: gso_type %#x: %w", ErrBadHeader, h.GSOType, err)
	}
	switch {
	case gsoType == GSOTCPv4 && l.IPv6, gsoType == GSOTCPv6 && !l.IPv6, l.L4Proto != pl.proto:
		return pl, fmt.Errorf("%w: gso_type %#x but IPv6=%t L4 protocol %d", ErrBadHeader, h.GSOType, l.IPv6, l.L4Proto)
	case l.Fragment:
		return pl, fmt.Errorf("%w: gso_type %#x on an IP fragment", ErrBadHeader, h.GSOType)
	case l.Routed:
		return pl, fmt.Errorf("%w: gso_type %#x with an IPv6 Routing header (segments left > 0)", ErrUnsupportedGSO, h.GSOType)
	}
	if h.Flags&FlagNeedsCsum != 0 {
		if h.Flags&FlagRSCInfo != 0 {
			return pl, fmt.Errorf("%w: NEEDS_CSUM together with RSC_INFO (csum fields hold counters)", ErrBadHeader)
		}
		if int(h.CsumStart) != l.L4Off || int(h.CsumOffset) != pl.csumOff {
			return pl, fmt.Errorf("%w: csum_start %d csum_offset %d, want %d and %d",
				ErrBadHeader, h.CsumStart, h.CsumOffset, l.L4Off, pl.csumOff)
		}
	}
	payload, mss := l.PayloadLen(), int(h.GSOSize)
	if payload == 0 {
		return pl, fmt.Errorf("%w: gso_type %#x with 0 payload bytes", ErrBadHeader, h.GSOType)
	}
	pl.l = l
	pl.HdrLen, pl.SegCap, pl.Segments = l.PayloadOff, l.PayloadOff+mss, Segments(payload, mss)
	return pl, nil
}

// Segments is how many segments payload bytes make at gso_size bytes each: the last
// one carries the remainder (tcp_gso_segment, __udp_gso_segment). gsoSize must be > 0.
func Segments(payload, gsoSize int) int {
	return (payload + gsoSize - 1) / gsoSize
}

// TCP flag bits in header byte 13.
const (
	tcpFIN = 0x01
	tcpPSH = 0x08
	tcpCWR = 0x80
)

// nonZero maps a computed checksum of 0 to 0xffff, its ones'-complement twin: UDP reserves
// 0 for "no checksum" (RFC 768; mandatory over IPv6, RFC 8200 §8.1), and the kernel's
// skb_checksum_help applies the same substitution (CSUM_MANGLED_0).
func nonZero(c uint16) uint16 {
	if c == 0 {
		return 0xffff
	}
	return c
}
