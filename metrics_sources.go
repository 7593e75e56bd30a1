package main

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"tapgro/coalescer"
	"tapgro/netmapio"
)

// addCoalescerMetrics exports the GRO engine's counters. The engine is created with the
// first connection, so every getter tolerates its absence.
func addCoalescerMetrics(c *collector, b *bridge) {
	stat := func(get func(*coalescer.Stats) uint64) func() float64 {
		return func() float64 {
			b.coalMu.Lock()
			co := b.coal
			b.coalMu.Unlock()
			if co == nil {
				return 0
			}
			return float64(get(co.Stats()))
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
	for i := range coalescer.HistBounds {
		i := i
		c.add("tapgro_gro_segments_per_packet", "Packets written to the TAP by segment count (non-cumulative buckets: le is the bucket's upper bound).", prometheus.CounterValue,
			prometheus.Labels{"le": strconv.Itoa(coalescer.HistBounds[i])}, stat(func(s *coalescer.Stats) uint64 { return s.SegsPerPacket[i].Load() }))
	}
}

// addDeviceMetrics exports the TAP's and the port's own counters.
func addDeviceMetrics(c *collector, b *bridge, ep netmapio.Endpoint) {
	ts := b.tap.Stats()
	c.add("tapgro_tap_read_syscalls_total", "read(2) calls on the TAP.", prometheus.CounterValue, nil, u(ts.ReadCalls.Load))
	c.add("tapgro_tap_write_syscalls_total", "write(2) calls on the TAP.", prometheus.CounterValue, nil, u(ts.WriteCalls.Load))
	c.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", prometheus.CounterValue, prometheus.Labels{"errno": "EINVAL"}, u(ts.WriteErrEINVAL.Load))
	c.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", prometheus.CounterValue, prometheus.Labels{"errno": "EIO"}, u(ts.WriteErrEIO.Load))
	c.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", prometheus.CounterValue, prometheus.Labels{"errno": "other"}, u(ts.WriteErrOther.Load))
	c.add("tapgro_tap_truncated_total", "TAP reads that filled their buffer (possibly truncated).", prometheus.CounterValue, nil, u(ts.Truncated.Load))
}
