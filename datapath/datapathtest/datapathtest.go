// Package datapathtest helps test code built on the engine: a real engine on an
// in-memory TAP (tapdev/taptest), a stub that serves a fixed Snapshot, and an endpoint
// that yields one connection.
package datapathtest

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

const (
	oCSUM = vnethdr.OffloadCSUM
	oTSO4 = vnethdr.OffloadTSO4
	oTSO6 = vnethdr.OffloadTSO6
	oECN  = vnethdr.OffloadTSOECN
)

// NewEngine is a real engine on an in-memory TAP whose kernel offers probed, set up
// for a plain port with --offload auto and GRO on; mod may change the config first.
func NewEngine(t testing.TB, probed vnethdr.Offloads, mod func(*datapath.Config)) (*datapath.Engine, *taptest.TAP) {
	t.Helper()
	tap := taptest.New(true)
	tap.Probed = probed
	tap.Accept = oCSUM | oTSO4 | oTSO6 | oECN
	cfg := datapath.Config{
		VnetHdrLen: 10, Batch: 64, GRO: true, UDPGRO: true, MaxFlows: 64,
		Offload: vnethdr.Choice{Auto: true},
		Port:    port.Caps{State: "stream(plain)"},
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

// Stub serves a fixed Snapshot, for the operator surfaces' own logic.
type Stub struct{ Snap datapath.Snapshot }

// NewStub is a Stub whose Snapshot has every pointer set and nothing counted.
func NewStub() *Stub {
	return &Stub{Snap: datapath.Snapshot{
		Pool: new(rxpool.Stats), Tap: new(tapdev.Stats), GRO: new(coalescer.Stats),
		Negotiation: &datapath.Negotiation{Port: port.Caps{State: "stream(plain)"}},
		PeerUnread:  -1, CaptureTap: datapath.Capture{State: "off"}, CapturePort: datapath.Capture{State: "off"},
	}}
}

func (s *Stub) Snapshot() datapath.Snapshot                          { return s.Snap }
func (s *Stub) SetGRO(bool) *datapath.Negotiation                    { return s.Snap.Negotiation }
func (s *Stub) SetUDPGRO(bool) *datapath.Negotiation                 { return s.Snap.Negotiation }
func (s *Stub) SetOffloads(vnethdr.Choice) (vnethdr.Offloads, error) { return 0, nil }
func (s *Stub) SetCapture(datapath.CaptureSide, string) error        { return nil }

// OneShot yields one connection, then blocks until the engine shuts down.
type OneShot struct{ p chan port.Port }

// NewOneShot yields p once.
func NewOneShot(p port.Port) *OneShot {
	e := &OneShot{p: make(chan port.Port, 1)}
	e.p <- p
	return e
}

func (e *OneShot) Next(ctx context.Context) (port.Port, error) {
	select {
	case p := <-e.p:
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (e *OneShot) Addr() string { return "test" }
