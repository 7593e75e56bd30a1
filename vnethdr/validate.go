package vnethdr

import (
	"errors"
	"fmt"
)

// MaxSegments is the most segments ValidatePeer admits for a TCP GSO frame. The
// kernel's own limit is GSO_MAX_SEGS (65535, include/linux/netdevice.h); a frame that a
// receiver must be able to split in software needs one output buffer per segment, and
// 1024 covers a 64 KiB frame down to an MSS of 64. USO frames are held to
// MaxUSOSegments.
const MaxSegments = 1024

// MaxUSOSegments is UDP_MAX_SEGMENTS (include/linux/udp.h): the most datagrams one
// UDP_L4 GSO frame may carry. It is 128 in current kernels and was 64 before, and
// virtio_net_hdr_to_skb refuses a larger frame; no sender can build one (udp_send_skb
// refuses the same).
const MaxUSOSegments = 128

// MaxUSOSegmentsOld is UDP_MAX_SEGMENTS as it was before it became 128
// (include/linux/udp.h): the most datagrams of one UDP_L4 GSO frame every kernel takes.
// A frame of more is split before it reaches a TAP, and the GRO engine builds none.
const MaxUSOSegmentsOld = 64

// ValidatePeer checks the virtio_net_hdr h that an untrusted sender attached to the
// Ethernet frame frame, before tapgro writes the two to a TAP or hands them to anything
// else that acts on the header: a vnet-hdr=on peer's records, and a vhost-user driver's
// descriptors. It is the one place this rule lives. It is at least as strict as the
// kernel's write path (drivers/net/tun.c tun_get_user and
// include/linux/virtio_net.h virtio_net_hdr_to_skb), so a frame it admits is refused by
// the kernel only if that kernel refuses GSO of that kind as such; a frame it rejects is
// to be dropped and counted as malformed, never written.
//
// A frame without GSO (gso_type 0) and without NEEDS_CSUM carries nothing the kernel
// acts on: it is admitted unchecked. Otherwise:
//
//   - flags hold only NEEDS_CSUM and DATA_VALID (RSC_INFO repurposes the checksum
//     fields; other bits are not meant for this direction);
//   - hdr_len, a hint, fits the frame: not past its end, and 0 or at least an Ethernet
//     header, which tun_get_user refuses otherwise (EINVAL);
//   - gso_type is NONE, TCPV4, TCPV6 (either with the ECN bit) or UDP_L4 (without it):
//     UFO, the tunnel types and unknown values are refused, and so is the ECN bit alone
//     or on UDP;
//   - a GSO frame is IPv4 for TCPV4, IPv6 for TCPV6, either for UDP_L4, carrying TCP
//     resp. UDP, not a fragment, without an IPv6 Routing header with segments left; its
//     headers parse (ParseLayout) and it ends where its IP packet ends: segmentation
//     cuts a frame by its length, not by the IP length (net/core/skbuff.c
//     skb_segment), so trailing bytes would end up as payload of the last segment;
//   - 0 < gso_size ≤ payload bytes: a frame that does not fill one segment is no GSO
//     frame, and gso_size 0xffff (GSO_BY_FRAGS, which virtio_net_hdr_to_skb refuses)
//     never fits a payload;
//   - segments = ⌈payload / gso_size⌉ ≤ MaxSegments (TCP) or MaxUSOSegments (UDP_L4);
//   - with NEEDS_CSUM, csum_start is the L4 header and csum_offset its checksum field
//     (16 TCP, 6 UDP), as tcp_gso_segment/__udp_gso_segment and virtio_net_hdr_to_skb
//     insist; UDP_L4 requires NEEDS_CSUM (virtio_net_hdr_to_skb);
//   - a NEEDS_CSUM frame without GSO has its checksum field inside the IP packet (not in
//     link-layer padding), at or after the L4 header: for TCP exactly the TCP checksum
//     field; for UDP the UDP checksum field or one in the UDP payload (the inner L4
//     checksum of a UDP tunnel such as VXLAN, left partial for a device that takes
//     encapsulated checksums).
//
// On success h.HdrLen is rewritten with the re-derived value — for GSO frames the
// Ethernet, VLAN, IP, extension and TCP/UDP header bytes every segment replicates, for
// a partial checksum the bytes up to the end of the L4 header or of the checksum field,
// whichever is later — so the header written on carries no value the sender chose. On
// error h is unchanged; the error wraps ErrBadHeader or ErrUnsupportedGSO, and
// ErrMalformed too when the frame's own headers do not parse. It allocates nothing
// unless it returns an error.
func ValidatePeer(frame []byte, h *Hdr) error {
	if h.GSOType == GSONone && h.Flags&^FlagDataValid == 0 {
		return nil
	}
	if h.Flags&^(FlagNeedsCsum|FlagDataValid) != 0 {
		return fmt.Errorf("%w: flags %#x: only NEEDS_CSUM and DATA_VALID are accepted from a sender", ErrBadHeader, h.Flags)
	}
	if int(h.HdrLen) > len(frame) || (h.HdrLen != 0 && h.HdrLen < ethHdrLen) {
		return fmt.Errorf("%w: hdr_len %d with a %d-byte frame", ErrBadHeader, h.HdrLen, len(frame))
	}
	maxSegs := MaxSegments
	switch h.GSOType &^ GSOECN {
	case GSONone:
		if h.GSOType&GSOECN != 0 {
			return fmt.Errorf("%w: gso_type %#x: ECN bit without a GSO type", ErrBadHeader, h.GSOType)
		}
		return validatePartial(frame, h)
	case GSOUDPL4:
		if h.GSOType&GSOECN == 0 && h.Flags&FlagNeedsCsum == 0 {
			return fmt.Errorf("%w: UDP_L4 GSO without NEEDS_CSUM", ErrBadHeader)
		}
		maxSegs = MaxUSOSegments
	}
	// Split's own rules (gso_type, headers, checksum fields); the rest is what the
	// kernel's write path adds to them.
	pl, err := plan(frame, h)
	if err != nil {
		return err
	}
	l := pl.l
	if l.End != len(frame) {
		return fmt.Errorf("%w: gso_type %#x with %d bytes after the IP packet", ErrBadHeader, h.GSOType, len(frame)-l.End)
	}
	if payload := l.PayloadLen(); int(h.GSOSize) > payload {
		return fmt.Errorf("%w: gso_size %d with %d payload bytes", ErrBadHeader, h.GSOSize, payload)
	}
	if pl.Segments > maxSegs {
		return fmt.Errorf("%w: %d payload bytes at gso_size %d are %d segments, more than %d",
			ErrBadHeader, l.PayloadLen(), h.GSOSize, pl.Segments, maxSegs)
	}
	h.HdrLen = uint16(l.PayloadOff)
	return nil
}

