package ops

import (
	"fmt"
	"io"
	"strings"

	"tapgro/datapath"
	"tapgro/onoff"
	"tapgro/vhostnet"
	"tapgro/virtio"
)

// What `tapgro ctl status` shows, built from the engine's Snapshot or from vhostnet's
// state, and its text form.

// vhostStatus is a vhost-user datapath's state.
func (s *CtlServer) vhostStatus() *Status {
	vs, st, bs := s.vn.State(), s.vn.Stats(), s.vn.BackendStats()
	v := &VhostStatus{
		Offered: virtio.Names(vs.Offered), HdrLen: vs.Acked.HdrLen,
		TapOffloads: vs.TapOffloads.String(), GuestMTU: vs.GuestMTU,
		Sessions: bs.Sessions.Load(), Kicks: bs.Kicks.Load(), Calls: bs.Calls.Load(),
		RXStalls: st.RXStalls.Load(), GSOToTap: st.TXGSO.Load(), GSOToGuest: st.RXGSO.Load(),
		QueuePairs: vs.QueuePairs, QueuesAttached: []int{},
	}
	for i, a := range vs.Attached {
		if a {
			v.QueuesAttached = append(v.QueuesAttached, i)
		}
	}
	if vs.AckedValid {
		v.Acked = virtio.Names(vs.Acked.Bits)
	}
	for r := range bs.Rejected {
		v.Rejected += bs.Rejected[r].Load()
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
		Version: s.ver, Tap: s.tap, Listen: s.listen, PortConnected: vs.Connected,
		TapProbed: vs.TapProbed.String(), TapOffloads: v.TapOffloads,
		PcapTap: "off", PcapPort: s.vn.Capture().Describe(),
		Counters: Counters{
			PortToTap: DirCounters{Reads: tx + txDrop, Frames: tx, Bytes: st.TXBytes.Load(), Dropped: txDrop},
			TapToPort: DirCounters{Reads: rx + rxDrop, Frames: rx, Bytes: st.RXBytes.Load(), Dropped: rxDrop},
		},
		Vhost: v,
	}
}

// engineStatus is the engine's state from one Snapshot.
func (s *CtlServer) engineStatus() *Status {
	snap := s.eng.Snapshot()
	st := &Status{
		Version: s.ver, Tap: s.tap, Listen: s.listen,
		PortConnected: snap.Connected, Peer: snap.Peer,
		GRO: snap.GROOn, GROKilled: snap.GROKilled, UDPGRO: snap.UDPGROOn,
		OffloadsKilled: snap.OffloadsKilled.String(),
		PcapTap:        snap.CaptureTap.State, PcapPort: snap.CapturePort.State,
		OffloadChoice: snap.Offload.String(), TapProbed: snap.TapProbed.String(),
	}
	if n := snap.Negotiation; n != nil {
		st.Negotiated = n.String()
		st.TapOffloads = n.TapOffloads.String()
		st.TapWrite = n.TapWrite.String()
		st.PortState = n.Port.State
		st.PortAccepts = n.Port.Accepts.String()
		st.StepsTapToPort = n.T2P.String()
		st.StepsPortToTap = n.P2T.String()
		st.GROActive = n.P2T&datapath.StepGRO != 0
		st.UDPGROActive = n.P2T&datapath.StepUDPGRO != 0
	}
	c := &st.Counters
	t2p, p2t := &snap.TapToPort, &snap.PortToTap
	c.TapToPort = DirCounters{Reads: t2p.Reads, Frames: t2p.Frames, Bytes: t2p.Bytes, Dropped: snap.Dropped(t2p)}
	c.PortToTap = DirCounters{Reads: p2t.Reads, Frames: p2t.Frames, Bytes: p2t.Bytes, Dropped: snap.Dropped(p2t)}
	if g := snap.GRO; g != nil {
		c.GROSegments, c.GROPackets = g.Segments.Load(), g.Packets.Load()
	}
	c.GSOSegmented = t2p.GSOSegmented
	c.CsumCompleted = t2p.CsumCompleted
	c.GSOWriteFallback = p2t.GSOFallback
	return st
}

