package ops

import (
	"tapgro/coalescer"
	"tapgro/datapath"
	"tapgro/rxpool"
	"tapgro/vnethdr"
)

// The engine's own series (engineDP.catalogue), each read from the Snapshot Collect takes
// once per scrape, or from the TAP's and the port's counters.

func (m *Metrics) addDatapath() {
	for _, d := range []struct {
		dir string
		st  func(*datapath.Snapshot) *datapath.Dir
	}{
		{"tap_to_port", func(s *datapath.Snapshot) *datapath.Dir { return &s.TapToPort }},
		{"port_to_tap", func(s *datapath.Snapshot) *datapath.Dir { return &s.PortToTap }},
	} {
		l := Labels{"direction": d.dir}
		st := d.st
		m.addFrames(d.dir, snapU(func(s *datapath.Snapshot) uint64 { return st(s).Frames }), snapU(func(s *datapath.Snapshot) uint64 { return st(s).Bytes }))
		m.add("tapgro_read_frames_total", "Frames read from the near side.", Counter, l, snapU(func(s *datapath.Snapshot) uint64 { return st(s).Reads }))
		m.add("tapgro_batches_total", "Read batches processed.", Counter, l, snapU(func(s *datapath.Snapshot) uint64 { return st(s).Batches }))
		for r := datapath.Drop(0); r < datapath.NumDrops; r++ {
			m.addDropped(d.dir, r.String(), snapU(func(s *datapath.Snapshot) uint64 { return st(s).Drops[r] }))
		}
	}
	m.addGSOSegmented(snapU(func(s *datapath.Snapshot) uint64 { return s.TapToPort.GSOSegmented }))
	m.add("tapgro_csum_completed_total", "Partial checksums from the TAP completed in software.", Counter, nil,
		snapU(func(s *datapath.Snapshot) uint64 { return s.TapToPort.CsumCompleted }))
	m.addGSOWriteFallback(snapU(func(s *datapath.Snapshot) uint64 { return s.PortToTap.GSOFallback }))
	m.addConnected(func(src *Source) float64 { s := src.Snap; return b2f(s.Connected) })
	for _, side := range []struct {
		name string
		c    func(*datapath.Snapshot) *datapath.Capture
	}{
		{"tap", func(s *datapath.Snapshot) *datapath.Capture { return &s.CaptureTap }},
		{"port", func(s *datapath.Snapshot) *datapath.Capture { return &s.CapturePort }},
	} {
		get := side.c
		m.addPcap(side.name, snapU(func(s *datapath.Snapshot) uint64 { return get(s).Frames }),
			snapU(func(s *datapath.Snapshot) uint64 { return get(s).Dropped }))
	}

}

func (m *Metrics) addCoalescer() {
	m.addGRO(func(src *Source) *coalescer.Stats { return src.Snap.GRO }, true)
}

// addGRO adds the GRO engine's series (port → TAP), read through gro (nil: zero); the
// engine's catalogue and vhost-user's (guest → TAP) share them. hist adds the
// segments-per-packet histogram.
func (m *Metrics) addGRO(gro func(*Source) *coalescer.Stats, hist bool) {
	stat := func(get func(*coalescer.Stats) uint64) func(*Source) float64 {
		return func(src *Source) float64 {
			s := gro(src)
			if s == nil {
				return 0
			}
			return float64(get(s))
		}
	}
	m.add("tapgro_gro_segments_total", "Frames that entered the GRO engine.", Counter, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.Segments.Load() }))
	m.add("tapgro_gro_packets_total", "Packets that left the GRO engine (GSO packets and passed-through frames).", Counter, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.Packets.Load() }))
	m.add("tapgro_gro_coalesced_total", "Segments merged into an existing aggregate.", Counter, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.Coalesced.Load() }))
	m.add("tapgro_gro_gso_packets_total", "GSO packets (2 or more segments) written to the TAP.", Counter, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.GSOOut.Load() }))
	m.add("tapgro_gro_held_copy_bytes_total", "Payload bytes held aggregates copied out of a port read buffer about to be reused (merging by reference, segments of 4 KB and more).", Counter, nil,
		stat(func(s *coalescer.Stats) uint64 { return s.HeldCopies.Load() }))
	for _, r := range coalescer.Reasons() {
		r := r
		m.add("tapgro_gro_reason_total", "GRO bypass and flush decisions, by reason.", Counter,
			Labels{"reason": r.String()}, stat(func(s *coalescer.Stats) uint64 { return s.Reason(r).Load() }))
	}
	if !hist {
		return
	}
	// The engine keeps non-cumulative buckets (cheap atomics on the packet path); the
	// scrape turns them into a Prometheus histogram. Every segment leaves in exactly one
	// packet, so the sum is the segment count.
	m.custom = append(m.custom, func(src *Source) *Sample {
		buckets := make(map[float64]uint64, len(coalescer.HistBounds))
		var count uint64
		var sum float64
		if s := gro(src); s != nil {
			for i, bound := range coalescer.HistBounds {
				count += s.SegsPerPacket[i].Load()
				buckets[float64(bound)] = count
			}
			count += s.SegsPerPacket[len(coalescer.HistBounds)].Load()
			sum = float64(s.Segments.Load())
		}
		return &Sample{Name: "tapgro_gro_segments_per_packet", Help: "Segments per packet written to the TAP by the GRO engine.",
			Kind: Histogram, Buckets: buckets, Count: count, Sum: sum}
	})
}

