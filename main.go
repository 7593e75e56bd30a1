// Command tapgro bridges a Linux TAP device opened with IFF_VNET_HDR and a QEMU network
// port (-netdev stream, socket or dgram), doing in userspace what the kernel's GRO does:
// the guest's MTU-sized TCP and UDP segments are coalesced into 64 KB GSO packets before
// they reach the host stack, and the host's 64 KB TSO packets are segmented in software
// before they reach a guest that cannot take them.
//
// The root package is the process: flags and environment, logging, privilege drop and
// signals, the control socket, metrics and health over the engine's Snapshot, and run(),
// which wires TAP → engine (package datapath) → endpoint (package netdev). It is the
// only package that imports logrus or Prometheus.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"tapgro/coalescer"
	"tapgro/datapath"
	"tapgro/netdev"
	"tapgro/netmapio"
	"tapgro/onoff"
	"tapgro/ops"
	"tapgro/port"
	"tapgro/procscale"
	"tapgro/tapdev"
	"tapgro/vhostnet"
	"tapgro/virtio"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "demo":
			return runDemo(args[1:], stdout, stderr)
		case "ctl":
			return runCtl(args[1:], stdout, stderr)
		case "version", "--version":
			fmt.Fprintln(stdout, "tapgro", version)
			return 0
		case "__sink", "__source":
			return runHelper(args, stdout, stderr)
		}
	}
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, errHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "tapgro:", err)
		return 2
	}
	out, err := logOutput(o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "tapgro:", err)
		return 2
	}
	log := newLogger(o, out)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	n, scale, why := procsFor(o, os.Getenv("GOMAXPROCS"), runtime.NumCPU())
	runtime.GOMAXPROCS(n)
	o.scaleProcs = scale
	log.WithField("gomaxprocs", n).Debug(why)
	handleSIGHUP(ctx, log)
	go func() {
		// A second signal means "now": do not wait for a peer that will not answer.
		<-ctx.Done()
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		<-ch
		log.Warn("second signal: exiting at once")
		os.Exit(1)
	}()
	if err := run(ctx, o, log); err != nil {
		log.WithError(err).Error("tapgro stopped")
		return 1
	}
	return 0
}

// procsFor returns the GOMAXPROCS tapgro starts with, whether package procscale then
// follows the load, and where the number came from: --procs, else a GOMAXPROCS
// environment variable (the runtime has applied it already), both fixed; else, for a
// socket or netmap port, one P scaled up while the load needs more (procscale's doc
// has why one), and for vhost-user Go's default of one per CPU: its guest side needs no
// system calls, and one P measured no less CPU per GB there and less throughput toward
// the guest.
func procsFor(o *options, env string, cpus int) (n int, scale bool, why string) {
	switch {
	case o.procs > 0:
		return o.procs, false, "GOMAXPROCS from --procs"
	case env != "":
		if n, err := strconv.Atoi(env); err == nil && n > 0 {
			return n, false, "GOMAXPROCS from the environment"
		}
	}
	if o.netdev.Backend == netdev.BackendVhostUser {
		return cpus, false, "GOMAXPROCS: one per CPU (vhost-user)"
	}
	return 1, cpus > 1, "GOMAXPROCS: 1, more while the load needs them"
}

// bothWayRate is the rate, in bytes per second each way, from which procscale counts
// the two directions as parallel work. A one-way bulk transfer's reverse direction
// carries its ACKs: about one 66-byte ACK per 64 KB aggregate, some 1 MB per GB of
// data, far below this even at 10 Gbit/s.
const bothWayRate = 50 << 20

// bothWays is procscale's Load.Parallel for a socket or netmap port: both directions
// delivered at least bothWayRate since the last call. bytes returns the bytes each
// direction has delivered so far.
func bothWays(bytes func() (tapToPort, portToTap uint64)) func(wall time.Duration) bool {
	var lastT, lastP uint64
	return func(wall time.Duration) bool {
		t, p := bytes()
		floor := uint64(bothWayRate * wall.Seconds())
		busy := t-lastT >= floor && p-lastP >= floor
		lastT, lastP = t, p
		return busy
	}
}

func newLogger(o *options, w io.Writer) *logrus.Logger {
	log := logrus.New()
	log.SetOutput(w)
	log.SetLevel(o.logLevel)
	if o.logFormat == "json" {
		log.SetFormatter(&logrus.JSONFormatter{})
	} else {
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	}
	return log
}