// validatePartial checks the checksum fields of a NEEDS_CSUM frame without GSO (see
// ValidatePeer) and sets h.HdrLen.
func validatePartial(frame []byte, h *Hdr) error {
	start, field := int(h.CsumStart), int(h.CsumStart)+int(h.CsumOffset)
	l, err := ParseLayout(frame)
	var from, end int
	switch {
	case err == nil:
		from, end = l.L4Off, l.End
	case errors.Is(err, ErrNotIP):
		// A protocol ParseLayout does not parse (a QinQ-tagged frame, say): the field
		// must at least lie after the link-layer header, inside the frame.
		from, end, l.PayloadOff = l.L3Off, len(frame), 0
	default:
		return fmt.Errorf("%w: NEEDS_CSUM: %w", ErrBadHeader, err)
	}
	if start < from || field+2 > end {
		return fmt.Errorf("%w: csum_start %d csum_offset %d outside [%d, %d)",
			ErrBadHeader, h.CsumStart, h.CsumOffset, from, end)
	}
	switch {
	case err != nil:
	case l.IsTCP() && (start != l.L4Off || h.CsumOffset != 16):
		return fmt.Errorf("%w: csum_start %d csum_offset %d on TCP, want %d and 16",
			ErrBadHeader, h.CsumStart, h.CsumOffset, l.L4Off)
	case l.IsUDP() && start < l.PayloadOff && (start != l.L4Off || h.CsumOffset != 6):
		// Past the UDP header is the inner checksum of a UDP tunnel (VXLAN, Geneve).
		return fmt.Errorf("%w: csum_start %d csum_offset %d on UDP, want %d and 6 or a field past the UDP header",
			ErrBadHeader, h.CsumStart, h.CsumOffset, l.L4Off)
	}
	h.HdrLen = uint16(max(l.PayloadOff, field+2))
	return nil
}
