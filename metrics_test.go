package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tapgro/datapath/datapathtest"
	"tapgro/netmapio"
	"tapgro/ops"
	"tapgro/pcapio"
	"tapgro/port"
	"tapgro/vhostnet"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

type stubEndpoint struct{ st port.Stats }

func (e *stubEndpoint) Next(context.Context) (port.Port, error) { return nil, port.ErrClosed }
func (e *stubEndpoint) Close() error                            { return nil }
func (e *stubEndpoint) Addr() string                            { return "stub" }
func (e *stubEndpoint) Stats() *port.Stats                      { return &e.st }

// Every metric tapgro exports must be documented in docs/metrics.md, one line each, and the
// collector must be valid for Prometheus (consistent label sets, no duplicates).
func TestMetricsDocumented(t *testing.T) {
	e := datapathtest.NewStub()
	e.Snap.TapToPort.Frames = 3
	reg := prometheus.NewRegistry()
	dp := ops.EngineDatapath(e, new(port.Stats), new(netmapio.NetmapStats).Counters(), "tg0", "stub")
	if err := reg.Register(newPromCollector(ops.NewMetrics(dp, ops.NewHealthMonitor(dp, time.Second), version))); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	readme, err := os.ReadFile("docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if !strings.Contains(string(readme), "`"+f.GetName()+"`") {
			t.Errorf("metric %s is not documented in docs/metrics.md", f.GetName())
		}
		if f.GetName() == "tapgro_frames_total" {
			found := false
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetValue() == "tap_to_port" && m.GetCounter().GetValue() == 3 {
						found = true
					}
				}
			}
			if !found {
				t.Errorf("tapgro_frames_total{direction=tap_to_port} does not read the datapath counter")
			}
		}
	}
}

// The vhost-user catalogue obeys the same rules: valid for Prometheus, every series in
// docs/metrics.md, and it reads vhostnet's counters.
func TestVhostMetricsDocumented(t *testing.T) {
	vn := &fakeVhost{st: &vhostnet.Stats{Queues: make([]vhostnet.QueueStats, 2)}, bs: new(vhostuser.Stats)}
	vn.st.Queues[1].RXFrames.Store(5)
	vn.st.TXFrames.Store(7)
	vn.st.TXGSO.Store(3)
	vn.bs.Sessions.Store(2)
	dp := ops.VhostDatapath(vn, "tg0", "unix:/test.sock")
	vn.bs.Rejected[vhostuser.RejectLoop].Store(1)
	vn.st.GRO.Segments.Store(45)
	vn.st.RSC.GSOOut.Store(4)
	reg := prometheus.NewRegistry()
	if err := reg.Register(newPromCollector(ops.NewMetrics(dp, ops.NewHealthMonitor(dp, time.Second), version))); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	readme, err := os.ReadFile("docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if !strings.Contains(string(readme), "`"+f.GetName()+"`") {
			t.Errorf("metric %s is not documented in docs/metrics.md", f.GetName())
		}
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetValue()
			}
			got[key] = m.GetCounter().GetValue()
		}
	}
	if got["tapgro_frames_total,port_to_tap"] != 7 || got["tapgro_port_connects_total"] != 2 ||
		got["tapgro_gso_passthrough_total,port_to_tap"] != 3 || got["tapgro_vhost_rejected_total,loop"] != 1 ||
		got["tapgro_vhost_queue_frames_total,tap_to_port,1"] != 5 ||
		got["tapgro_gro_segments_total"] != 45 || got["tapgro_vhost_rsc_gso_packets_total"] != 4 {
		t.Errorf("vhost metrics do not read the counters: %v", got)
	}
}

// fakeVhost is a vhost-user datapath's operator surface without a TAP or a guest.
type fakeVhost struct {
	st  *vhostnet.Stats
	bs  *vhostuser.Stats
	cap pcapio.Point
}

func (f *fakeVhost) Stats() *vhostnet.Stats                      { return f.st }
func (f *fakeVhost) BackendStats() *vhostuser.Stats              { return f.bs }
func (f *fakeVhost) State() vhostnet.State                       { return vhostnet.State{Connected: true} }
func (f *fakeVhost) Capture() *pcapio.Point                      { return &f.cap }
func (f *fakeVhost) SetCapture(path string) error                { return f.cap.Set(path, pcapio.Options{}) }
func (f *fakeVhost) OffloadChoice() vnethdr.Choice               { return vnethdr.Choice{Auto: true} }
func (f *fakeVhost) SetOffloads(vnethdr.Choice) vnethdr.Offloads { return 0 }
func (f *fakeVhost) SetGRO(bool) bool                            { return false }
func (f *fakeVhost) GROActive() bool                             { return false }
func (f *fakeVhost) TapKilled() vnethdr.Offloads                 { return 0 }
func (f *fakeVhost) TapCapture() *pcapio.Point                   { return &f.cap }
func (f *fakeVhost) SetTapCapture(string) error                  { return nil }
func (f *fakeVhost) SetUDPGRO(bool) bool                         { return false }
func (f *fakeVhost) UDPGROActive() bool                          { return false }
