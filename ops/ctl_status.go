package ops

import (
	"fmt"
	"io"
	"strings"

	"tapgro/datapath"
	"tapgro/onoff"
)

// What `tapgro ctl status` shows, built from the engine's Snapshot or from vhostnet's
// state, and its text form.

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
			{"sandbox", st.Sandbox},
			{"port", port},
			{"features offered", strings.Join(v.Offered, " ")},
			{"features acked", acked},
			{"header", fmt.Sprintf("%d bytes (TAP and guest)", v.HdrLen)},
			{"offload choice", v.OffloadChoice},
			{"tap offloads", st.TapOffloads + " (what the guest acked to receive, within the choice; USO also to cut for a guest without it)"},
			{"tap offers", st.TapProbed},
			{"gro", onoff.String(st.GROActive) + " (toward the TAP, and RSC toward a guest the TAP hands MTU frames)"},
			{"udp-gro", onoff.String(st.UDPGROActive)},
			{"guest mtu", mtu},
			{"guest->tap", dir(c.PortToTap) + fmt.Sprintf(", %d GSO whole", v.GSOToTap)},
			{"tap->guest", dir(c.TapToPort) + fmt.Sprintf(", %d GSO whole, %d GSO cut", v.GSOToGuest, v.GSOCut)},
			{"sessions", fmt.Sprint(v.Sessions)},
			{"kicks / calls", fmt.Sprintf("%d / %d", v.Kicks, v.Calls)},
			{"rx stalls", fmt.Sprintf("%d (the guest had no receive buffers)", v.RXStalls)},
			{"rings rejected", fmt.Sprint(v.Rejected)},
			{"migration log", fmt.Sprintf("%s, %d pages marked, %d RARP sent", onoff.String(v.Logging), v.LogPages, v.RARPs)},
			{"pcap tap", st.PcapTap},
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
		{"sandbox", st.Sandbox},
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

// WriteStatus prints st aligned.
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