// run opens the TAP, sets up the engine, and serves the port until ctx ends.
func run(ctx context.Context, o *options, log *logrus.Logger) error {
	if o.netdev.Backend == netdev.BackendVhostUser {
		return runVhostUser(ctx, o, log)
	}
	tap, err := tapdev.Open(tapdev.Config{Name: o.tap, MultiQueue: o.multiQueue, VnetHdrLen: o.vnetHdrLen})
	if err != nil {
		return err
	}
	defer tap.Close()
	if err := tap.ConfigureLink(tapdev.LinkConfig{MTU: o.mtu, TxQueueLen: o.txQueueLen, Addrs: o.addrs, Up: true}); err != nil {
		return err
	}

	cfg := datapath.Config{
		VnetHdrLen:  o.vnetHdrLen,
		Batch:       o.batch,
		GRO:         o.gro,
		UDPGRO:      o.udpGRO,
		TimerFlush:  o.timerFlush(false),
		RSCInterval: o.rscInterval,
		MaxFlows:    o.maxFlows,
		RX:          o.rx,
		Offload:     o.offload,
		// What the TAP may hand us, for the port the spec describes; the engine
		// negotiates again with every peer that connects.
		Port: o.netdev.PortCaps(),
		// Capture files are opened before the privilege drop.
		PcapTap: o.pcapTap, PcapPort: o.pcapPort, Pcap: o.pcap,
	}
	if log.IsLevelEnabled(logrus.TraceLevel) {
		cfg.Trace = traceDecisions(log)
	}
	eng, err := datapath.New(cfg, tap, engineLogger{log})
	if err != nil {
		return err
	}
	defer eng.Close() // flushes capture files if Serve never ran
	// Registered even with capture off: `tapgro ctl pcap` may turn it on later.
	hupReopeners.add("pcap capture", eng.ReopenCapture)

	// Sockets systemd passed (socket activation) are used instead of binding (inherit.go).
	listenFDs, err := netdev.ListenFDs()
	if err != nil {
		return err
	}
	ep, err := netdev.OpenWith(o.netdev, supervisorEvents(log), socketOptions(o, listenFDs))
	if err != nil {
		return err
	}
	defer ep.Close()
	spec := netdev.SpecOf(ep, o.netdev) // inherited sockets resolved to their address

	if o.scaleProcs {
		delivered := func() (uint64, uint64) {
			s := eng.Snapshot()
			return s.TapToPort.Bytes, s.PortToTap.Bytes
		}
		go procscale.Run(ctx, procscale.Default(runtime.NumCPU()), bothWays(delivered), func(from, to int, l procscale.Load) {
			log.WithFields(logrus.Fields{"from": from, "to": to, "cpus_used": fmt.Sprintf("%.2f", l.CPU), "both_ways": l.Parallel}).Debug("GOMAXPROCS rescaled")
		})
	}
	h := ops.NewHealthMonitor(eng, o.healthStall)
	go h.Run(ctx)
	var metricsDone func()
	if o.metricsAddr != "" {
		var nm *netmapio.NetmapStats
		if s, ok := ep.(netdev.NetmapStatser); ok {
			nm = s.NetmapStats()
		}
		metrics := ops.NewMetrics(eng, ep.Stats(), nm, h, version)
		metricsDone, err = serveMetrics(o.metricsAddr, o.pprof, metrics, h, log)
		if err != nil {
			return err
		}
		defer metricsDone()
	}
	for _, a := range exposedAddrs(o) {
		log.WithField("addr", a).Warn("--allow-remote: the port accepts frames from beyond this host; anyone who can reach it can inject frames into the guest")
	}
	if o.metricsAddr != "" && o.allowRemote && requireLoopback("--metrics-addr", o.metricsAddr) != nil {
		log.WithField("addr", o.metricsAddr).Warn("--allow-remote: /metrics is served beyond this host")
	}
	// The control socket (ctl.go) is created before the privilege drop, in a directory
	// only root may write, and chowned to --user's account.
	stopCtl, err := startCtl(o, ops.NewCtlServer(eng, tap.Name(), ep.Addr(), version, engineLogger{log}), log)
	if err != nil {
		return err
	}
	defer stopCtl()
	// Everything privileged is open: the TAP, the port's socket, the metrics listener.
	if o.user != nil {
		if err := dropPrivileges(o.user); err != nil {
			return err
		}
	}
	portProblems := ops.PortProblems(ep.Stats())
	go ops.ReportProblems(ctx, ops.ProblemInterval, func() map[string]uint64 { return ops.ProblemCounts(eng.Snapshot(), portProblems) }, engineLogger{log})

	snap := eng.Snapshot()
	fields := logrus.Fields{
		"tap":          tap.Name(),
		"vnet_hdr_len": o.vnetHdrLen,
		"tap_offloads": snap.Negotiation.TapOffloads.String(),
		"probed":       snap.TapProbed.String(),
		"gro":          onoff.String(o.gro && !snap.GROKilled),
		"netdev":       spec.String(),
		"listen":       ep.Addr(),
		"version":      version,
	}
	if o.user != nil {
		fields["user"] = o.user.String()
	}
	if o.metricsAddr != "" {
		fields["metrics"] = o.metricsAddr
	}
	if o.mtu != 0 {
		fields["mtu"] = o.mtu
	}
	if o.pcapTap != "" {
		fields["pcap_tap"] = o.pcapTap
	}
	if o.pcapPort != "" {
		fields["pcap_port"] = o.pcapPort
	}
	log.WithFields(fields).Info("tapgro ready; " + qemuHint(spec))

	err = eng.Serve(ctx, ep)
	if errors.Is(err, netdev.ErrInheritedClosed) {
		// fd=N: the supervisor owns the connection; without it there is nothing to
		// serve, and a clean exit tells the supervisor so.
		log.WithField("port", ep.Addr()).Info("the inherited connection has ended; exiting")
		err = nil
	}
	logSummary(eng.Snapshot(), ep.Stats(), log)
	return err
}

