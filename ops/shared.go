package ops

import "tapgro/vnethdr"

// The families every port kind exports under one name, with one help text, so that a
// dashboard built on a stream port reads a vhost-user port unchanged. Each port kind's
// Datapath.catalogue (dp_engine.go for the engine, dp_vhost.go for vhost-user) feeds them from
// its own counters; what only one kind has keeps a name of its own (tapgro_vhost_*,
// tapgro_netmap_*, tapgro_rx_* for the engine's receive pool). Directions are the
// engine's: tap_to_port is TAP → peer (for vhost-user, TAP → guest), port_to_tap the
// other way. docs/metrics.md is the table; the tests check it against both catalogues.

func (m *Metrics) addFrames(dir string, frames, bytes func(*Source) float64) {
	l := Labels{"direction": dir}
	m.add("tapgro_frames_total", "Frames (or GSO packets, towards the TAP) delivered to the far side.", Counter, l, frames)
	m.add("tapgro_bytes_total", "Ethernet bytes delivered to the far side.", Counter, l, bytes)
}

func (m *Metrics) addDropped(dir, reason string, v func(*Source) float64) {
	m.add("tapgro_dropped_total", "Frames dropped, by direction and reason.", Counter, Labels{"direction": dir, "reason": reason}, v)
}

func (m *Metrics) addGSOPassthrough(dir string, v func(*Source) float64) {
	m.add("tapgro_gso_passthrough_total", "GSO frames handed on whole (tap_to_port: to a vnet-hdr port or a guest; port_to_tap: from one to the TAP).",
		Counter, Labels{"direction": dir}, v)
}

// addGSOSegmented: GSO frames from the TAP cut in software because the peer cannot take
// them whole (vhost-user: UDP GSO for a guest without GUEST_USO4/6).
func (m *Metrics) addGSOSegmented(v func(*Source) float64) {
	m.add("tapgro_gso_segmented_total", "GSO frames from the TAP split in software for the port.", Counter, nil, v)
}

// addGSOWriteFallback: GSO writes the TAP refused with EINVAL and sent again as plain
// segments (package gsowrite's policy, on every port kind).
func (m *Metrics) addGSOWriteFallback(v func(*Source) float64) {
	m.add("tapgro_gro_gso_write_fallback_total", "GSO writes the kernel refused (EINVAL) and that were re-sent segmented.", Counter, nil, v)
}

// addRXStalls: times TAP → peer met a peer that could take no more (the engine: the
// port's socket or ring full; vhost-user: the guest posted no receive buffers).
func (m *Metrics) addRXStalls(v func(*Source) float64) {
	m.add("tapgro_rx_stalls_total", "Times the port could not take more frames (backpressure; vhost-user: the guest had no receive buffers).", Counter, nil, v)
}

func (m *Metrics) addConnected(v func(*Source) float64) {
	m.add("tapgro_port_connected", "1 while a peer is connected to the port.", Gauge, nil, v)
}

// addConnections: peers served, sessions ended, and extra peers turned away while one
// was served (vhost-user: front-end sessions).
func (m *Metrics) addConnections(connects, disconnects, rejects func(*Source) float64) {
	m.add("tapgro_port_connects_total", "Peers connected (or datagram sockets opened; vhost-user: front-end sessions).", Counter, nil, connects)
	m.add("tapgro_port_disconnects_total", "Peer connections ended.", Counter, nil, disconnects)
	m.add("tapgro_port_rejects_total", "Extra clients turned away while one was served.", Counter, nil, rejects)
}

func (m *Metrics) addPcap(side string, frames, dropped func(*Source) float64) {
	l := Labels{"side": side}
	m.add("tapgro_pcap_frames_total", "Frames written to the capture file, by side.", Counter, l, frames)
	m.add("tapgro_pcap_dropped_total", "Frames the capture could not write (file error, size cap without rotation), by side.", Counter, l, dropped)
}

// offloadNames are the offloads tapgro_offload_enabled and tapgro_offload_killed name.
var offloadNames = []struct {
	name string
	bit  vnethdr.Offloads
}{
	{"csum", vnethdr.OffloadCSUM}, {"tso4", vnethdr.OffloadTSO4}, {"tso6", vnethdr.OffloadTSO6},
	{"tso_ecn", vnethdr.OffloadTSOECN}, {"uso", vnethdr.OffloadUSO}, {"ufo", vnethdr.OffloadUFO},
}

// addOffloadState: for each offload, whether the TAP hands it to tapgro (side=tap,
// TUNSETOFFLOAD), whether the peer takes it (side=port: the port's accepts, a guest's
// receive acks), and whether the kernel refused it for good (killed).
func (m *Metrics) addOffloadState(tap, port, killed func(*Source) vnethdr.Offloads) {
	for _, o := range offloadNames {
		bit := o.bit
		m.add("tapgro_offload_killed", "1 for an offload whose GSO writes the kernel refused (EINVAL, sticky): frames of that kind go to the TAP segmented.",
			Gauge, Labels{"offload": o.name}, func(src *Source) float64 { return b2f(killed(src)&bit == bit) })
		for _, side := range []struct {
			name string
			set  func(*Source) vnethdr.Offloads
		}{{"tap", tap}, {"port", port}} {
			set := side.set
			m.add("tapgro_offload_enabled", "1 if the negotiated offload is on: side=tap what the TAP hands tapgro (TUNSETOFFLOAD), side=port what the port accepts.",
				Gauge, Labels{"side": side.name, "offload": o.name}, func(src *Source) float64 { return b2f(set(src)&bit == bit) })
		}
	}
}
