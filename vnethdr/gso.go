package vnethdr

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Errors returned by CompleteChecksum, Split and Segment. Each is returned wrapped with
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
	gsoType := h.GSOType &^ GSOECN
	var wantProto uint8
	var csumOff int
	switch gsoType {
	case GSOTCPv4, GSOTCPv6:
		wantProto, csumOff = ProtoTCP, 16
	case GSOUDPL4:
		if h.GSOType&GSOECN != 0 {
			return 0, fmt.Errorf("%w: gso_type %#x: ECN bit on UDP_L4", ErrBadHeader, h.GSOType)
		}
		wantProto, csumOff = ProtoUDP, 6
	case GSONone:
		return 0, fmt.Errorf("%w: Split on a non-GSO frame (gso_type %#x)", ErrBadHeader, h.GSOType)
	default:
		return 0, fmt.Errorf("%w: %#x", ErrUnsupportedGSO, h.GSOType)
	}
	if h.GSOSize == 0 {
		return 0, fmt.Errorf("%w: gso_size 0 with gso_type %#x", ErrBadHeader, h.GSOType)
	}
	l, err := ParseLayout(frame)
	if err != nil {
		return 0, fmt.Errorf("%w: GSO frame: %w", ErrBadHeader, err)
	}
	switch {
	case gsoType == GSOTCPv4 && l.IPv6, gsoType == GSOTCPv6 && !l.IPv6, l.L4Proto != wantProto:
		return 0, fmt.Errorf("%w: gso_type %#x but IPv6=%t L4 protocol %d", ErrBadHeader, h.GSOType, l.IPv6, l.L4Proto)
	case l.Fragment:
		return 0, fmt.Errorf("%w: gso_type %#x on an IP fragment", ErrBadHeader, h.GSOType)
	case l.Routed:
		return 0, fmt.Errorf("%w: gso_type %#x with an IPv6 Routing header (segments left > 0)", ErrUnsupportedGSO, h.GSOType)
	}
	if h.Flags&FlagNeedsCsum != 0 {
		if h.Flags&FlagRSCInfo != 0 {
			return 0, fmt.Errorf("%w: NEEDS_CSUM together with RSC_INFO (csum fields hold counters)", ErrBadHeader)
		}
		if int(h.CsumStart) != l.L4Off || int(h.CsumOffset) != csumOff {
			return 0, fmt.Errorf("%w: csum_start %d csum_offset %d, want %d and %d",
				ErrBadHeader, h.CsumStart, h.CsumOffset, l.L4Off, csumOff)
		}
	}
	hdrLen, payload, mss := l.PayloadOff, l.PayloadLen(), int(h.GSOSize)
	if payload == 0 {
		return 0, fmt.Errorf("%w: gso_type %#x with 0 payload bytes", ErrBadHeader, h.GSOType)
	}
	nseg := (payload + mss - 1) / mss
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

	// Fields of the original, read once before any output is produced.
	var ipID uint16
	if !l.IPv6 {
		ipID = binary.BigEndian.Uint16(frame[l.L3Off+4:])
	}
	var seq uint32
	var tcpFlags uint8
	if wantProto == ProtoTCP {
		seq = binary.BigEndian.Uint32(frame[l.L4Off+4:])
		tcpFlags = frame[l.L4Off+13]
	}
	l4HdrLen := hdrLen - l.L4Off

	for i := range nseg {
		first := i * mss
		seg := min(mss, payload-first)
		b := out[i][:hdrLen+seg]
		copy(b, frame[:hdrLen])
		copy(b[hdrLen:], frame[hdrLen+first:hdrLen+first+seg])

		ip := b[l.L3Off:l.L4Off]
		if l.IPv6 {
			binary.BigEndian.PutUint16(ip[4:], uint16(len(b)-l.L3Off-ipv6HdrLen))
		} else {
			binary.BigEndian.PutUint16(ip[2:], uint16(len(b)-l.L3Off))
			binary.BigEndian.PutUint16(ip[4:], ipID+uint16(i))
			ip[10], ip[11] = 0, 0
			binary.BigEndian.PutUint16(ip[10:], Checksum(ip, 0))
		}

		l4 := b[l.L4Off:]
		if wantProto == ProtoTCP {
			binary.BigEndian.PutUint32(l4[4:], seq+uint32(first))
			f := tcpFlags
			if i != nseg-1 {
				f &^= tcpFIN | tcpPSH
			}
			if i != 0 {
				f &^= tcpCWR
			}
			l4[13] = f
		} else {
			binary.BigEndian.PutUint16(l4[4:], uint16(l4HdrLen+seg))
		}
		l4[csumOff], l4[csumOff+1] = 0, 0
		csum := Checksum(l4, l.PseudoHeaderSum(b, len(l4)))
		if wantProto == ProtoUDP {
			csum = nonZero(csum)
		}
		binary.BigEndian.PutUint16(l4[csumOff:], csum)
		sizes[i] = len(b)
	}
	return nseg, nil
}

// Segment prepares one frame read from the TAP for a port that takes neither GSO nor
// partial checksums:
//   - GSO (h.IsGSO()): Split into out/sizes; inPlace is false and n frames are in out.
//   - NEEDS_CSUM only: CompleteChecksum in place; n = 1, inPlace = true: send frame.
//   - neither: nothing to do; n = 1, inPlace = true: send frame as is.
//
// On error n is 0 and the frame is to be dropped and counted (see the Err* sentinels).
func Segment(frame []byte, h *Hdr, out [][]byte, sizes []int) (n int, inPlace bool, err error) {
	if h.IsGSO() {
		n, err = Split(frame, h, out, sizes)
		return n, false, err
	}
	if err := CompleteChecksum(frame, h); err != nil {
		return 0, true, err
	}
	return 1, true, nil
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
