// Package coalescer is tapgro's userspace GRO engine: it merges runs of MTU-sized TCP
// segments (and, optionally, equal-sized UDP datagrams) of one flow into 64 KB GSO
// packets behind a virtio_net_hdr, so a TAP opened with IFF_VNET_HDR receives one write
// instead of ~45 (issue 3). The rules are Linux's (net/ipv4/tcp_offload.c
// tcp_gro_receive, net/ipv4/af_inet.c inet_gro_receive, net/ipv6/ip6_offload.c
// ipv6_gro_receive, net/core/gro.c skb_gro_receive) for what may merge, wireguard-go's
// tun/offload_linux.go for the virtio encoding, and gVisor's for flushing at the end of
// each read batch. The engine knows nothing about direction or I/O: frames go in through
// Add, packets come out through the emit callback.
//
// # Data flow
//
// Add parses the Ethernet (+ one 802.1Q tag), IPv4/IPv6 and TCP/UDP headers itself (only
// the fields it needs) and builds a fixed 56-byte flow key: MACs, VLAN tag, IP version,
// L4 protocol, addresses, ports and the IPv6 flow label. The key is hashed with
// hash/maphash into a chained table of 2×MaxFlows buckets. A frame that may be coalesced
// either joins its flow's open aggregate or starts a new one. Any other frame is emitted
// at once without copying: a fresh header (zero, or the arrival header for GSO and
// NEEDS_CSUM frames) is written into the caller's headroom and emit sees the caller's
// buffer.
//
// # Copying and referencing
//
// An aggregate is the head segment's headers, copied into the aggregate's own buffer
// because emitting rewrites them (IP length, ID and checksum, TCP flags and window, the
// virtio header in front), followed by the payloads of its segments in two parts: a flat
// part in that buffer, then references (slices) into the caller's buffers. Add copies:
// each payload goes into the flat part as its checksum is verified, so the caller may
// reuse its buffer as soon as Add returns (vhostnet, whose frames sit in guest memory,
// and the vnet-hdr ports, whose frames are lent until the end of the batch). AddRef
// references: the checksum is verified in place, read only, the payload stays where it
// is, and the aggregate is emitted through SetEmitV's callback as one iovec list,
// [virtio header + headers + flat part][payload]…, which the datapath hands to one
// writev(2) on the TAP, so the only copy of a payload is the kernel's. A lone segment is
// emitted from the caller's buffer itself, behind a header written into its headroom.
// Config.RefMinPayload makes AddRef copy aggregates of small segments anyway: a
// gathered write costs the kernel per iovec, which for MTU-sized segments is more than
// the copy saves (the datapath's groRefMinPayload gives the measurement).
//
// Ownership is explicit. AddRef takes a tag naming the caller's buffer (Config.RefTags
// of them); the engine counts the references it holds per tag and drops an
// aggregate's when it is emitted, so after Flush nothing is referenced. An aggregate
// can outlive a read (timer mode, eviction, a batch that ends while the port has more
// buffered), so before the caller refills a buffer it calls Release(tag): each
// aggregate still referring to that buffer copies everything it references into its flat
// part (copy on hold, counted in Stats.HeldCopies) and stays held. What the engine
// emits, and when, is the same either way: the merge decisions never look at where the
// payload is. An aggregate holds at most MaxRefs references (default 128: a 64 KB
// aggregate of segments down to 512 bytes); the next one copies the referenced part
// into the flat part first, so a packet never needs more than MaxRefs+1 iovecs, within
// writev's UIO_MAXIOV (1024, include/uapi/linux/uio.h).
//
// # Merge rules
//
// A frame is eligible when it is IPv4 with IHL=5, not a fragment and with a valid header
// checksum, or IPv6 whose chain before TCP/UDP holds only Hop-by-Hop, Routing (no
// segments left) and Destination Options headers, the ones Linux ipv6_gro_receive pulls;
// and TCP with ACK, no SYN/RST/URG, payload > 0 (CWR only if Config.ECN), or UDP
// (Config.UDP) with a nonzero checksum and payload > 0. It joins its flow's aggregate
// only if: an IPv6 extension header chain is byte-identical to the aggregate's, first
// next header included (ipv6_gro_receive's memcmp); TOS/TTL/DF (IPv6: traffic class and
// hop limit) are equal; the IPv4 ID grows by exactly 1 per segment, or stays constant
// with DF set or clear, the pattern being fixed by the second segment and a change of
// pattern flushing (Linux 6.18 inet_gro_flush; its GRO selftest "DF=0, Fixed - should
// coalesce"); TCP flags other than PSH/FIN equal, no CWR, ack_seq equal, data offset and
// option bytes (timestamps included) equal, seq exactly contiguous; the payload is not
// larger than the first segment's (gso_size); and the IP length (IPv6: 40 + payload
// length, extension headers included) stays <= 65535, as net/core/gro.c
// skb_gro_receive allows. A segment that would pass 65535 starts the next packet, so a
// flow whose segments add up exactly gets 65495 TCP payload bytes per IPv4 packet and
// 65475 per IPv6 packet (20-byte IP and TCP headers), as under Linux. Sizes come from
// the IP header, never the frame length, so Ethernet padding is ignored. The L4 checksum
// of every segment, the first included, is verified in software (Add: as its payload
// is copied, in one pass on amd64 with AVX2, see sumCopy; AddRef: in place), unless the arrival
// header says NEEDS_CSUM or DATA_VALID: merging would otherwise launder a corrupted
// segment, since the output asks the kernel to compute a fresh sum.
//
// # Ordering guarantee
//
// One aggregate per flow, and a same-flow frame never overtakes held data: whenever a
// keyed frame cannot join (any rule above, pure or duplicate ACK, SYN/RST/URG/bare FIN,
// IP options, first fragment, a different or routed IPv6 extension header chain, bad
// checksum, GSO input) the
// flow's aggregate is emitted first, and then the frame either starts a new aggregate or
// passes through. Frames whose flow cannot be identified (malformed, non-first
// fragments, non-TCP/UDP) pass through at once; they belong to no aggregate. Across
// flows, Flush emits aggregates oldest first. Per flow, re-segmenting the output gives
// back exactly the input, byte for byte and in order (property test), except that a
// constant-ID aggregate comes back with incrementing IDs: virtio has no FIXEDID flag
// (Linux SKB_GSO_TCP_FIXEDID), so the kernel's segmentation renumbers them. That is
// harmless: with DF set the ID carries no meaning (RFC 6864), and with DF clear distinct
// IDs are what reassembly needs (RFC 6864 section 4.1 forbids repeating them).
//
// Linux treats a frame whose extension header chain differs as another flow and holds
// both aggregates; here the flow key cannot hold a chain, and holding two aggregates of
// one 5-tuple could let the younger one's data out after later data of the older, so
// the held aggregate is flushed instead. Groupings differ only on flows that change
// their chain mid-stream.
//
// # Flush triggers
//
// An aggregate is emitted when: a segment with PSH or FIN, or shorter than gso_size,
// was merged into it (it ends there); it holds MaxSegments segments (default 1024, so
// for segments of 64 bytes or more the size binds first, as Linux TCP GRO counts no
// segments; UDP: at most 64, UDP_MAX_SEGMENTS of older kernels); it holds exactly 65535
// IP bytes; a segment that would pass 65535 arrives (it starts the next aggregate; a
// packet that only a full segment would overflow is held, because a short tail may
// still fit, as in Linux); its flow sees a frame that cannot join; the table is full and it is the oldest
// (eviction delivers, never drops); Flush is called (end of each read batch, the
// default policy); or FlushExpired finds it older than the timer (timer mode, driven by
// the I/O loop's poll deadline via Oldest, never a Go timer per flow). Every decision is
// counted in Stats under a Reason and reported to Config.Trace if set.
//
// # Output encoding
//
// A lone segment is emitted as the frame it arrived as (padding included) behind a zero
// header, or behind its arrival header if that was NEEDS_CSUM. Two or more segments
// become one packet with flags NEEDS_CSUM, gso_type TCPV4/TCPV6 (|ECN if the head
// carried CWR) or UDP_L4, gso_size = the first segment's payload, hdr_len = L2+L3+L4
// header bytes, csum_start = L2 header (14, or 18 with VLAN) + IP header length + IPv6
// extension headers (a TAP frame has an Ethernet header, unlike TUN; drivers/net/tun.c
// and Linux tcp_gso_segment need csum_start at the L4 header), hdr_len covering the
// extension headers too, csum_offset 16 (TCP) or 6 (UDP), and the L4
// checksum field holding the folded, uncomplemented pseudo-header sum for the new
// length. IPv4 total length and header checksum, IPv6 payload length and the UDP length
// are rewritten. The head's IPv4 ID and ack are kept; the TCP window is the last
// segment's (QEMU RSC does this; Linux keeps the head's — taking the newest never hides
// a window update), and PSH/FIN of the last segment are ORed into the flags.
//
// # Memory
//
// New allocates everything: MaxFlows buffers of VnetHdrLen+18+65535 bytes (64 flows ×
// 65565 bytes ≈ 4.2 MB at the defaults; with AddRef they still take a copy on hold),
// the bucket array and a free stack, and with RefTags the reference arrays (MaxRefs per
// flow: 64 × 128 slices ≈ 230 KB) and the per-tag counts. Add, AddRef, Release, Flush
// and FlushExpired allocate nothing (TestAllocs, the benchmarks). SetConfig reallocates
// only if MaxFlows, VnetHdrLen, RefTags or MaxRefs grew. The engine is single-goroutine;
// Stats are atomics readable from anywhere.
//
// # Deliberately not done
//
//   - No reordering or prepend stitching within a batch (wireguard-go, DPDK): it buys
//     little and is where their reorder bugs lived (DPDK 547f294357, bc4a7f7ee0). An
//     out-of-order segment flushes its flow and starts afresh.
//   - IPv4 options, IPv6 Fragment headers and Routing headers with segments left are
//     never coalesced; such frames flush their flow and pass through.
//   - No coalescing of GSO input, of UDP without a checksum, or of CWR into an existing
//     aggregate; no BIG TCP (> 65535: virtio_net_hdr and the IPv4/IPv6 length fields
//     are 16 bits, and IPv6 jumbograms need a Hop-by-Hop option the TAP does not take).
//   - Segments smaller than 64 bytes stop at MaxSegments (1024) before 65535 bytes,
//     where Linux would go on.
//   - Pure ACKs are never held (gVisor edd7fd2e6). DupAck is counted only when the flow
//     has a held aggregate with the same ack and window; other duplicate ACKs count as
//     pure_ack, since the engine keeps no state for flows it is not coalescing.
//   - The engine never logs; the caller turns Stats and Trace into logs and metrics.
package coalescer
