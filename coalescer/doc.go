// Package coalescer is tapgro's userspace GRO engine: it merges runs of MTU-sized TCP
// segments (and, optionally, equal-sized UDP datagrams) of one flow into 64 KB GSO
// packets behind a virtio_net_hdr, so a TAP opened with IFF_VNET_HDR receives one write
// instead of ~45 (issue 3). The rules are research/gro.md §d: Linux tcp_gro_receive for
// what may merge, wireguard-go for the virtio encoding, gVisor for flushing at the end of
// each read batch. The engine knows nothing about direction or I/O: frames go in through
// Add, packets come out through the emit callback.
//
// # Data flow
//
// Add parses the Ethernet (+ one 802.1Q tag), IPv4/IPv6 and TCP/UDP headers itself (only
// the fields it needs) and builds a fixed 56-byte flow key: MACs, VLAN tag, IP version,
// L4 protocol, addresses, ports and the IPv6 flow label. The key is hashed with
// hash/maphash into a chained table of 2×MaxFlows buckets. A frame that may be coalesced
// either joins its flow's open aggregate (its payload is appended to a copy of the first
// segment) or starts a new one. Any other frame is emitted at once without copying: a
// fresh header (zero, or the arrival header for GSO and NEEDS_CSUM frames) is written
// into the caller's headroom and emit sees the caller's buffer.
//
// # Merge rules
//
// A frame is eligible when it is IPv4 with IHL=5, not a fragment and with a valid header
// checksum, or IPv6 with TCP/UDP as the first next header; and TCP with ACK, no
// SYN/RST/URG, payload > 0 (CWR only if Config.ECN), or UDP (Config.UDP) with a nonzero
// checksum and payload > 0. It joins its flow's aggregate only if TOS/TTL/DF (IPv6:
// traffic class and hop limit) are equal; the IPv4 ID grows by exactly 1 per segment, or
// stays constant with DF set, the pattern being fixed by the second segment (Linux
// inet_gro_flush; README "Clarifications"); TCP flags other than PSH/FIN equal, no CWR,
// ack_seq equal, data offset and option bytes (timestamps included) equal, seq exactly
// contiguous; the payload is not larger than the first segment's (gso_size); and the IP
// length stays <= 65535. Sizes come from the IP header, never the frame length, so
// Ethernet padding is ignored. The L4 checksum of every segment, the first included, is
// verified in software while its payload is copied (one call, cache-hot; see sumCopy),
// unless the arrival header says NEEDS_CSUM or DATA_VALID: merging would otherwise
// launder a corrupted segment, since the output asks the kernel to compute a fresh sum.
//
// # Ordering guarantee
//
// One aggregate per flow, and a same-flow frame never overtakes held data: whenever a
// keyed frame cannot join (any rule above, pure or duplicate ACK, SYN/RST/URG/bare FIN,
// IP options, first fragment, IPv6 extension headers, bad checksum, GSO input) the
// flow's aggregate is emitted first, and then the frame either starts a new aggregate or
// passes through. Frames whose flow cannot be identified (malformed, non-first
// fragments, non-TCP/UDP) pass through at once; they belong to no aggregate. Across
// flows, Flush emits aggregates oldest first. Per flow, re-segmenting the output gives
// back exactly the input, byte for byte and in order (property test), except that a
// constant-ID aggregate comes back with incrementing IDs: virtio has no FIXEDID flag,
// so GSO renumbers them (RFC 6864 makes that harmless).
//
// # Flush triggers
//
// An aggregate is emitted when: a segment with PSH or FIN, or shorter than gso_size,
// was merged into it (it ends there); it holds MaxSegments segments (UDP: at most 64,
// UDP_MAX_SEGMENTS of older kernels); another full segment would not fit in 65535 IP
// bytes; its flow sees a frame that cannot join; the table is full and it is the oldest
// (eviction delivers, never drops); Flush is called (end of each read batch, the
// default policy); or FlushExpired finds it older than the timer (timer mode, driven by
// the I/O loop's poll deadline via Oldest, never a Go timer per flow). Every decision is
// counted in Stats under a Reason and reported to Config.Trace if set.
//
// # Output encoding (wire.md §1.6, §2.4)
//
// A lone segment is emitted as the frame it arrived as (padding included) behind a zero
// header, or behind its arrival header if that was NEEDS_CSUM. Two or more segments
// become one packet with flags NEEDS_CSUM, gso_type TCPV4/TCPV6 (|ECN if the head
// carried CWR) or UDP_L4, gso_size = the first segment's payload, hdr_len = L2+L3+L4
// header bytes, csum_start = L2 header (14, or 18 with VLAN) + IP header length (a TAP
// frame has an Ethernet header, unlike TUN), csum_offset 16 (TCP) or 6 (UDP), and the L4
// checksum field holding the folded, uncomplemented pseudo-header sum for the new
// length. IPv4 total length and header checksum, IPv6 payload length and the UDP length
// are rewritten. The head's IPv4 ID and ack are kept; the TCP window is the last
// segment's (QEMU RSC does this; Linux keeps the head's — taking the newest never hides
// a window update), and PSH/FIN of the last segment are ORed into the flags.
//
// # Memory
//
// New allocates everything: MaxFlows buffers of VnetHdrLen+18+65535 bytes (64 flows ×
// 65565 bytes ≈ 4.2 MB at the defaults), the bucket array and a free stack. Add, Flush
// and FlushExpired allocate nothing (TestAllocs, the benchmarks). SetConfig reallocates
// only if MaxFlows or VnetHdrLen grew. The engine is single-goroutine; Stats are atomics
// readable from anywhere.
//
// # Deliberately not done
//
//   - No reordering or prepend stitching within a batch (wireguard-go, DPDK): it buys
//     little and is where their reorder bugs lived (research/gro.md §c.5). An
//     out-of-order segment flushes its flow and starts afresh.
//   - IPv6 extension headers (HBH/DSTOPTS/ROUTING) and IPv4 options are never coalesced;
//     such frames flush their flow and pass through (README "Clarifications": safe).
//   - No coalescing of GSO input, of UDP without a checksum, or of CWR into an existing
//     aggregate; no BIG TCP (> 65535).
//   - Pure ACKs are never held (gVisor edd7fd2e6). DupAck is counted only when the flow
//     has a held aggregate with the same ack and window; other duplicate ACKs count as
//     pure_ack, since the engine keeps no state for flows it is not coalescing.
//   - The engine never logs; the caller turns Stats and Trace into logs and metrics.
package coalescer