// addDevice: the TAP's counters (snap.Tap) live as long as the engine, so one Snapshot
// at start gives them.
func (m *Metrics) addDevice(snap datapath.Snapshot) {
	ts := snap.Tap
	m.add("tapgro_tap_read_syscalls_total", "read(2) calls on the TAP.", Counter, nil, u(ts.ReadCalls.Load))
	m.add("tapgro_tap_write_syscalls_total", "write(2) calls on the TAP.", Counter, nil, u(ts.WriteCalls.Load))
	m.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", Counter, Labels{"errno": "EINVAL"}, u(ts.WriteErrEINVAL.Load))
	m.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", Counter, Labels{"errno": "EIO"}, u(ts.WriteErrEIO.Load))
	m.add("tapgro_tap_write_errors_total", "TAP writes refused, by errno.", Counter, Labels{"errno": "other"}, u(ts.WriteErrOther.Load))
	m.add("tapgro_tap_truncated_total", "TAP reads that filled their buffer (possibly truncated).", Counter, nil, u(ts.Truncated.Load))

	ps := m.port
	m.add("tapgro_port_read_syscalls_total", "read/recvmmsg calls on the port.", Counter, nil, u(ps.ReadCalls.Load))
	m.add("tapgro_port_write_syscalls_total", "writev/sendmmsg calls on the port.", Counter, nil, u(ps.WriteCalls.Load))
	m.add("tapgro_port_write_waits_total", "Times a port write found the socket full and waited (backpressure).", Counter, nil, u(ps.WriteWaits.Load))
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
		m.add("tapgro_port_errors_total", "Malformed input from the peer and refused sends, by reason (a bad_length ends that connection).", Counter,
			Labels{"reason": r.reason}, u(r.v))
	}
	m.addConnections(u(ps.Connects.Load), u(ps.Disconnects.Load), u(ps.Rejects.Load))
	// The transport's own counters (netmap's, say), whatever the transport.
	for _, c := range m.portCounters {
		m.add(c.Name, c.Help, Counter, Labels(c.Labels), u(c.Value))
	}
	m.add("tapgro_port_retries_total", "Failed dials or accepts, each followed by a backoff wait.", Counter, nil, u(ps.Retries.Load))
}

