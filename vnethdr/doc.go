// Package vnethdr encodes and decodes the virtio_net_hdr that precedes every frame on a TAP
// opened with IFF_VNET_HDR (and on netmap VALE ports), locates packet headers, computes
// internet checksums, and does software GSO: it turns a 64 KiB TSO/USO super-frame from
// the TAP into MTU-sized, fully checksummed frames for a peer that cannot take offloads
// (QEMU's socket/stream/dgram backends carry no header at all: they define no
// has_vnet_hdr).
//
// # Header
//
// Two layouts are used (include/uapi/linux/virtio_net.h): the legacy 10-byte header (flags,
// gso_type, hdr_len, gso_size, csum_start, csum_offset) and the 12-byte mrg_rxbuf / virtio
// 1.0 header that appends num_buffers. Longer headers (20-byte hash report) can be encoded:
// the bytes after num_buffers are written as zero, and ignored on decode. Multi-byte fields
// are always little-endian — virtio 1.0 says so, and the TAP's legacy "host order" is
// little-endian on x86_64 (drivers/net/tun_vnet.h) — and Hdr encodes them explicitly so the
// code does not depend on the host's byte order. On a TAP read the bytes past offset 10 are
// undefined (older kernels skip them, newer ones zero them: drivers/net/tun.c
// tun_put_user); callers set num_buffers themselves.
//
// # Trust rules
//
// Everything in a header, from the kernel or from a peer, is input to be checked, never
// an instruction to be followed blindly:
//   - hdr_len is only a hint (the kernel reports skb_headlen, which can span the whole
//     first segment: include/linux/virtio_net.h virtio_net_hdr_from_skb). It is never used:
//     the header length is re-derived by ParseLayout from the IP and TCP/UDP headers.
//   - csum_start/csum_offset are bounds-checked before use. For GSO frames csum_start
//     must point exactly at the L4 header and csum_offset at its checksum field (16 TCP,
//     6 UDP): that is what the kernel's tcp_gso_segment/__udp_gso_segment insist on
//     (net/ipv4/tcp_offload.c, net/ipv4/udp_offload.c), and anything else means the
//     header and frame disagree.
//   - IP lengths, not the frame length, bound the packet; Ethernet padding after the IP
//     packet is never treated as payload (a short frame is padded to 60 bytes; DPDK's
//     GRO counted the padding as payload until commit b8a55871d5).
//   - A checksum produced by Split is computed over the bytes actually sent, never
//     derived from the partial value in the input, so a corrupt partial sum cannot be
//     "laundered" into a valid-looking segment.
//   - A frame whose header came from an untrusted sender (a vnet-hdr=on peer, a
//     vhost-user driver) passes ValidatePeer before anything acts on that header. It
//     applies what the kernel's TAP write path checks (drivers/net/tun.c tun_get_user,
//     include/linux/virtio_net.h virtio_net_hdr_to_skb) and more, and replaces hdr_len
//     with the re-derived value, so a header the kernel would refuse is dropped by the
//     receiver and never reaches a TAP, where a refusal would be taken as the kernel's
//     verdict on GSO.
//
// # Software GSO
//
// Split copies the re-derived headers (Ethernet, optional VLAN tag, IP with options or
// extension headers, TCP/UDP) in front of each gso_size slice of payload and fixes them
// up the way Linux tcp_gso_segment (net/ipv4/tcp_offload.c) and wireguard-go's gsoSplit
// (tun/offload_linux.go) do:
// IPv4 ID incremented per segment (first ID + i), IPv4 total length and header checksum
// or IPv6 payload length rewritten, TCP sequence advanced by i × gso_size, FIN and PSH
// kept only on the last segment and CWR only on the first; for USO each segment gets its
// own UDP length. Every L4 checksum is computed in full over pseudo-header and segment.
// The caller owns all memory: it passes out buffers and a sizes slice; nothing is
// allocated and nothing is written unless every segment fits. A full IPv4 TSO frame
// (65535 - 20 - 20 = 65495 payload bytes) needs 46 buffers at an MSS of 1448 and 123 at
// the classic minimum MSS of 536; USO frames are capped by the kernel at 64 or 128
// segments (UDP_MAX_SEGMENTS in include/linux/udp.h). Smaller MSS values (Linux allows down
// to tcp_min_snd_mss = 48) need more buffers than a sane caller provides: such frames fail
// with ErrTooManySegments and are dropped and counted.
//
// SplitHeaders is Split for a sender that writes each segment as an iovec pair: it
// builds only each segment's headers, in a small slot the caller passes, and returns the
// segment's payload as a view of the input frame, which it only reads (the L4 checksum
// is summed over the slot and then over the payload in place; the L4 header is a whole
// number of 16-bit words, so the two sums chain, RFC 1071). Slot plus view is byte for
// byte Split's segment; the TAP→port pipeline (package datapath) uses it so no payload
// byte is copied in userspace. Both share one segment fix-up (segFields.fix).
//
// Plan is the one statement of the segment arithmetic: it makes every check Split makes
// and says how many segments of what size Split will write, so a caller reserves its
// output buffers (the datapath: receive-pool buffers) before Split runs. Which frames
// need Split or CompleteChecksum at all is Offloads.AcceptsFrame, per frame, and
// Offloads.Partition, per negotiation. CompleteChecksum follows the virtio rule — sum
// from csum_start to the end, the field already holding the pseudo-header sum — and the
// kernel's skb_checksum_help in never storing 0.
//
// # Checksum arithmetic
//
// Sum returns an unfolded 64-bit ones'-complement accumulator that callers chain over
// even-length pieces (pseudo-header, L4 header, payload) and reduce with Fold (RFC 1071
// §2). Its bulk is a pure-Go add-with-carry chain over little-endian words, swapped once
// (§2(B)); on amd64 with AVX2 (x/sys/cpu, chosen at init; not with the purego tag) the
// bulk of inputs from 192 bytes is checksum_amd64.s instead: 32-bit words added into
// 64-bit vector lanes, which cannot carry for any slice that fits in memory in practice
// (< 16 GiB per call, and Sum feeds 1 GiB chunks). Fold(Sum(b, acc)) is the same on every
// path for every input. SumCopy is the fused form for a payload that is copied anyway
// (the coalescer): one load, one store and the adds per 32-byte block, never a read or
// write outside src and dst[:len(src)].
//
// # What is not supported
//
//   - UFO (GSOUDP, IP fragmentation of a large UDP datagram): rejected with
//     ErrUnsupportedGSO; no current kernel produces it (drivers/net/tun.c set_offload
//     ignores TUN_F_UFO).
//   - UDP-tunnel GSO and the 20/24-byte header extensions' semantics (hash report,
//     tunnel offsets): not interpreted.
//   - IPv4 options are carried as-is into every segment (Linux TSO does the same); they
//     are not filtered by the "copied" bit the way IP fragmentation would.
//   - IPv6 GSO frames with a Routing header that still has segments left are rejected:
//     their pseudo-header uses a destination address not in the IPv6 header.
//   - GSO on IP fragments, on frames with two VLAN tags (QinQ), and with gso_size 0 is
//     rejected; BIG TCP (IPv4 total length 0 / IPv6 jumbograms) is not parsed.
//   - RSC_INFO headers: csum_start/csum_offset then carry counters, so NEEDS_CSUM
//     together with RSC_INFO is rejected.
//
// The package never logs and keeps no state; every error wraps one of the sentinels
// (ErrMalformed, ErrNotIP, ErrBadHeader, ErrUnsupportedGSO, ErrTooManySegments,
// ErrShortBuffer, ErrShortHeader) whose doc says how a caller reacts: drop and count.
package vnethdr
