package ops

import (
	"fmt"

	"tapgro/datapath"
	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/vnethdr"
)

// Engine is what the operator surfaces read and steer of the engine: datapath.Engine's
// Snapshot and switches.
type Engine interface {
	Snapshot() datapath.Snapshot
	SetGRO(on bool) *datapath.Negotiation
	SetUDPGRO(on bool) *datapath.Negotiation
	SetOffloads(c vnethdr.Choice) (vnethdr.Offloads, error)
	SetCapture(side datapath.CaptureSide, path string) error
}

var _ Engine = (*datapath.Engine)(nil)

// engineDP is the engine behind a socket or netmap port.
type engineDP struct {
	eng         Engine
	port        *port.Stats
	own         []port.Counter // the transport's own (port.CounterSource), exported as they come
	tap, listen string
}

// EngineDatapath is eng as the operator surfaces see it. ps is its endpoint's counters,
// own the transport's own (netmap's; nil: none), tap the TAP's name and listen the
// port's address.
func EngineDatapath(eng Engine, ps *port.Stats, own []port.Counter, tap, listen string) Datapath {
	return &engineDP{eng: eng, port: ps, own: own, tap: tap, listen: listen}
}

func (e *engineDP) names() (string, string) { return e.tap, e.listen }

// problems: the engine's drops by direction and reason, the receive pool's, GSO write
// fallbacks, and the port's per-frame errors.
func (e *engineDP) problems() map[string]uint64 {
	return ProblemCounts(e.eng.Snapshot(), PortProblems(e.port))
}

// refuse: the engine has every switch.
func (e *engineDP) refuse(ctlCaps) error { return nil }

// catalogue: every value but the TAP's and the port's own counters comes from the one
// Snapshot Collect takes per scrape (catalog_engine.go).
func (e *engineDP) catalogue(m *Metrics) {
	m.port, m.portCounters = e.port, e.own
	m.snapshot = e.eng.Snapshot
	m.addDatapath()
	m.addCoalescer()
	m.addDevice(e.eng.Snapshot())
	m.addRxPool()
	m.addOffload()
	m.addPeer()
}

// work reads, from one Snapshot, whether each direction has work pending and the
// counter that moves when it gets done.
func (e *engineDP) work(w []watch) []watch {
	snap := e.eng.Snapshot()
	rs := snap.Pool
	out := watch{dir: dirTapToPort, name: dirNames[dirTapToPort], progress: rs.FramesSent.Load() + snap.TapToPort.Drops[datapath.DropPortError]}
	for d := rxpool.Drop(0); d < rxpool.NumDrops; d++ {
		out.progress += rs.Drops[d].Load()
	}
	if inUse := rs.InUse.Load(); snap.Connected && inUse > 0 {
		out.pending, out.detail = true, fmt.Sprintf("%d receive-pool buffers queued for the port", inUse)
	}
	in := watch{dir: dirPortToTap, name: dirNames[dirPortToTap], progress: snap.PortToTap.Reads}
	if snap.PeerUnread > 0 {
		in.pending, in.detail = true, fmt.Sprintf("%d bytes unread on the port", snap.PeerUnread)
	}
	return append(w, out, in)
}

// status is the engine's state from one Snapshot.
func (e *engineDP) status() *Status {
	snap := e.eng.Snapshot()
	st := &Status{
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

func (e *engineDP) offloads() (vnethdr.Choice, vnethdr.Offloads) {
	snap := e.eng.Snapshot()
	return snap.Offload, snap.TapProbed
}

func (e *engineDP) setOffloads(c vnethdr.Choice) (vnethdr.Offloads, error) {
	return e.eng.SetOffloads(c)
}

func (e *engineDP) setGRO(on bool) (bool, error) {
	n := e.eng.SetGRO(on)
	return n != nil && n.P2T&datapath.StepGRO != 0, nil
}

func (e *engineDP) setUDPGRO(on bool) (bool, error) {
	n := e.eng.SetUDPGRO(on)
	return n != nil && n.P2T&datapath.StepUDPGRO != 0, nil
}

func (e *engineDP) setCapture(side datapath.CaptureSide, path string) error {
	return e.eng.SetCapture(side, path)
}
