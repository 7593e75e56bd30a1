package ops

import (
	"runtime"
	"sort"
	"strconv"
	"time"

	"tapgro/coalescer"
	"tapgro/datapath"
	"tapgro/pcapio"
	"tapgro/port"
	"tapgro/vhostnet"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// The metric catalogue: every series tapgro exports, each a name, help text, labels and
// a value read from one Snapshot of the engine (plus the port's own counters) per
// scrape. The packet path keeps plain atomic counters, so metrics cost the datapath
// nothing but the atomic adds. This package describes the series; package main hands
// them to the Prometheus client, the only place that imports it.

// Kind is a series' type.
type Kind uint8

const (
	Counter Kind = iota
	Gauge
	Histogram
)

// Labels name a series within its family.
type Labels map[string]string

// Sample is one series' value at a scrape.
type Sample struct {
	Name, Help  string
	Kind        Kind
	LabelNames  []string // sorted
	LabelValues []string // in LabelNames' order
	Value       float64  // Counter and Gauge

	// Histogram: cumulative counts per upper bound, the total count and the sum.
	Buckets map[float64]uint64
	Count   uint64
	Sum     float64
}

// Source is what one scrape reads: the engine's Snapshot and the port's counters.
type Source struct {
	Snap *datapath.Snapshot
	Port *port.Stats
}

type series struct {
	name, help string
	kind       Kind
	keys, vals []string
	value      func(*Source) float64
}

// Metrics is the catalogue for one running tapgro.
type Metrics struct {
	eng  Snapshotter
	port *port.Stats
	// portCounters are the transport's own (port.CounterSource), exported as they come.
	portCounters []port.Counter
	series       []series
	custom       []func(*Source) *Sample // series that are not a single value, or may be absent
}

func (m *Metrics) add(name, help string, kind Kind, labels Labels, v func(*Source) float64) {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	vals := make([]string, len(keys))
	for i, k := range keys {
		vals[i] = labels[k]
	}
	m.series = append(m.series, series{name: name, help: help, kind: kind, keys: keys, vals: vals, value: v})
}

// Collect takes one Snapshot and hands every series to emit.
func (m *Metrics) Collect(emit func(*Sample)) {
	src := &Source{Port: m.port}
	if m.eng != nil { // nil for vhost-user, which has no engine (NewVhostMetrics)
		snap := m.eng.Snapshot()
		src.Snap = &snap
	}
	var s Sample
	for i := range m.series {
		d := &m.series[i]
		s = Sample{Name: d.name, Help: d.help, Kind: d.kind, LabelNames: d.keys, LabelValues: d.vals, Value: d.value(src)}
		emit(&s)
	}
	for _, f := range m.custom {
		if c := f(src); c != nil {
			emit(c)
		}
	}
}

// NewVhostMetrics is the catalogue for --netdev vhost-user: vhostnet's counters (vn's
// Stats and its capture) and the vhost-user back-end's, with no engine behind
// them; health adds the stall gauges (nil: none). The families every port kind shares
// (shared.go) come first, fed from vhostnet's counters: port_to_tap is guest → TAP
// (vhostnet TX), tap_to_port TAP → guest (RX); a session is a connection. The rest is
// vhost-user's own (tapgro_vhost_*).
func NewVhostMetrics(vn VhostNet, health *HealthMonitor, version string) *Metrics {
	m := &Metrics{}
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
	for r := vhostnet.Drop(0); r < vhostnet.NumDrops; r++ {
		m.addDropped(r.Dir(), r.String(), u(st.Drops[r].Load))
	}
	m.addConnected(func(*Source) float64 { return b2f(vn.State().Connected) })
	m.addConnections(u(bs.Sessions.Load), u(bs.Ended.Load), u(bs.Refused.Load))
	c := vn.Capture().Stats()
	m.addPcap("port", u(c.Frames.Load), u(c.Dropped.Load))
	// side=tap: what TUNSETOFFLOAD set; side=port: what the guest acked it can receive
	// (while a session has acked). vhost-user kills no offload: the TAP's write path
	// takes what the guest sends, validated.
	m.addOffloadState(func(*Source) vnethdr.Offloads { return vn.State().TapOffloads },
		func(*Source) vnethdr.Offloads {
			if s := vn.State(); s.AckedValid {
				return vhostnet.RXOffloads(s.Acked)
			}
			return 0
		},
		func(*Source) vnethdr.Offloads { return 0 })
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
	m.add("tapgro_vhost_rx_stalls_total", "vhost-user: times TAP → guest waited for the guest to post buffers.", Counter, nil, u(st.RXStalls.Load))
	m.add("tapgro_vhost_tx_blocked_total", "vhost-user: times guest → TAP waited for the TAP to take a frame.", Counter, nil, u(st.TXBlocked.Load))
	m.add("tapgro_vhost_tx_linearized_total", "vhost-user: guest frames of more segments than one writev takes, copied.", Counter, nil, u(st.Linearized.Load))
	m.add("tapgro_vhost_kicks_total", "vhost-user: kick eventfd reads (the guest posted work).", Counter, nil, u(bs.Kicks.Load))
	m.add("tapgro_vhost_calls_total", "vhost-user: call eventfd signals (interrupts to the guest).", Counter, nil, u(bs.Calls.Load))
	m.add("tapgro_vhost_calls_deferred_total", "vhost-user: calls to the guest moderation held back (--call-interval); each was sent later, merged with the next, or found unneeded.", Counter, nil, u(bs.CallsDeferred.Load))
	m.add("tapgro_vhost_calls_dropped_total", "vhost-user: calls the front-end's call eventfd refused (its counter full); the count already in it wakes the guest.", Counter, nil, u(bs.CallsDropped.Load))
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
	if health != nil {
		m.addStalled(health)
	}
	m.addProcess(version)
	return m
}

// addProcess adds the series about the process itself, the same for every datapath.
func (m *Metrics) addProcess(version string) {
	m.add("tapgro_build_info", "Build version.", Gauge, Labels{"version": version}, func(*Source) float64 { return 1 })
	start := float64(time.Now().Unix())
	m.add("tapgro_start_time_seconds", "Process start time (Unix seconds).", Gauge, nil, func(*Source) float64 { return start })
	m.add("tapgro_gomaxprocs", "Threads that may run tapgro's code at once (GOMAXPROCS): --procs, or what the load scaler set.", Gauge, nil, func(*Source) float64 { return float64(runtime.GOMAXPROCS(0)) })
}

// VhostNet is what the operator surfaces read of a vhost-user datapath (*vhostnet.Net).
type VhostNet interface {
	Stats() *vhostnet.Stats
	BackendStats() *vhostuser.Stats
	State() vhostnet.State
	Capture() *pcapio.Point
	SetCapture(path string) error
}

var _ VhostNet = (*vhostnet.Net)(nil)

// u reads a counter that is not the engine's (the port's own, through the Source).
func u(f func() uint64) func(*Source) float64 {
	return func(*Source) float64 { return float64(f()) }
}

// snapU is a counter read from the scrape's Snapshot.
func snapU(f func(*datapath.Snapshot) uint64) func(*Source) float64 {
	return func(s *Source) float64 { return float64(f(s.Snap)) }
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// NewMetrics is the catalogue for eng and its port endpoint's counters (nm: the netmap
// counters, or nil); health adds the stall gauges (nil: none). version is tapgro's.
func NewMetrics(eng Snapshotter, ps *port.Stats, own []port.Counter, health *HealthMonitor, version string) *Metrics {
	m := &Metrics{eng: eng, port: ps, portCounters: own}
	m.addDatapath()
	m.addCoalescer()
	m.addDevice(eng)
	m.addRxPool()
	m.addOffload()
	if health != nil {
		m.addHealth(health)
	}
	m.addProcess(version)
	return m
}