// lines is status as "key: value" pairs in the order `tapgro ctl status` prints them.
func (st *Status) lines() [][2]string {
	port := "waiting for a peer on " + st.Listen
	if st.PortConnected {
		port = "connected to " + st.Peer + " (on " + st.Listen + ")"
	}
	c := &st.Counters
	dir := func(d DirCounters) string {
		return fmt.Sprintf("%d frames, %d bytes (read %d, dropped %d)", d.Frames, d.Bytes, d.Reads, d.Dropped)
	}
	if v := st.Vhost; v != nil {
		if st.PortConnected {
			port = "vhost-user front-end connected (on " + st.Listen + ")"
		}
		acked := strings.Join(v.Acked, " ")
		if len(v.Acked) == 0 {
			acked = "none yet (the guest has not started its driver)"
		}
		mtu := "not told (give the NIC host_mtu=N)"
		if v.GuestMTU != 0 {
			mtu = fmt.Sprint(v.GuestMTU)
		}
		rows := [][2]string{
			{"tap", st.Tap},
			{"version", st.Version},
			{"port", port},
			{"features offered", strings.Join(v.Offered, " ")},
			{"features acked", acked},
			{"header", fmt.Sprintf("%d bytes (TAP and guest)", v.HdrLen)},
			{"tap offloads", st.TapOffloads + " (what the guest acked to receive)"},
			{"tap offers", st.TapProbed},
			{"guest mtu", mtu},
			{"guest->tap", dir(c.PortToTap) + fmt.Sprintf(", %d GSO whole", v.GSOToTap)},
			{"tap->guest", dir(c.TapToPort) + fmt.Sprintf(", %d GSO whole", v.GSOToGuest)},
			{"sessions", fmt.Sprint(v.Sessions)},
			{"kicks / calls", fmt.Sprintf("%d / %d", v.Kicks, v.Calls)},
			{"rx stalls", fmt.Sprintf("%d (the guest had no receive buffers)", v.RXStalls)},
			{"rings rejected", fmt.Sprint(v.Rejected)},
			{"pcap port", st.PcapPort},
		}
		if v.QueuePairs > 1 {
			rows = append(rows, [2]string{"queue pairs", fmt.Sprintf("%d, TAP queues attached: %v (the pairs the guest uses)", v.QueuePairs, v.QueuesAttached)})
		}
		return rows
	}
	gro := onoff.String(st.GRO)
	switch {
	case st.GROKilled:
		gro += " (inactive: the kernel refused a GSO write; sticky until restart)"
	case st.GRO && !st.GROActive:
		gro += " (inactive)"
	}
	udp := onoff.String(st.UDPGRO)
	if st.UDPGRO && !st.UDPGROActive {
		udp += " (inactive: needs gro on and a TAP that accepts USO on write)"
	}
	gp := fmt.Sprintf("%d segments into %d packets", c.GROSegments, c.GROPackets)
	if c.GROPackets > 0 {
		gp += fmt.Sprintf(" (%.1f per packet)", float64(c.GROSegments)/float64(c.GROPackets))
	}
	return [][2]string{
		{"tap", st.Tap},
		{"version", st.Version},
		{"port", port},
		{"negotiated", st.Negotiated},
		{"offload choice", st.OffloadChoice},
		{"tap offloads", st.TapOffloads},
		{"tap offers", st.TapProbed},
		{"tap takes on write", st.TapWrite},
		{"port backend", st.PortState},
		{"port accepts", st.PortAccepts},
		{"tap->port steps", st.StepsTapToPort},
		{"port->tap steps", st.StepsPortToTap},
		{"gro", gro},
		{"udp-gro", udp},
		{"offloads refused", st.OffloadsKilled},
		{"tap->port", dir(c.TapToPort)},
		{"port->tap", dir(c.PortToTap)},
		{"gro coalesced", gp},
		{"gso segmented", fmt.Sprint(c.GSOSegmented)},
		{"csum completed", fmt.Sprint(c.CsumCompleted)},
		{"gso write fallback", fmt.Sprint(c.GSOWriteFallback)},
		{"pcap tap", st.PcapTap},
		{"pcap port", st.PcapPort},
	}
}

// writeStatus prints st aligned.
func WriteStatus(w io.Writer, st *Status) {
	ls := st.lines()
	width := 0
	for _, l := range ls {
		width = max(width, len(l[0])+1)
	}
	for _, l := range ls {
		fmt.Fprintf(w, "%-*s %s\n", width, l[0]+":", l[1])
	}
}

// Logger receives the operator surfaces' events; main adapts it to its logger. kv are
// alternating keys and values, an error under the key "error".
type Logger = datapath.Logger