func (m *Metrics) addRxPool() {
	pool := func(get func(*rxpool.Stats) uint64) func(*Source) float64 {
		return func(src *Source) float64 { s := src.Snap; return float64(get(s.Pool)) }
	}
	m.add("tapgro_rx_frames_staged_total", "Frames staged in the TAP->port receive pool.", Counter, nil, pool(func(st *rxpool.Stats) uint64 { return st.FramesStaged.Load() }))
	m.add("tapgro_rx_bytes_staged_total", "Bytes staged in the TAP->port receive pool.", Counter, nil, pool(func(st *rxpool.Stats) uint64 { return st.BytesStaged.Load() }))
	m.add("tapgro_rx_frames_sent_total", "Frames the port took from the receive pool.", Counter, nil, pool(func(st *rxpool.Stats) uint64 { return st.FramesSent.Load() }))
	m.add("tapgro_rx_writes_total", "Batched writes from the receive pool to the port (each one or more system calls).", Counter, nil, pool(func(st *rxpool.Stats) uint64 { return st.Writes.Load() }))
	// Non-cumulative buckets on the packet path, a Prometheus histogram at scrape time
	// (as tapgro_gro_segments_per_packet). Every frame sent leaves in exactly one write,
	// so the sum is the frames sent.
	m.custom = append(m.custom, func(src *Source) *Sample {
		snap := src.Snap
		st := snap.Pool
		buckets := make(map[float64]uint64, len(rxpool.BatchBounds))
		var count uint64
		for i, bound := range rxpool.BatchBounds {
			count += st.BatchFrames[i].Load()
			buckets[float64(bound)] = count
		}
		count += st.BatchFrames[len(rxpool.BatchBounds)].Load()
		return &Sample{Name: "tapgro_rx_frames_per_write", Help: "Frames moved per batched write from the receive pool to the port.",
			Kind: Histogram, Buckets: buckets, Count: count, Sum: float64(st.FramesSent.Load())}
	})
	for r := rxpool.Reason(0); r < rxpool.NumReasons; r++ {
		m.add("tapgro_rx_flushes_total", "Receive pool flushes, by reason.", Counter,
			Labels{"reason": r.String()}, pool(func(st *rxpool.Stats) uint64 { return st.Flushes[r].Load() }))
	}
	for d := rxpool.Drop(0); d < rxpool.NumDrops; d++ {
		m.add("tapgro_rx_dropped_total", "Frames the receive pool dropped, by reason.", Counter,
			Labels{"reason": d.String()}, pool(func(st *rxpool.Stats) uint64 { return st.Drops[d].Load() }))
	}
	m.addRXStalls(pool(func(st *rxpool.Stats) uint64 { return st.Stalls.Load() }))
	m.add("tapgro_rx_blocked_seconds_total", "Time the TAP->port pipeline waited for the port.", Counter, nil,
		func(src *Source) float64 { s := src.Snap; return float64(s.Pool.BlockedNanos.Load()) / 1e9 })
	m.add("tapgro_rx_skipped_buffers_total", "Buffers left empty at the pool's end to keep a frame contiguous.", Counter, nil, pool(func(st *rxpool.Stats) uint64 { return st.SkippedBuffers.Load() }))
	m.add("tapgro_rx_buffers_in_use", "Receive pool capacity the staged frames hold now, in buffers (a record viewing the TAP buffer counts for the buffers it would span if copied).", Gauge, nil, func(src *Source) float64 { s := src.Snap; return float64(s.Pool.InUse.Load()) })
	m.add("tapgro_rx_buffers_in_use_max", "The most receive pool buffers ever in use at once.", Gauge, nil, func(src *Source) float64 { s := src.Snap; return float64(s.Pool.MaxInUse.Load()) })
	m.add("tapgro_rx_buffers", "Receive pool size in buffers (0 until the pipeline starts).", Gauge, nil, func(src *Source) float64 { s := src.Snap; return float64(s.PoolBuffers) })
}

func (m *Metrics) addOffload() {
	negotiated := func(get func(n *datapath.Negotiation) vnethdr.Offloads) func(*Source) vnethdr.Offloads {
		return func(src *Source) vnethdr.Offloads {
			if n := src.Snap.Negotiation; n != nil {
				return get(n)
			}
			return 0
		}
	}
	m.addOffloadState(negotiated(func(n *datapath.Negotiation) vnethdr.Offloads { return n.TapOffloads }),
		negotiated(func(n *datapath.Negotiation) vnethdr.Offloads { return n.Port.Accepts }),
		func(src *Source) vnethdr.Offloads { return src.Snap.OffloadsKilled })
	for _, d := range []struct {
		name string
		t2p  bool
	}{{"tap_to_port", true}, {"port_to_tap", false}} {
		for _, sn := range datapath.StepNames {
			t2p, st := d.t2p, sn.Step
			m.add("tapgro_datapath_step", "1 if the negotiated datapath runs this step in this direction.",
				Gauge, Labels{"direction": d.name, "step": sn.Name}, func(src *Source) float64 {
					s := src.Snap
					n := s.Negotiation
					if n == nil {
						return 0
					}
					steps := n.P2T
					if t2p {
						steps = n.T2P
					}
					return b2f(steps&st != 0)
				})
		}
	}
	m.addGSOPassthrough("tap_to_port", snapU(func(s *datapath.Snapshot) uint64 { return s.TapToPort.GSOPassthrough }))
	m.addGSOPassthrough("port_to_tap", snapU(func(s *datapath.Snapshot) uint64 { return s.PortToTap.GSOPassthrough }))
}

// addPeer is the connected peer's identity, a series present only while connected.
func (m *Metrics) addPeer() {
	m.custom = append(m.custom, func(src *Source) *Sample {
		snap := src.Snap
		if !snap.Connected {
			return nil
		}
		return &Sample{Name: "tapgro_port_peer_info", Help: "The connected peer (address, or UNIX credentials); absent while disconnected.",
			Kind: Gauge, LabelNames: []string{"peer"}, LabelValues: []string{snap.Peer}, Value: 1}
	})
}

// addStalled is the health monitor's per-direction gauge.
func (m *Metrics) addStalled(h *HealthMonitor) {
	for i, name := range dirNames {
		i := i
		m.add("tapgro_stalled", "1 while the direction has had traffic pending without progress for --health-stall (/healthz fails).",
			Gauge, Labels{"direction": name}, func(*Source) float64 {
				if h.stalled(i) {
					return 1
				}
				return 0
			})
	}
}
