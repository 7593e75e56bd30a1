package ops

import (
	"sort"
	"strings"
	"testing"

	"tapgro/datapath/datapathtest"
	"tapgro/pcapio"
	"tapgro/port"
	"tapgro/vhostnet"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// fakeVhost is a vhost-user datapath's operator surface without a TAP or a guest.
type fakeVhost struct {
	st  *vhostnet.Stats
	bs  vhostuser.Stats
	cap pcapio.Point
}

func (f *fakeVhost) Stats() *vhostnet.Stats                      { return f.st }
func (f *fakeVhost) BackendStats() *vhostuser.Stats              { return &f.bs }
func (f *fakeVhost) State() vhostnet.State                       { return vhostnet.State{Connected: true} }
func (f *fakeVhost) Capture() *pcapio.Point                      { return &f.cap }
func (f *fakeVhost) SetCapture(string) error                     { return nil }
func (f *fakeVhost) OffloadChoice() vnethdr.Choice               { return vnethdr.Choice{Auto: true} }
func (f *fakeVhost) SetOffloads(vnethdr.Choice) vnethdr.Offloads { return 0 }
func (f *fakeVhost) SetGRO(bool) bool                            { return false }
func (f *fakeVhost) GROActive() bool                             { return false }
func (f *fakeVhost) TapKilled() vnethdr.Offloads                 { return 0 }
func (f *fakeVhost) TapCapture() *pcapio.Point                   { return &f.cap }
func (f *fakeVhost) SetTapCapture(string) error                  { return nil }
func (f *fakeVhost) SetUDPGRO(bool) bool                         { return false }
func (f *fakeVhost) UDPGROActive() bool                          { return false }

// vhostDatapath is a fake vhost-user datapath whose counters are st (nil: zero).
func vhostDatapath(st *vhostnet.Stats) Datapath {
	if st == nil {
		st = new(vhostnet.Stats)
	}
	return VhostDatapath(&fakeVhost{st: st}, "tg0", "unix:/test.sock")
}

// engineDatapath is an engine (or its stub) as the operator surfaces see it.
func engineDatapath(e Engine) Datapath {
	return EngineDatapath(e, new(port.Stats), nil, "tg0", "unix:/test.sock")
}

type family struct{ help, labels string }

// families collects a catalogue's families: help text and label names.
func families(m *Metrics) map[string]family {
	out := map[string]family{}
	m.Collect(func(s *Sample) {
		names := append([]string(nil), s.LabelNames...)
		sort.Strings(names)
		out[s.Name] = family{s.Help, strings.Join(names, ",")}
	})
	return out
}

// sharedFamilies are the counters that mean the same on every port kind (shared.go).
var sharedFamilies = []string{
	"tapgro_frames_total", "tapgro_bytes_total", "tapgro_dropped_total", "tapgro_gso_passthrough_total",
	"tapgro_port_connected", "tapgro_port_connects_total", "tapgro_port_disconnects_total", "tapgro_port_rejects_total",
	"tapgro_pcap_frames_total", "tapgro_pcap_dropped_total", "tapgro_offload_enabled", "tapgro_offload_killed",
	"tapgro_gro_segments_total", "tapgro_gro_packets_total", "tapgro_gro_coalesced_total", "tapgro_gro_gso_packets_total",
	"tapgro_gro_reason_total", "tapgro_gro_gso_write_fallback_total", "tapgro_rx_stalls_total", "tapgro_stalled", "tapgro_build_info", "tapgro_start_time_seconds", "tapgro_gomaxprocs",
}

// TestOneCatalogue: a tapgro on vhost-user and one on a stream port export the shared
// counters under one name, with the same help and labels, and vhost-user keeps no
// duplicate of them under a name of its own.
func TestOneCatalogue(t *testing.T) {
	edp, vdp := engineDatapath(datapathtest.NewStub()), vhostDatapath(nil)
	eng := families(NewMetrics(edp, NewHealthMonitor(edp, 0), "t"))
	vh := families(NewMetrics(vdp, NewHealthMonitor(vdp, 0), "t"))
	for _, name := range sharedFamilies {
		e, okE := eng[name]
		v, okV := vh[name]
		switch {
		case !okE || !okV:
			t.Errorf("%s: in the engine's catalogue %v, in vhost-user's %v", name, okE, okV)
		case e != v:
			t.Errorf("%s differs:\n engine    %+v\n vhost-user %+v", name, e, v)
		}
	}
	for name := range vh {
		if rest, ok := strings.CutPrefix(name, "tapgro_vhost_"); ok {
			for _, s := range sharedFamilies {
				if strings.TrimPrefix(s, "tapgro_") == rest || strings.TrimPrefix(s, "tapgro_port_") == rest {
					t.Errorf("%s duplicates %s", name, s)
				}
			}
		}
	}
	for _, old := range []string{"tapgro_vhost_frames_total", "tapgro_vhost_bytes_total", "tapgro_vhost_dropped_total",
		"tapgro_vhost_sessions_total", "tapgro_vhost_sessions_refused_total"} {
		if _, ok := vh[old]; ok {
			t.Errorf("%s is still exported", old)
		}
	}
}
