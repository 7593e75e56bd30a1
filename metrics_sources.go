package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"tapgro/coalescer"
	"tapgro/datapath"
	"tapgro/netdev"
)

// addCoalescerMetrics exports the GRO engine's counters. The engine is created with the
// first connection, so every getter tolerates its absence.
func addCoalescerMetrics(c *collector) {
	stat := func(get func(*coalescer.Stats) uint64) func(*datapath.Snapshot) float64 {
		return func(s *datapath.Snapshot) float64 {
			if s.GRO == nil {
				return 0
			}
			return float64(get(s.GRO))
		}
	}
	c.add("tapgro_gro_segments_total", "Frames that entered the GRO engine.", prometheus.CounterValue, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.Segments.Load() }))
	c.add("tapgro_gro_packets_total", "Packets that left the GRO engine (GSO packets and passed-through frames).", prometheus.CounterValue, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.Packets.Load() }))
	c.add("tapgro_gro_coalesced_total", "Segments merged into an existing aggregate.", prometheus.CounterValue, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.Coalesced.Load() }))
	c.add("tapgro_gro_gso_packets_total", "GSO packets (2 or more segments) written to the TAP.", prometheus.CounterValue, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.GSOOut.Load() }))
	for _, r := range coalescer.Reasons() {
		r := r
		c.add("tapgro_gro_reason_total", "GRO bypass and flush decisions, by reason.", prometheus.CounterValue,
			prometheus.Labels{"reason": r.String()}, stat(func(s *coalescer.Stats) uint64 { return s.Reason(r).Load() }))
	}
	// The engine keeps non-cumulative buckets (cheap atomics on the packet path); the
	// scrape turns them into a Prometheus histogram. Every segment leaves in exactly one
	// packet, so the sum is the segment count.
	desc := prometheus.NewDesc("tapgro_gro_segments_per_packet", "Segments per packet written to the TAP by the GRO engine.", nil, nil)
	c.customDesc = append(c.customDesc, desc)
	c.custom = append(c.custom, func(snap *datapath.Snapshot) prometheus.Metric {
		buckets := make(map[float64]uint64, len(coalescer.HistBounds))
		var count uint64
		var sum float64
		if s := snap.GRO; s != nil {
			for i, bound := range coalescer.HistBounds {
				count += s.SegsPerPacket[i].Load()
				buckets[float64(bound)] = count
			}
			count += s.SegsPerPacket[len(coalescer.HistBounds)].Load()
			sum = float64(s.Segments.Load())
		}
		return prometheus.MustNewConstHistogram(desc, count, sum, buckets)
	})
}

// addDeviceMetrics exports the TAP's and the port's own counters.
func addDeviceMetrics(c *collector, eng snapshotter, ep netdev.Endpoint) {
	ts := eng.Snapshot().Tap // the TAP's counters live as long as the engine
	c.add("tapgro_tap_read_syscalls_total", "read(2) calls on the TAP.", prometheus.CounterValue, nil, u(ts.ReadCalls.Load))
	c.add("tapgro_tap_write_syscalls_total", "write(2) calls on the TAP.", prometheus.CounterValue, nil, u(ts.WriteCalls.Load))
	c.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", prometheus.CounterValue, prometheus.Labels{"errno": "EINVAL"}, u(ts.WriteErrEINVAL.Load))
	c.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", prometheus.CounterValue, prometheus.Labels{"errno": "EIO"}, u(ts.WriteErrEIO.Load))
	c.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", prometheus.CounterValue, prometheus.Labels{"errno": "other"}, u(ts.WriteErrOther.Load))
	c.add("tapgro_tap_truncated_total", "TAP reads that filled their buffer (possibly truncated).", prometheus.CounterValue, nil, u(ts.Truncated.Load))

	ps := ep.Stats()
	c.add("tapgro_port_read_syscalls_total", "read/recvmmsg calls on the port.", prometheus.CounterValue, nil, u(ps.ReadCalls.Load))
	c.add("tapgro_port_write_syscalls_total", "writev/sendmmsg calls on the port.", prometheus.CounterValue, nil, u(ps.WriteCalls.Load))
	c.add("tapgro_port_write_waits_total", "Times a port write found the socket full and waited (backpressure).", prometheus.CounterValue, nil, u(ps.WriteWaits.Load))
	for _, r := range []struct {
		reason string
		v      func() uint64
	}{
		{"bad_length", ps.BadLength.Load},
		{"truncated", ps.Truncated.Load},
		{"short_datagram", ps.ShortDatagram.Load},
		{"oversize_datagram", ps.OversizeDatagram.Load},
		{"send_refused", ps.SendDrops.Load},
	} {
		c.add("tapgro_port_errors_total", "Malformed input from the peer and refused sends, by reason (a bad_length ends that connection).", prometheus.CounterValue,
			prometheus.Labels{"reason": r.reason}, u(r.v))
	}
	c.add("tapgro_port_connects_total", "Peers connected (or datagram sockets opened).", prometheus.CounterValue, nil, u(ps.Connects.Load))
	c.add("tapgro_port_disconnects_total", "Peer connections ended.", prometheus.CounterValue, nil, u(ps.Disconnects.Load))
	c.add("tapgro_port_rejects_total", "Extra clients turned away while one was served.", prometheus.CounterValue, nil, u(ps.Rejects.Load))
	if nm, ok := ep.(netdev.NetmapStatser); ok {
		ns := nm.NetmapStats()
		c.add("tapgro_netmap_slots_total", "netmap ring slots used, by direction.", prometheus.CounterValue, prometheus.Labels{"direction": "rx"}, u(ns.RxSlots.Load))
		c.add("tapgro_netmap_slots_total", "netmap ring slots used, by direction.", prometheus.CounterValue, prometheus.Labels{"direction": "tx"}, u(ns.TxSlots.Load))
		c.add("tapgro_netmap_tx_full_total", "Times the netmap TX ring had no room for the next whole frame.", prometheus.CounterValue, nil, u(ns.TxFull.Load))
		for _, r := range []struct {
			reason string
			v      func() uint64
		}{
			{"bad_slot", ns.BadSlot.Load}, {"bad_chain", ns.BadChain.Load}, {"short_frame", ns.ShortFrame.Load},
			{"long_frame", ns.LongFrame.Load}, {"tx_too_big", ns.TxTooBig.Load}, {"bad_ring", ns.BadRing.Load}, {"stale", ns.Stale.Load},
		} {
			c.add("tapgro_netmap_errors_total", "Bad input from the netmap ring and frames it could not carry, by reason.", prometheus.CounterValue,
				prometheus.Labels{"reason": r.reason}, u(r.v))
		}
	}
	c.add("tapgro_port_retries_total", "Failed dials or accepts, each followed by a backoff wait.", prometheus.CounterValue, nil, u(ps.Retries.Load))
}