// runVhostUser is run for --netdev vhost-user: TAP → vhostnet (straight to and from guest
// memory; the GRO engine only for frames it merges) → the vhost-user socket, where QEMU connects. vhostnet sets the
// TAP's header length and offloads per session. The operator surfaces are the engine's,
// over vhostnet's counters: /metrics (ops.NewVhostMetrics), /healthz (a guest that stops
// refilling its receive ring is a stall), `tapgro ctl status` (the features by name) and
// capture of the port side (--pcap-port, `tapgro ctl pcap port=…`).
func runVhostUser(ctx context.Context, o *options, log *logrus.Logger) error {
	// queues=N: one TAP queue per queue pair (IFF_MULTI_QUEUE when N > 1).
	taps, err := tapdev.OpenQueues(tapdev.Config{Name: o.tap, VnetHdrLen: o.vnetHdrLen}, o.netdev.QueuePairs())
	if err != nil {
		return err
	}
	defer func() {
		for _, q := range taps {
			q.Close()
		}
	}()
	tap := taps[0]
	if err := tap.ConfigureLink(tapdev.LinkConfig{MTU: o.mtu, TxQueueLen: o.txQueueLen, Addrs: o.addrs, Up: true}); err != nil {
		return err
	}
	offload := o.offload
	vn, err := vhostnet.New(vhostnet.Config{TAPs: taps, MTU: o.mtu, Pcap: o.pcap, PcapPath: o.pcapPort,
		Logf: func(f string, a ...any) { log.Warnf(f, a...) }, Infof: func(f string, a ...any) { log.Infof(f, a...) },
		// GRO toward the TAP and RSC toward the guest (vhostnet/gro.go, rsc.go), with the
		// stream path's switches; --offload caps the TAP's read offloads.
		GRO: o.gro, TimerFlush: o.timerFlush(true), RSCInterval: o.rscInterval, MaxFlows: o.maxFlows,
		Offload: &offload,
		// The receive pool's switches mean the same here: --rx-batch off notifies per
		// frame, --rx-flush-delay bounds the calls to the guest under load.
		PerFrame: o.rx.PerFrame, CallInterval: max(o.rx.FlushDelay, 0)})
	if err != nil {
		return err
	}
	defer vn.CloseCapture()
	hupReopeners.add("pcap capture", vn.ReopenCapture)
	h := ops.NewVhostHealthMonitor(vn.Stats(), o.healthStall)
	go h.Run(ctx)
	if o.metricsAddr != "" {
		done, err := serveMetrics(o.metricsAddr, o.pprof, ops.NewVhostMetrics(vn, h, version), h, log)
		if err != nil {
			return err
		}
		defer done()
	}
	spec := o.netdev
	// server=off: QEMU listens on the path and tapgro dials it (after the privilege drop,
	// so --user must be able to connect), again after every session.
	onRetry := supervisorEvents(log).OnRetry
	serve := func(ctx context.Context) error {
		return vn.ServeClient(ctx, spec.Remote.Path, func(err error, wait time.Duration) { onRetry(spec.Remote.String(), err, wait) })
	}
	addr, role := spec.Remote.String(), "connect"
	if spec.Role == netdev.RoleServer {
		// The same rules as every other socket path: 0600 (or --socket-mode), owner, stale
		// sockets replaced, unsafe directories refused.
		ln, remove, err := netdev.ListenUnix(spec.Local.Path, socketOptions(o, nil))
		if err != nil {
			return err
		}
		defer remove()
		defer ln.Close()
		serve = func(ctx context.Context) error { return vn.Serve(ctx, ln) }
		addr, role = spec.Local.String(), "listen"
	}
	stopCtl, err := startCtl(o, ops.NewVhostCtlServer(vn, tap.Name(), addr, version, engineLogger{log}), log)
	if err != nil {
		return err
	}
	defer stopCtl()
	if o.user != nil {
		if err := dropPrivileges(o.user); err != nil {
			return err
		}
	}
	qemu, tcg := vhostUserQEMUArgs(spec)
	fields := logrus.Fields{"tap": tap.Name(), "netdev": spec.String(), role: addr, "version": version,
		"offered": virtio.String(vn.State().Offered)}
	if o.pcapPort != "" {
		fields["pcap_port"] = o.pcapPort
	}
	if spec.QueuePairs() > 1 {
		fields["queue_pairs"] = spec.QueuePairs()
	}
	log.WithFields(fields).Info("tapgro ready (vhost-user); give QEMU: " + qemu + " (RAM = the guest's -m size; under TCG use " + tcg + ")")
	err = serve(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	// Directions as in the engine's summary: port_to_tap is guest → TAP (vhostnet TX).
	st, bs := vn.Stats(), vn.BackendStats()
	f := logrus.Fields{
		"port_to_tap_frames": st.TXFrames.Load(), "port_to_tap_bytes": st.TXBytes.Load(),
		"tap_to_port_frames": st.RXFrames.Load(), "tap_to_port_bytes": st.RXBytes.Load(),
		"port_to_tap_gso_passthrough": st.TXGSO.Load(), "tap_to_port_gso_passthrough": st.RXGSO.Load(),
		"rx_stalls": st.RXStalls.Load(), "sessions": bs.Sessions.Load(),
		"kicks": bs.Kicks.Load(), "calls": bs.Calls.Load(),
	}
	// Drops as in the engine's summary: a total per direction, all together, and the
	// reasons that happened as direction_reason.
	var dropped [2]uint64
	for r := vhostnet.Drop(0); r < vhostnet.NumDrops; r++ {
		n := st.Drops[r].Load()
		dropped[b2i(r.IsRX())] += n
		if n != 0 {
			f[r.Dir()+"_"+r.String()] = n
		}
	}
	f["port_to_tap_dropped"], f["tap_to_port_dropped"], f["dropped"] = dropped[0], dropped[1], dropped[0]+dropped[1]
	if len(st.Queues) > 1 {
		for i := range st.Queues {
			q := &st.Queues[i]
			f[fmt.Sprintf("queue%d_port_to_tap_frames", i)] = q.TXFrames.Load()
			f[fmt.Sprintf("queue%d_tap_to_port_frames", i)] = q.RXFrames.Load()
		}
	}
	if o.gro {
		// As the engine's summary names them: gro_* toward the TAP, rsc_* toward the guest.
		for _, g := range []struct {
			p string
			s *coalescer.Stats
		}{{"gro_", &st.GRO}, {"rsc_", &st.RSC}} {
			f[g.p+"segments"], f[g.p+"packets"] = g.s.Segments.Load(), g.s.Packets.Load()
			f[g.p+"gso_packets"], f[g.p+"coalesced"] = g.s.GSOOut.Load(), g.s.Coalesced.Load()
		}
	}
	if c := vn.Capture().Stats(); o.pcapPort != "" || c.Frames.Load() != 0 {
		f["pcap_port_frames"], f["pcap_port_dropped"] = c.Frames.Load(), c.Dropped.Load()
	}
	log.WithFields(f).Info("tapgro exiting")
	return err
}

// vhostUserQEMUArgs is what QEMU needs to meet a vhost-user spec: guest RAM in a shared
// memfd (the back-end maps it), the chardev that connects (and reconnects) to tapgro, or
// with server=off listens for it, the netdev and the NIC; and the same with vectors=0
// for TCG, where QEMU 7.2 crashes in msix_set_vector_notifiers from vhost_net_start with
// MSI-X.
func vhostUserQEMUArgs(spec netdev.Spec) (kvm, tcg string) {
	chardev, nd := spec.QEMUVhostUser("n0", "vu0")
	base := "-object memory-backend-memfd,id=mem,size=<RAM>,share=on -machine memory-backend=mem" +
		" -chardev " + chardev + " -netdev " + nd + " -device " + spec.QEMUVhostUserDevice("n0")
	return base, base + ",vectors=0"
}

// qemuHint is the passt-style line that tells the user what to give QEMU.
func qemuHint(spec netdev.Spec) string {
	if spec.Backend == netdev.BackendStream && spec.VnetHdr {
		return "vnet-hdr=on: the peer must be another tapgro with vnet-hdr=on (QEMU cannot speak it)"
	}
	opt := spec.QEMUOption("n0")
	if spec.Remote.Type == netdev.AddrFD {
		return "the port is the inherited connection " + spec.Remote.String() + "; its peer is already attached"
	}
	if opt == "" {
		return "this port has no QEMU counterpart (a NIC in netmap mode)"
	}
	return "give QEMU: -netdev " + opt + " -device virtio-net-pci,netdev=n0"
}

func supervisorEvents(log *logrus.Logger) netdev.Events {
	return netdev.Events{
		OnReject: func(peer, why string) {
			log.WithFields(logrus.Fields{"peer": peer, "why": why}).Warn("refused a second client: one peer at a time")
		},
		OnRetry: func(addr string, err error, wait time.Duration) {
			log.WithFields(logrus.Fields{"addr": addr, "retry_in": wait}).WithError(err).Debug("peer not reachable yet")
		},
		OnHelloFail: func(peer string, err error) {
			log.WithField("peer", peer).WithError(err).Warn("vnet-hdr=on: closed a connection that failed the hello; waiting for a tapgro speaking vnet-hdr=on")
		},
	}
}

// traceDecisions logs the GRO engine's decisions at trace level, at most 100 a second
// (a bulk stream makes hundreds of thousands), with a count of what was left out. It runs
// on the port→TAP goroutine only, so it needs no lock.
func traceDecisions(log *logrus.Logger) func(coalescer.Reason, int) {
	var second int64
	var logged, skipped int
	return func(r coalescer.Reason, frameLen int) {
		if now := time.Now().Unix(); now != second {
			if skipped > 0 {
				log.WithField("not_logged", skipped).Trace("gro: more decisions in the last second")
			}
			second, logged, skipped = now, 0, 0
		}
		if logged >= 100 {
			skipped++
			return
		}
		logged++
		log.WithFields(logrus.Fields{"decision": r.String(), "frame_len": frameLen}).Trace("gro")
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// logSummary prints the counters once at exit, from one Snapshot.
func logSummary(s datapath.Snapshot, ps *port.Stats, log *logrus.Logger) {
	t2p, p2t := &s.TapToPort, &s.PortToTap
	f := logrus.Fields{
		"tap_to_port_reads":  t2p.Reads,
		"tap_to_port_frames": t2p.Frames,
		"tap_to_port_bytes":  t2p.Bytes,
		"port_to_tap_frames": p2t.Frames,
		"port_to_tap_bytes":  p2t.Bytes,
		"port_to_tap_reads":  p2t.Reads,
	}
	if g := s.GRO; g != nil {
		f["gro_segments"] = g.Segments.Load()
		f["gro_packets"] = g.Packets.Load()
		f["gro_gso_packets"] = g.GSOOut.Load()
		f["gro_coalesced"] = g.Coalesced.Load()
	}
	f["tap_write_einval"] = s.Tap.WriteErrEINVAL.Load()
	f["gso_write_fallback"] = p2t.GSOFallback
	f["tap_to_port_gso_passthrough"] = t2p.GSOPassthrough
	f["port_to_tap_gso_passthrough"] = p2t.GSOPassthrough
	f["port_to_tap_malformed"] = p2t.Drops[datapath.DropMalformed]
	f["tap_to_port_shm"] = ps.ShmFramesOut.Load()
	f["port_to_tap_shm"] = ps.ShmFramesIn.Load()
	// Per-direction accounting: every frame read from the TAP was delivered, split (GSO),
	// or counted here (the SIGTERM-under-load test checks the balance).
	f["tap_to_port_dropped"] = s.Dropped(t2p)
	f["port_to_tap_dropped"] = s.Dropped(p2t)
	f["dropped"] = s.Dropped(t2p) + s.Dropped(p2t)
	f["tap_to_port_gso_segmented"] = t2p.GSOSegmented
	f["tap_to_port_port_error"] = t2p.Drops[datapath.DropPortError]
	f["pcap_tap_frames"] = s.CaptureTap.Frames
	f["pcap_tap_dropped"] = s.CaptureTap.Dropped
	f["pcap_port_frames"] = s.CapturePort.Frames
	f["pcap_port_dropped"] = s.CapturePort.Dropped
	log.WithFields(f).Info("tapgro exiting")
}
