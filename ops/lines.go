package ops

import (
	"fmt"

	"tapgro/coalescer"
	"tapgro/datapath"
	"tapgro/onoff"
	"tapgro/vhostnet"
	"tapgro/virtio"
)

// The start-up and exit lines and the load procscale follows, read through the
// Datapath like every other surface here, so that package main builds no line from a
// datapath's internals: it adds only what it knows itself (the flags, QEMU's options).

// ReadyFields are dp's part of the start-up line.
func ReadyFields(dp Datapath) map[string]any { return dp.ready() }

// Summary is the exit line's counters.
func Summary(dp Datapath) map[string]any { return dp.summary() }

// Delivered is the bytes each direction has delivered so far (procscale's load).
func Delivered(dp Datapath) func() (tapToPort, portToTap uint64) { return dp.delivered }

// summary is what the exit line gives for every port kind, under the names the engine's
// summary has always used: per direction (tap_to_port, port_to_tap) the frames, bytes,
// GSO frames passed whole and drops, the GRO engine's counters toward the TAP, and the
// captures. Each kind adds its own.
type summary struct {
	frames, bytes, gsoPassthrough, dropped [2]uint64 // [tap_to_port, port_to_tap]
	gro                                    *coalescer.Stats
	pcap                                   map[string][2]uint64 // side → frames, dropped
}

func (s *summary) fields() map[string]any {
	f := map[string]any{}
	for i, dir := range []string{"tap_to_port", "port_to_tap"} {
		f[dir+"_frames"], f[dir+"_bytes"] = s.frames[i], s.bytes[i]
		f[dir+"_gso_passthrough"], f[dir+"_dropped"] = s.gsoPassthrough[i], s.dropped[i]
	}
	f["dropped"] = s.dropped[0] + s.dropped[1]
	if g := s.gro; g != nil {
		f["gro_segments"], f["gro_packets"] = g.Segments.Load(), g.Packets.Load()
		f["gro_gso_packets"], f["gro_coalesced"] = g.GSOOut.Load(), g.Coalesced.Load()
	}
	for side, c := range s.pcap {
		f["pcap_"+side+"_frames"], f["pcap_"+side+"_dropped"] = c[0], c[1]
	}
	return f
}

// The engine: every frame read from the TAP was delivered, split (GSO), or counted as a
// drop (the SIGTERM-under-load test checks the balance).

func (e *engineDP) ready() map[string]any {
	snap := e.eng.Snapshot()
	return map[string]any{
		"tap":          e.tap,
		"tap_offloads": snap.Negotiation.TapOffloads.String(),
		"probed":       snap.TapProbed.String(),
		"gro":          onoff.String(snap.GROOn && !snap.GROKilled),
		"listen":       e.listen,
	}
}

func (e *engineDP) delivered() (uint64, uint64) {
	s := e.eng.Snapshot()
	return s.TapToPort.Bytes, s.PortToTap.Bytes
}

func (e *engineDP) summary() map[string]any {
	s := e.eng.Snapshot()
	t2p, p2t := &s.TapToPort, &s.PortToTap
	sum := summary{
		frames:         [2]uint64{t2p.Frames, p2t.Frames},
		bytes:          [2]uint64{t2p.Bytes, p2t.Bytes},
		gsoPassthrough: [2]uint64{t2p.GSOPassthrough, p2t.GSOPassthrough},
		dropped:        [2]uint64{s.Dropped(t2p), s.Dropped(p2t)},
		gro:            s.GRO,
		pcap: map[string][2]uint64{"tap": {s.CaptureTap.Frames, s.CaptureTap.Dropped},
			"port": {s.CapturePort.Frames, s.CapturePort.Dropped}},
	}
	f := sum.fields()
	f["tap_to_port_reads"], f["port_to_tap_reads"] = t2p.Reads, p2t.Reads
	f["tap_write_einval"] = s.Tap.WriteErrEINVAL.Load()
	f["gso_write_fallback"] = p2t.GSOFallback
	f["port_to_tap_malformed"] = p2t.Drops[datapath.DropMalformed]
	for _, c := range e.own {
		// The shared-memory rings' frames, as the transport counts them (sockport).
		if c.Name == "tapgro_shm_frames_total" {
			f[c.Labels["direction"]+"_shm"] = c.Value()
		}
	}
	f["tap_to_port_gso_segmented"] = t2p.GSOSegmented
	f["tap_to_port_port_error"] = t2p.Drops[datapath.DropPortError]
	return f
}

// vhost-user: port_to_tap is guest → TAP (vhostnet TX); drops also by reason, as
// direction_reason.

func (v *vhostDP) ready() map[string]any {
	vs := v.vn.State()
	f := map[string]any{"tap": v.tap, "offered": virtio.String(vs.Offered), "gro": onoff.String(v.vn.GROActive())}
	if vs.QueuePairs > 1 {
		f["queue_pairs"] = vs.QueuePairs
	}
	return f
}

func (v *vhostDP) delivered() (uint64, uint64) {
	st := v.vn.Stats()
	return st.RXBytes.Load(), st.TXBytes.Load()
}

func (v *vhostDP) summary() map[string]any {
	st, bs := v.vn.Stats(), v.vn.BackendStats()
	sum := summary{
		frames:         [2]uint64{st.RXFrames.Load(), st.TXFrames.Load()},
		bytes:          [2]uint64{st.RXBytes.Load(), st.TXBytes.Load()},
		gsoPassthrough: [2]uint64{st.RXGSO.Load(), st.TXGSO.Load()},
	}
	if v.vn.GROActive() || st.GRO.Segments.Load() != 0 {
		sum.gro = &st.GRO
	}
	c, ct := v.vn.Capture(), v.vn.TapCapture()
	if c.Writer() != nil || ct.Writer() != nil || c.Stats().Frames.Load()+ct.Stats().Frames.Load() != 0 {
		sum.pcap = map[string][2]uint64{"port": {c.Stats().Frames.Load(), c.Stats().Dropped.Load()},
			"tap": {ct.Stats().Frames.Load(), ct.Stats().Dropped.Load()}}
	}
	extra := map[string]any{}
	for r := vhostnet.Drop(0); r < vhostnet.NumDrops; r++ {
		n := st.Drops[r].Load()
		if r.IsRX() {
			sum.dropped[0] += n
		} else {
			sum.dropped[1] += n
		}
		if n != 0 {
			extra[r.Dir()+"_"+r.String()] = n
		}
	}
	f := sum.fields()
	for k, x := range extra {
		f[k] = x
	}
	f["rx_stalls"], f["sessions"] = st.RXStalls.Load(), bs.Sessions.Load()
	f["kicks"], f["calls"] = bs.Kicks.Load(), bs.Calls.Load()
	f["gso_write_fallback"] = st.GSOFallback.Load()
	if len(st.Queues) > 1 {
		for i := range st.Queues {
			q := &st.Queues[i]
			f[fmt.Sprintf("queue%d_port_to_tap_frames", i)] = q.TXFrames.Load()
			f[fmt.Sprintf("queue%d_tap_to_port_frames", i)] = q.RXFrames.Load()
		}
	}
	if r := &st.RSC; r.Segments.Load() != 0 {
		// RSC toward the guest, beside the gro_* toward the TAP.
		f["rsc_segments"], f["rsc_packets"] = r.Segments.Load(), r.Packets.Load()
		f["rsc_gso_packets"], f["rsc_coalesced"] = r.GSOOut.Load(), r.Coalesced.Load()
	}
	return f
}
