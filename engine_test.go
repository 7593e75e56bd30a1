package main

import (
	"context"
	"testing"

	"tapgro/coalescer"
	"tapgro/datapath"
	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/tapdev"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

// Shorthands for the offload bits the tests name.
const (
	oCSUM = vnethdr.OffloadCSUM
	oTSO4 = vnethdr.OffloadTSO4
	oTSO6 = vnethdr.OffloadTSO6
	oECN  = vnethdr.OffloadTSOECN
	oUSO  = vnethdr.OffloadUSO
)

// newTestEngine is a real engine on an in-memory TAP whose kernel offers probed, set up
// for a plain port with --offload auto and GRO on; mod may change the config first.
func newTestEngine(t testing.TB, probed vnethdr.Offloads, mod func(*datapath.Config)) (*datapath.Engine, *taptest.TAP) {
	t.Helper()
	tap := taptest.New(true)
	tap.Probed = probed
	tap.Accept = oCSUM | oTSO4 | oTSO6 | oECN
	cfg := datapath.Config{
		VnetHdrLen: 10, Batch: 64, GRO: true, UDPGRO: true, MaxFlows: 64,
		Offload: vnethdr.Choice{Auto: true},
		Port:    datapath.PortCaps{State: "stream(plain)"},
	}
	if mod != nil {
		mod(&cfg)
	}
	eng, err := datapath.New(cfg, tap, datapath.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	return eng, tap
}

// stubEngine serves a fixed Snapshot, for the operator surfaces' own logic.
type stubEngine struct{ snap datapath.Snapshot }

func newStubEngine() *stubEngine {
	return &stubEngine{snap: datapath.Snapshot{
		Pool: new(rxpool.Stats), Tap: new(tapdev.Stats), GRO: new(coalescer.Stats),
		Negotiation: &datapath.Negotiation{Port: datapath.PortCaps{State: "stream(plain)"}},
		PeerUnread:  -1, CaptureTap: datapath.Capture{State: "off"}, CapturePort: datapath.Capture{State: "off"},
	}}
}

func (s *stubEngine) Snapshot() datapath.Snapshot                          { return s.snap }
func (s *stubEngine) SetGRO(bool) *datapath.Negotiation                    { return s.snap.Negotiation }
func (s *stubEngine) SetUDPGRO(bool) *datapath.Negotiation                 { return s.snap.Negotiation }
func (s *stubEngine) SetOffloads(vnethdr.Choice) (vnethdr.Offloads, error) { return 0, nil }
func (s *stubEngine) SetCapture(datapath.CaptureSide, string) error        { return nil }

// oneShotEndpoint yields one connection, then blocks until the engine shuts down.
type oneShotEndpoint struct{ p chan port.Port }

func newOneShot(p port.Port) *oneShotEndpoint {
	e := &oneShotEndpoint{p: make(chan port.Port, 1)}
	e.p <- p
	return e
}

func (e *oneShotEndpoint) Next(ctx context.Context) (port.Port, error) {
	select {
	case p := <-e.p:
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (e *oneShotEndpoint) Addr() string { return "test" }
