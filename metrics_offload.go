package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"tapgro/datapath"
	"tapgro/netdev"
	"tapgro/vnethdr"
)

// addOffloadMetrics exports the last negotiation (negotiate.go) as 0/1 gauges: which
// offloads the TAP hands us and the port takes, and which software steps each direction
// runs. A scrape reads the published result; the datapath is not involved.
func addOffloadMetrics(c *collector, ep netdev.Endpoint) {
	for _, o := range []struct {
		name string
		bit  vnethdr.Offloads
	}{
		{"csum", vnethdr.OffloadCSUM}, {"tso4", vnethdr.OffloadTSO4}, {"tso6", vnethdr.OffloadTSO6},
		{"tso_ecn", vnethdr.OffloadTSOECN}, {"uso", vnethdr.OffloadUSO}, {"ufo", vnethdr.OffloadUFO},
	} {
		bit := o.bit
		c.add("tapgro_offload_killed", "1 for an offload whose GSO writes the kernel refused (EINVAL, sticky): frames of that kind go to the TAP segmented.",
			prometheus.GaugeValue, prometheus.Labels{"offload": o.name}, func(s *datapath.Snapshot) float64 {
				return b2f(s.OffloadsKilled&bit == bit)
			})
		for _, side := range []string{"tap", "port"} {
			tap := side == "tap"
			c.add("tapgro_offload_enabled", "1 if the negotiated offload is on: side=tap what the TAP hands tapgro (TUNSETOFFLOAD), side=port what the port accepts.",
				prometheus.GaugeValue, prometheus.Labels{"side": side, "offload": o.name}, func(s *datapath.Snapshot) float64 {
					n := s.Negotiation
					if n == nil {
						return 0
					}
					set := n.Port.Accepts
					if tap {
						set = n.TapOffloads
					}
					return b2f(set&bit == bit)
				})
		}
	}
	for _, d := range []struct {
		name string
		t2p  bool
	}{{"tap_to_port", true}, {"port_to_tap", false}} {
		for _, sn := range datapath.StepNames {
			t2p, st := d.t2p, sn.Step
			c.add("tapgro_datapath_step", "1 if the negotiated datapath runs this step in this direction.",
				prometheus.GaugeValue, prometheus.Labels{"direction": d.name, "step": sn.Name}, func(s *datapath.Snapshot) float64 {
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
	c.add("tapgro_gso_passthrough_total", "GSO frames handed on whole (tap_to_port: to a vnet-hdr port; port_to_tap: from one to the TAP).",
		prometheus.CounterValue, prometheus.Labels{"direction": "tap_to_port"}, snapU(func(s *datapath.Snapshot) uint64 { return s.TapToPort.GSOPassthrough }))
	c.add("tapgro_gso_passthrough_total", "GSO frames handed on whole (tap_to_port: to a vnet-hdr port; port_to_tap: from one to the TAP).",
		prometheus.CounterValue, prometheus.Labels{"direction": "port_to_tap"}, snapU(func(s *datapath.Snapshot) uint64 { return s.PortToTap.GSOPassthrough }))
	c.add("tapgro_port_hello_failures_total", "vnet-hdr=on peers that failed the hello (QEMU, a plain tapgro, another protocol version); each connection was closed.",
		prometheus.CounterValue, nil, u(ep.Stats().HelloFailures.Load))
	c.add("tapgro_shm_connects_total", "vnet-hdr=on connections over AF_UNIX that set up shared-memory rings with their peer.",
		prometheus.CounterValue, nil, u(ep.Stats().ShmConnects.Load))
	c.add("tapgro_shm_frames_total", "Frames that crossed in a shared-memory ring slot instead of the socket (tap_to_port: read into this end's ring; port_to_tap: written from the peer's).",
		prometheus.CounterValue, prometheus.Labels{"direction": "tap_to_port"}, u(ep.Stats().ShmFramesOut.Load))
	c.add("tapgro_shm_frames_total", "Frames that crossed in a shared-memory ring slot instead of the socket (tap_to_port: read into this end's ring; port_to_tap: written from the peer's).",
		prometheus.CounterValue, prometheus.Labels{"direction": "port_to_tap"}, u(ep.Stats().ShmFramesIn.Load))
	c.add("tapgro_shm_ring_full_total", "TAP read batches that found this end's shared-memory ring full: their frames crossed the socket instead.",
		prometheus.CounterValue, nil, u(ep.Stats().ShmRingFull.Load))
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}
