package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"tapgro/datapath"
	"tapgro/rxpool"
)

// addRxPoolMetrics exports the TAP→port receive pool's counters (rxpool.Stats). With
// tapgro_port_write_syscalls_total they give the frames per write system call that the
// pool exists to raise.
func addRxPoolMetrics(c *collector) {
	pool := func(get func(*rxpool.Stats) uint64) func(*datapath.Snapshot) float64 {
		return func(s *datapath.Snapshot) float64 { return float64(get(s.Pool)) }
	}
	c.add("tapgro_rx_frames_staged_total", "Frames staged in the TAP->port receive pool.", prometheus.CounterValue, nil, pool(func(st *rxpool.Stats) uint64 { return st.FramesStaged.Load() }))
	c.add("tapgro_rx_bytes_staged_total", "Bytes staged in the TAP->port receive pool.", prometheus.CounterValue, nil, pool(func(st *rxpool.Stats) uint64 { return st.BytesStaged.Load() }))
	c.add("tapgro_rx_frames_sent_total", "Frames the port took from the receive pool.", prometheus.CounterValue, nil, pool(func(st *rxpool.Stats) uint64 { return st.FramesSent.Load() }))
	c.add("tapgro_rx_writes_total", "Batched writes from the receive pool to the port (each one or more system calls).", prometheus.CounterValue, nil, pool(func(st *rxpool.Stats) uint64 { return st.Writes.Load() }))
	// Non-cumulative buckets on the packet path, a Prometheus histogram at scrape time
	// (as tapgro_gro_segments_per_packet). Every frame sent leaves in exactly one write,
	// so the sum is the frames sent.
	desc := prometheus.NewDesc("tapgro_rx_frames_per_write", "Frames moved per batched write from the receive pool to the port.", nil, nil)
	c.customDesc = append(c.customDesc, desc)
	c.custom = append(c.custom, func(snap *datapath.Snapshot) prometheus.Metric {
		st := snap.Pool
		buckets := make(map[float64]uint64, len(rxpool.BatchBounds))
		var count uint64
		for i, bound := range rxpool.BatchBounds {
			count += st.BatchFrames[i].Load()
			buckets[float64(bound)] = count
		}
		count += st.BatchFrames[len(rxpool.BatchBounds)].Load()
		return prometheus.MustNewConstHistogram(desc, count, float64(st.FramesSent.Load()), buckets)
	})
	for r := rxpool.Reason(0); r < rxpool.NumReasons; r++ {
		c.add("tapgro_rx_flushes_total", "Receive pool flushes, by reason.", prometheus.CounterValue,
			prometheus.Labels{"reason": r.String()}, pool(func(st *rxpool.Stats) uint64 { return st.Flushes[r].Load() }))
	}
	for d := rxpool.Drop(0); d < rxpool.NumDrops; d++ {
		c.add("tapgro_rx_dropped_total", "Frames the receive pool dropped, by reason.", prometheus.CounterValue,
			prometheus.Labels{"reason": d.String()}, pool(func(st *rxpool.Stats) uint64 { return st.Drops[d].Load() }))
	}
	c.add("tapgro_rx_stalls_total", "Times the port could not take more frames (backpressure).", prometheus.CounterValue, nil, pool(func(st *rxpool.Stats) uint64 { return st.Stalls.Load() }))
	c.add("tapgro_rx_blocked_seconds_total", "Time the TAP->port pipeline waited for the port.", prometheus.CounterValue, nil,
		func(s *datapath.Snapshot) float64 { return float64(s.Pool.BlockedNanos.Load()) / 1e9 })
	c.add("tapgro_rx_skipped_buffers_total", "Buffers left empty at the pool's end to keep a frame contiguous.", prometheus.CounterValue, nil, pool(func(st *rxpool.Stats) uint64 { return st.SkippedBuffers.Load() }))
	c.add("tapgro_rx_buffers_in_use", "Receive pool buffers holding frames now.", prometheus.GaugeValue, nil, func(s *datapath.Snapshot) float64 { return float64(s.Pool.InUse.Load()) })
	c.add("tapgro_rx_buffers_in_use_max", "The most receive pool buffers ever in use at once.", prometheus.GaugeValue, nil, func(s *datapath.Snapshot) float64 { return float64(s.Pool.MaxInUse.Load()) })
	c.add("tapgro_rx_buffers", "Receive pool size in buffers (0 until the pipeline starts).", prometheus.GaugeValue, nil, func(s *datapath.Snapshot) float64 { return float64(s.PoolBuffers) })
}
