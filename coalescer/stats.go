package coalescer

import (
	"math/bits"
	"sync/atomic"
)

// Reason names one decision of the engine: why a frame was passed through unmerged, or
// why a held aggregate was emitted. The String values are the label values of the
// per-reason counters the issue asks for (tapgro_gro_*{reason="..."}).
type Reason uint8

const (
	// ReasonMerged and ReasonStarted are not bypasses; they exist so a Trace hook sees
	// every decision. They are counted by Stats.Coalesced and Stats.Started.
	ReasonMerged Reason = iota
	ReasonStarted

	ReasonNotTCPUDP      // not IPv4/IPv6 carrying TCP/UDP (ARP, ICMP, QinQ, ...)
	ReasonIPOptions      // IPv4 IHL > 5
	ReasonFragment       // IPv4 MF/offset, IPv6 Fragment header
	ReasonExtHeader      // IPv6 extension headers prevent it: chain differs from the aggregate's, or Routing with segments left
	ReasonSyn            // SYN set
	ReasonFinRstUrg      // RST or URG; FIN without payload; FIN closing an aggregate
	ReasonPureAck        // TCP without payload (dup ACKs not recognisable as such included)
	ReasonDupAck         // TCP without payload, same ack and window as the held aggregate
	ReasonCWR            // CWR: never joins; passes through unless Config.ECN
	ReasonOutOfOrder     // seq != next expected
	ReasonOptionsChanged // TCP data offset or option bytes differ
	ReasonAckChanged     // ack_seq differs
	ReasonTosTTLChanged  // IPv4 TOS/TTL/DF(/reserved), IPv6 traffic class/hop limit differ
	ReasonFlagsChanged   // TCP flags differ outside PSH/FIN/CWR, or ACK not set
	ReasonIPIDChanged    // IPv4 ID neither +1 nor constant (DF set or clear), or pattern changed
	ReasonBadChecksum    // IPv4 header or L4 checksum wrong
	ReasonNoChecksum     // UDP checksum 0 (not coalescable, like Linux)
	ReasonOverSize       // aggregate cannot take another segment within 65535 IP bytes
	ReasonLargerSegment  // payload larger than the aggregate's gso_size
	ReasonSegmentCap     // aggregate reached MaxSegments
	ReasonEviction       // flow table full: oldest aggregate emitted
	ReasonBatchEnd       // Flush (end of read batch) or SetConfig
	ReasonTimer          // FlushExpired
	ReasonPsh            // PSH: merged as the last segment, or passed through
	ReasonShortSegment   // payload shorter than gso_size: merged as last; empty UDP
	ReasonGSOInput       // frame arrived already GSO
	ReasonDisabled       // TCP or UDP coalescing switched off
	ReasonMalformed      // headers truncated or inconsistent

	numReasons
)

var reasonNames = [numReasons]string{
	ReasonMerged:         "merged",
	ReasonStarted:        "started",
	ReasonNotTCPUDP:      "not_tcp_udp",
	ReasonIPOptions:      "ip_options",
	ReasonFragment:       "fragment",
	ReasonExtHeader:      "ipv6_ext_header",
	ReasonSyn:            "syn",
	ReasonFinRstUrg:      "fin_rst_urg",
	ReasonPureAck:        "pure_ack",
	ReasonDupAck:         "dup_ack",
	ReasonCWR:            "cwr",
	ReasonOutOfOrder:     "out_of_order",
	ReasonOptionsChanged: "options_changed",
	ReasonAckChanged:     "ack_changed",
	ReasonTosTTLChanged:  "tos_ttl_changed",
	ReasonFlagsChanged:   "flags_changed",
	ReasonIPIDChanged:    "ip_id_changed",
	ReasonBadChecksum:    "bad_checksum",
	ReasonNoChecksum:     "no_checksum",
	ReasonOverSize:       "over_size",
	ReasonLargerSegment:  "larger_segment",
	ReasonSegmentCap:     "segment_cap",
	ReasonEviction:       "eviction",
	ReasonBatchEnd:       "batch_end",
	ReasonTimer:          "timer",
	ReasonPsh:            "psh",
	ReasonShortSegment:   "short_segment",
	ReasonGSOInput:       "gso_input",
	ReasonDisabled:       "disabled",
	ReasonMalformed:      "malformed",
}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Reasons lists every Reason with a counter (all but Merged and Started), in a stable
// order, for exporters that iterate.
func Reasons() []Reason {
	rs := make([]Reason, 0, numReasons-ReasonNotTCPUDP)
	for r := ReasonNotTCPUDP; r < numReasons; r++ {
		rs = append(rs, r)
	}
	return rs
}

// HistBounds are the inclusive upper bounds of the segments-per-packet histogram
// buckets; Stats.SegsPerPacket has one more bucket for anything larger (TCP only: UDP
// is capped at 64).
var HistBounds = [...]int{1, 2, 4, 8, 16, 32, 64}

// Stats are plain atomic counters; the owner of the Coalescer reads them from any
// goroutine. Reason counters count events, not frames: a frame that flushes its flow
// (say, an out-of-order segment) and then starts a new aggregate counts once under
// its reason; an aggregate flushed by Flush, FlushExpired or eviction counts once under
// that reason. A frame can count twice only when it first flushes its flow for one
// reason and is then refused for another (e.g. OutOfOrder, then BadChecksum).
type Stats struct {
	Segments  atomic.Uint64 // frames that entered Add
	Packets   atomic.Uint64 // packets handed to emit
	Coalesced atomic.Uint64 // segments merged into an existing aggregate
	Started   atomic.Uint64 // aggregates started (including ones emitted with 1 segment)
	GSOOut    atomic.Uint64 // packets emitted as GSO (2 or more segments)

	// reasons counts each bypass and flush decision, indexed by Reason (Reason(r)
	// reads one): declared once, by the Reason constants and reasonNames, so a new
	// reason cannot be missed here.
	reasons [numReasons]atomic.Uint64

	// HeldCopies counts the payload bytes AddRef'd aggregates copied into their own
	// buffer because they outlived the caller's buffer (Release) or reached MaxRefs:
	// the copies the referencing path did not avoid. Not a decision; no Reason.
	HeldCopies atomic.Uint64

	// SegsPerPacket[i] counts emitted packets carrying n segments with
	// HistBounds[i-1] < n <= HistBounds[i]; the last bucket is n > 64. Buckets are not
	// cumulative. A passed-through frame (GSO input included) counts as 1 segment.
	SegsPerPacket [len(HistBounds) + 1]atomic.Uint64
}

// Reason returns the counter for r (Coalesced for ReasonMerged, Started for
// ReasonStarted), so exporters can loop over Reasons(). r must be a Reason constant.
func (s *Stats) Reason(r Reason) *atomic.Uint64 {
	switch r {
	case ReasonMerged:
		return &s.Coalesced
	case ReasonStarted:
		return &s.Started
	}
	return &s.reasons[r]
}

// histBucket maps a segment count (>= 1) to its SegsPerPacket index: 1→0, 2→1, 3..4→2,
// ..., 33..64→6, >64→7.
func histBucket(n int) int {
	return min(bits.Len(uint(n-1)), len(HistBounds))
}
