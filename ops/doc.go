// Package ops lets an operator see and steer a running tapgro, whatever its port kind.
// Each surface exists once and takes a Datapath (datapath.go): the engine's
// (EngineDatapath, for the socket and netmap ports; it reads package datapath only
// through its API, Snapshot for everything it shows and the switches SetGRO, SetUDPGRO,
// SetOffloads and SetCapture for everything it changes) or vhost-user's (VhostDatapath,
// vhostnet's counters). What differs between kinds lives in the kind's file
// (dp_engine.go, dp_vhost.go); what they share, under one name, in shared.go.
//
// # Theory of operation
//
//   - The control socket (CtlServer): one request line in, one JSON object (Response) out,
//     then EOF. A request is parsed and validated whole before anything changes, so a bad
//     one changes nothing; changes go through the engine's switches, which take effect
//     between two read batches without touching the port connection. The socket is 0600,
//     each connection's SO_PEERCRED is checked too, every connection has a deadline, and
//     at most MaxConns are served at once; a client turned away reads why before the
//     close. `tapgro ctl` in package main is the client.
//   - The metric catalogue (Metrics): every exported series with its help text and
//     labels, each value read from one Snapshot per scrape, so a scrape costs the packet
//     path nothing. Package main hands the samples to the Prometheus client, the only
//     place that imports it.
//   - The health monitor (HealthMonitor): /healthz checks progress, not liveness.
//   - The problem report (ReportProblems): per-packet problems summarised at most once
//     per interval with their counts, never a line per packet.
//
// Logging goes through the same small Logger interface the engine takes; package main
// adapts it to logrus.
package ops
