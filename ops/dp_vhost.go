package ops

import (
	"fmt"
	"strconv"

	"tapgro/coalescer"
	"tapgro/datapath"
	"tapgro/pcapio"
	"tapgro/vhostnet"
	"tapgro/vhostuser"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// VhostNet is what the operator surfaces read and steer of a vhost-user datapath
// (*vhostnet.Net).
type VhostNet interface {
	Stats() *vhostnet.Stats
	BackendStats() *vhostuser.Stats
	State() vhostnet.State
	Capture() *pcapio.Point
	SetCapture(path string) error
	TapCapture() *pcapio.Point
	SetTapCapture(path string) error
	OffloadChoice() vnethdr.Choice
	SetOffloads(c vnethdr.Choice) vnethdr.Offloads
	SetGRO(on bool) bool
	GROActive() bool
	TapKilled() vnethdr.Offloads
	SetUDPGRO(on bool) bool
	UDPGROActive() bool
}

var _ VhostNet = (*vhostnet.Net)(nil)

// vhostDP is vhostnet behind --netdev vhost-user. It has no engine: its state is
// vhostnet's and the back-end's counters. Directions are the engine's: port_to_tap is
// guest → TAP (vhostnet TX), tap_to_port TAP → guest (RX); a session is a connection.
type vhostDP struct {
	vn          VhostNet
	tap, listen string
}

// VhostDatapath is vn as the operator surfaces see it; tap names its (first) TAP queue
// and listen is the vhost-user socket's address.
func VhostDatapath(vn VhostNet, tap, listen string) Datapath {
	return &vhostDP{vn: vn, tap: tap, listen: listen}
}

func (v *vhostDP) names() (string, string) { return v.tap, v.listen }

// refuse: vhost-user has every switch: the TAP's offloads (a cap on what the guest
// acked, as --offload), coalescing (GRO toward the TAP, RSC toward the guest), UDP
// coalescing toward the TAP, and capture of both sides.
func (v *vhostDP) refuse(ctlCaps) error { return nil }

func (v *vhostDP) offloads() (vnethdr.Choice, vnethdr.Offloads) {
	return v.vn.OffloadChoice(), v.vn.State().TapProbed
}

// setOffloads caps the TAP's read offloads: TUNSETOFFLOAD becomes what the guest acked
// (with USO for cutting, vhostnet.TapOffloads) within c, at once if a guest has acked.
func (v *vhostDP) setOffloads(c vnethdr.Choice) (vnethdr.Offloads, error) {
	return v.vn.SetOffloads(c), nil
}

func (v *vhostDP) setGRO(on bool) (bool, error)    { return v.vn.SetGRO(on), nil }
func (v *vhostDP) setUDPGRO(on bool) (bool, error) { return v.vn.SetUDPGRO(on), nil }

func (v *vhostDP) setCapture(side datapath.CaptureSide, path string) error {
	if side == datapath.CaptureTap {
		return v.vn.SetTapCapture(path)
	}
	return v.vn.SetCapture(path)
}

// problems: vhostnet's drops by direction and reason (the engine's keys where the
// reason is the engine's), the chains and rings the guest broke (ring/REASON), and pages
// the front-end's dirty log was too small for.
func (v *vhostDP) problems() map[string]uint64 {
	st, bs := v.vn.Stats(), v.vn.BackendStats()
	m := map[string]uint64{}
	for r := vhostnet.Drop(0); r < vhostnet.NumDrops; r++ {
		m[r.Dir()+"/"+r.String()] = st.Drops[r].Load()
	}
	for r := vhostuser.Reason(0); r < vhostuser.NumReasons; r++ {
		m["ring/"+r.String()] = bs.Rejected[r].Load()
	}
	m["log/beyond"] = bs.LogBeyond.Load()
	m["port_to_tap/gso_write_fallback"] = st.GSOFallback.Load()
	return m
}

// catalogue: the shared families first, fed from vhostnet's counters, then vhost-user's
// own (tapgro_vhost_*).
func (v *vhostDP) catalogue(m *Metrics) {
	vn := v.vn
	st, bs := vn.Stats(), vn.BackendStats()
	for _, d := range []struct {
		dir                string
		frames, bytes, gso func() uint64
	}{
		{"port_to_tap", st.TXFrames.Load, st.TXBytes.Load, st.TXGSO.Load},
		{"tap_to_port", st.RXFrames.Load, st.RXBytes.Load, st.RXGSO.Load},
	} {
		m.addFrames(d.dir, u(d.frames), u(d.bytes))
		m.addGSOPassthrough(d.dir, u(d.gso))
	}
	m.addGSOSegmented(u(st.GSOSegmented.Load))
	for r := vhostnet.Drop(0); r < vhostnet.NumDrops; r++ {
		m.addDropped(r.Dir(), r.String(), u(st.Drops[r].Load))
	}
	m.addConnected(func(*Source) float64 { return b2f(vn.State().Connected) })
	m.addConnections(u(bs.Sessions.Load), u(bs.Ended.Load), u(bs.Refused.Load))
	c, ct := vn.Capture().Stats(), vn.TapCapture().Stats()
	m.addPcap("port", u(c.Frames.Load), u(c.Dropped.Load))
	m.addPcap("tap", u(ct.Frames.Load), u(ct.Dropped.Load))
	// side=tap: what TUNSETOFFLOAD set; side=port: what the guest acked it can receive
	// (while a session has acked); killed: the GSO kinds the kernel refuses on write
	// (package gsowrite), which are cut before the write.
	m.addOffloadState(func(*Source) vnethdr.Offloads { return vn.State().TapOffloads },
		func(*Source) vnethdr.Offloads {
			if s := vn.State(); s.AckedValid {
				return vhostnet.RXOffloads(s.Acked)
			}
			return 0
		},
		func(*Source) vnethdr.Offloads { return vn.TapKilled() })
	m.addGSOWriteFallback(u(st.GSOFallback.Load))
	// Per queue pair: the TAP steers each flow to one queue (drivers/net/tun.c
	// tun_automq_select_queue), so these show how the flows spread over the pairs.
	for i := range st.Queues {
		q := &st.Queues[i]
		ql := strconv.Itoa(i)
		for _, d := range []struct {
			dir           string
			frames, bytes func() uint64
		}{
			{"port_to_tap", q.TXFrames.Load, q.TXBytes.Load},
			{"tap_to_port", q.RXFrames.Load, q.RXBytes.Load},
		} {
			l := Labels{"queue": ql, "direction": d.dir}
			m.add("tapgro_vhost_queue_frames_total", "vhost-user: frames moved by one queue pair (its rings and its TAP queue).", Counter, l, u(d.frames))
			m.add("tapgro_vhost_queue_bytes_total", "vhost-user: Ethernet bytes moved by one queue pair, virtio-net header excluded.", Counter, l, u(d.bytes))
		}
		m.add("tapgro_vhost_queue_attached", "vhost-user: 1 while the queue pair's TAP queue is attached (the guest enabled the pair).", Gauge,
			Labels{"queue": ql}, func(*Source) float64 { return b2f(q.Attached.Load()) })
	}
	for r := vhostuser.Reason(0); r < vhostuser.NumReasons; r++ {
		m.add("tapgro_vhost_rejected_total", "vhost-user: chains or rings the guest broke, by reason (each stops that ring until the device is reset; a fault also ends the session).",
			Counter, Labels{"reason": r.String()}, u(bs.Rejected[r].Load))
	}
	m.add("tapgro_vhost_rx_chains_total", "vhost-user: receive descriptor chains filled (more than frames with mergeable buffers).", Counter, nil, u(st.RXChains.Load))
	m.addRXStalls(u(st.RXStalls.Load))
	m.add("tapgro_vhost_tx_holds_total", "vhost-user: times a TX worker that moved bulk held (--tx-hold) with kicks off instead of waiting for the next kick.", Counter, nil, u(st.TXHolds.Load))
	m.add("tapgro_vhost_tx_blocked_total", "vhost-user: times guest → TAP waited for the TAP to take a frame.", Counter, nil, u(st.TXBlocked.Load))
	m.add("tapgro_vhost_tx_split_total", "vhost-user: guest GSO frames of a kind the kernel refuses on write (its probe refused too), cut into plain segments before the write.", Counter, nil, u(st.TXSplit.Load))
	m.add("tapgro_vhost_tx_linearized_total", "vhost-user: guest frames of more segments than one writev takes, copied.", Counter, nil, u(st.Linearized.Load))
	m.add("tapgro_vhost_kicks_total", "vhost-user: kick eventfd reads (the guest posted work).", Counter, nil, u(bs.Kicks.Load))
	m.add("tapgro_vhost_poll_hits_total", "vhost-user: times a TX worker's poll window (--vhost-poll) saw the guest post chains, taken with no kick.", Counter, nil, u(bs.PollHits.Load))
	m.add("tapgro_vhost_calls_total", "vhost-user: call eventfd signals (interrupts to the guest).", Counter, nil, u(bs.Calls.Load))
	m.add("tapgro_vhost_calls_deferred_total", "vhost-user: calls to the guest moderation held back (--call-interval); each was sent later, merged with the next, or found unneeded.", Counter, nil, u(bs.CallsDeferred.Load))
	m.add("tapgro_vhost_calls_dropped_total", "vhost-user: calls the front-end's call eventfd refused (its counter full); the count already in it wakes the guest.", Counter, nil, u(bs.CallsDropped.Load))
	m.add("tapgro_vhost_log_active", "vhost-user: 1 while the front-end has dirty logging on (a live migration is copying guest memory).", Gauge, nil,
		func(*Source) float64 { return b2f(bs.Logging.Load()) })
	m.add("tapgro_vhost_log_pages_total", "vhost-user: guest pages marked dirty for a migration (bits set from 0 to 1 in the front-end's log).", Counter, nil, u(bs.LogPages.Load))
	m.add("tapgro_vhost_log_beyond_total", "vhost-user: pages written past the end of the front-end's dirty log (a log sized too small; not marked).", Counter, nil, u(bs.LogBeyond.Load))
	m.add("tapgro_vhost_rarp_total", "vhost-user: announcements (RARP from the guest's MAC) put into the TAP after a migration.", Counter, nil, u(st.RARPs.Load))
	m.add("tapgro_vhost_sessions_jammed_total", "vhost-user: sessions ended because a write to one of the front-end's eventfds slept (it filled the counter and made the fd blocking).", Counter, nil, u(bs.Jammed.Load))
	m.add("tapgro_vhost_peers_refused_total", "vhost-user: connections closed unserved because the peer's uid and gid are not on --allow-peer.", Counter, nil, u(bs.PeerRefused.Load))
	m.add("tapgro_vhost_workers_left_total", "vhost-user: ring workers not joined at a ring's stop, asleep in a write to an eventfd the front-end kept blocked.", Counter, nil, u(st.WorkersLeft.Load))
	m.add("tapgro_vhost_messages_unknown_total", "vhost-user: front-end requests refused as unknown or not negotiated.", Counter, nil, u(bs.Unknown.Load))
	m.add("tapgro_vhost_messages_failed_total", "vhost-user: front-end requests answered with a failure.", Counter, nil, u(bs.Failed.Load))
	// GRO toward the TAP: the engine's series, same names and meaning, except the
	// segments-per-packet histogram (segments_total / packets_total gives the mean;
	// integration's TestQEMUVhostUser checks every scraped name, histogram suffixes
	// included, against docs/metrics.md). RSC toward the guest has its own (the engine's
	// are port → TAP only).
	m.addGRO(func(*Source) *coalescer.Stats { return &st.GRO }, false)
	rsc := &st.RSC
	m.add("tapgro_vhost_rsc_segments_total", "vhost-user: frames from the TAP that entered the coalescer toward the guest.", Counter, nil, u(rsc.Segments.Load))
	m.add("tapgro_vhost_rsc_packets_total", "vhost-user: packets the coalescer toward the guest handed to it (GSO packets and frames passed through).", Counter, nil, u(rsc.Packets.Load))
	m.add("tapgro_vhost_rsc_coalesced_total", "vhost-user: TAP frames merged into an existing aggregate toward the guest.", Counter, nil, u(rsc.Coalesced.Load))
	m.add("tapgro_vhost_rsc_gso_packets_total", "vhost-user: GSO packets (2 or more segments) the coalescer handed the guest.", Counter, nil, u(rsc.GSOOut.Load))
}

// work is each queue pair's wait flags and the counters that move when its work gets
// done. Drops count as progress for every pair of their direction (they are counted per
// port; a waiting worker drops nothing).
func (v *vhostDP) work(w []watch) []watch {
	st := v.vn.Stats()
	var drops [numDirs]uint64
	for r := vhostnet.Drop(0); r < vhostnet.NumDrops; r++ {
		if r.IsRX() {
			drops[dirTapToPort] += st.Drops[r].Load()
		} else {
			drops[dirPortToTap] += st.Drops[r].Load()
		}
	}
	for i := range st.Queues {
		q := &st.Queues[i]
		pair := ""
		if len(st.Queues) > 1 {
			pair = fmt.Sprintf(" (queue pair %d)", i)
		}
		rx := watch{dir: dirTapToPort, name: dirNames[dirTapToPort] + pair, progress: q.RXFrames.Load() + drops[dirTapToPort]}
		if q.RXWaiting.Load() {
			rx.pending, rx.detail = true, "frames wait in the TAP and the guest posts no receive buffers"
		}
		tx := watch{dir: dirPortToTap, name: dirNames[dirPortToTap] + pair, progress: q.TXFrames.Load() + drops[dirPortToTap]}
		if q.TXWaiting.Load() {
			tx.pending, tx.detail = true, "a guest frame waits for the TAP to take it"
		}
		w = append(w, rx, tx)
	}
	return w
}

// status is vhost-user's part of `tapgro ctl status`.
func (v *vhostDP) status() *Status {
	vs, st, bs := v.vn.State(), v.vn.Stats(), v.vn.BackendStats()
	vst := &VhostStatus{
		Offered: virtio.Names(vs.Offered), HdrLen: vs.Acked.HdrLen,
		TapOffloads: vs.TapOffloads.String(), GuestMTU: vs.GuestMTU,
		Sessions: bs.Sessions.Load(), Kicks: bs.Kicks.Load(), Calls: bs.Calls.Load(),
		RXStalls: st.RXStalls.Load(), GSOToTap: st.TXGSO.Load(), GSOToGuest: st.RXGSO.Load(),
		GSOCut: st.GSOSegmented.Load(), OffloadChoice: v.vn.OffloadChoice().String(),
		Logging: bs.Logging.Load(), LogPages: bs.LogPages.Load(), RARPs: st.RARPs.Load(),
		QueuePairs: vs.QueuePairs, QueuesAttached: []int{},
	}
	for i, a := range vs.Attached {
		if a {
			vst.QueuesAttached = append(vst.QueuesAttached, i)
		}
	}
	if vs.AckedValid {
		vst.Acked = virtio.Names(vs.Acked.Bits)
	}
	for r := range bs.Rejected {
		vst.Rejected += bs.Rejected[r].Load()
	}
	var txDrop, rxDrop uint64
	for r := vhostnet.Drop(0); r < vhostnet.NumDrops; r++ {
		if r.IsRX() {
			rxDrop += st.Drops[r].Load()
		} else {
			txDrop += st.Drops[r].Load()
		}
	}
	tx, rx := st.TXFrames.Load(), st.RXFrames.Load()
	return &Status{
		PortConnected: vs.Connected, OffloadChoice: vst.OffloadChoice,
		GRO: v.vn.GROActive(), GROActive: v.vn.GROActive(),
		UDPGRO: v.vn.UDPGROActive(), UDPGROActive: v.vn.UDPGROActive(),
		TapProbed: vs.TapProbed.String(), TapOffloads: vst.TapOffloads,
		PcapTap: v.vn.TapCapture().Describe(), PcapPort: v.vn.Capture().Describe(),
		Counters: Counters{
			PortToTap:    DirCounters{Reads: tx + txDrop, Frames: tx, Bytes: st.TXBytes.Load(), Dropped: txDrop},
			TapToPort:    DirCounters{Reads: rx + rxDrop, Frames: rx, Bytes: st.RXBytes.Load(), Dropped: rxDrop},
			GSOSegmented: st.GSOSegmented.Load(),
			// The GRO toward the TAP counts as the engine's does (the exit line and
			// /metrics have the same two numbers).
			GROSegments: st.GRO.Segments.Load(), GROPackets: st.GRO.Packets.Load(),
			GSOWriteFallback: st.GSOFallback.Load(),
		},
		Vhost: vst,
	}
}
