package ops

import (
	"tapgro/datapath"
	"tapgro/vnethdr"
)

// Datapath is one running datapath as the operator surfaces see it. There is one
// metric catalogue (NewMetrics), one health monitor (NewHealthMonitor) and one control
// server (NewCtlServer), and each takes a Datapath; what differs between port kinds is
// the Datapath's methods, one file per kind:
//
//   - EngineDatapath (dp_engine.go): the engine of package datapath, behind the socket
//     and netmap ports. Its state is read from one Snapshot per scrape, sample or status.
//   - VhostDatapath (dp_vhost.go): vhostnet, behind --netdev vhost-user. Its state is
//     vhostnet's and the vhost-user back-end's atomic counters.
//
// A new port kind that runs on the engine needs nothing here; one with a datapath of its
// own is one more implementation. The methods are unexported: the surfaces and the kinds
// are one package's contract, and package main only picks the kind.
type Datapath interface {
	// names are the TAP's name and the port's address, as status shows them.
	names() (tap, listen string)
	// catalogue adds the kind's series to m: the families every kind shares (shared.go)
	// under the same names, then the kind's own.
	catalogue(m *Metrics)
	// work appends to into one watch per direction (per queue pair, where the kind has
	// several): whether work is waiting, and the counter that moves when it gets done.
	work(into []watch) []watch
	// ready is the kind's part of the start-up line, summary its exit line's counters,
	// delivered the bytes each direction delivered (lines.go).
	ready() map[string]any
	summary() map[string]any
	delivered() (tapToPort, portToTap uint64)
	// problems is every per-packet problem counter, keyed "direction/reason", for the
	// periodic problem report (ReportProblems).
	problems() map[string]uint64
	// status is the kind's part of `tapgro ctl status`; the server adds what it knows.
	status() *Status
	// refuse says why the kind lacks one of the run-time switches in need, or is nil
	// when it has them all. The server asks before anything changes, so a request is
	// refused whole; the switch methods below are only called for switches the kind has
	// (one without answers with the same reason anyway).
	refuse(need ctlCaps) error
	// offloads is the --offload choice in force and what the TAP's kernel offers.
	offloads() (choice vnethdr.Choice, probed vnethdr.Offloads)
	setOffloads(c vnethdr.Choice) (vnethdr.Offloads, error)
	// setGRO and setUDPGRO switch coalescing toward the TAP and say whether the
	// negotiated datapath now runs it.
	setGRO(on bool) (active bool, err error)
	setUDPGRO(on bool) (active bool, err error)
	setCapture(side datapath.CaptureSide, path string) error
}
