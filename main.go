// Command tapgro bridges a Linux TAP device opened with IFF_VNET_HDR and a QEMU network
// port (-netdev stream, socket or dgram), doing in userspace what the kernel's GRO does:
// the guest's MTU-sized TCP and UDP segments are coalesced into 64 KB GSO packets before
// they reach the host stack, and the host's 64 KB TSO packets are segmented in software
// before they reach a guest that cannot take them.
//
// main owns everything that is not the packet path: flags, logging, metrics, the TAP's
// set-up and the port's lifecycle (the supervisor: accept or connect, run the datapath
// until the peer leaves, go back to waiting). It is the only place that logs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"tapgro/coalescer"
	"tapgro/netmapio"
	"tapgro/rxpool"
	"tapgro/tapdev"
	"tapgro/vnethdr"
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

// run opens the TAP, negotiates offloads, and supervises the port until ctx ends.
func run(ctx context.Context, o *options, log *logrus.Logger) error {
	tap, err := tapdev.Open(tapdev.Config{Name: o.tap, MultiQueue: o.multiQueue, VnetHdrLen: o.vnetHdrLen})
	if err != nil {
		return err
	}
	defer tap.Close()
	if err := tap.ConfigureLink(tapdev.LinkConfig{MTU: o.mtu, TxQueueLen: o.txQueueLen, Addrs: o.addrs, Up: true}); err != nil {
		return err
	}

	probed := tap.ProbeOffloads()
	// Writes may always carry partial checksums and TCP GSO (wire.md §1.4); UDP_L4 GSO only
	// where the kernel knows it, which is what a successful USO probe shows.
	accepts := tap.Accepts()
	// What the TAP may hand us, for the port the spec describes (negotiate.go); the
	// supervisor negotiates again with every peer that connects.
	negIn := negInput{TapProbed: probed, TapHdrLen: o.vnetHdrLen, TapWrite: accepts,
		Choice: o.offload, Port: capsOfSpec(o.netdev), GRO: o.gro, UDPGRO: o.udpGRO}
	neg := negotiate(negIn)
	set, err := tap.SetOffloads(neg.TapOffloads)
	if err != nil {
		return fmt.Errorf("TUNSETOFFLOAD %s on %s: %w", neg.TapOffloads, o.tap, err)
	}
	neg.TapOffloads = set

	cfg := bridgeConfig{
		vnetHdrLen:  o.vnetHdrLen,
		batch:       o.batch,
		gro:         o.gro,
		udpGRO:      o.udpGRO,
		timerFlush:  o.groFlush == "timer",
		rscInterval: o.rscInterval,
		maxFlows:    o.maxFlows,
		tapAccepts:  accepts,
		tapEmits:    set,
		rx:          o.rx,
	}
	if log.IsLevelEnabled(logrus.TraceLevel) {
		cfg.trace = traceDecisions(log)
	}
	b := newBridge(cfg, tap)
	var killOnce sync.Once
	b.onGROKill = func(err error) {
		killOnce.Do(func() {
			log.WithError(err).Warn("the kernel refused a GSO write; GRO is off from now on and frames go to the TAP segment by segment")
		})
	}
	b.onOffloadKill = func(off vnethdr.Offloads, err error) {
		log.WithError(err).WithField("offload", off.String()).Warn("the kernel refused a valid GSO write; frames of this kind now go to the TAP segment by segment")
	}
	if o.gro {
		if err := probeGSOWrite(tap, o.vnetHdrLen); err != nil {
			b.groKilled.Store(true)
			log.WithError(err).Warn("start-up GSO probe failed: writing segments instead of GSO packets")
		}
	}
	b.initNegotiation(negIn, neg, func(n *negotiation) { log.Info("negotiated: " + n.String()) })

	// Capture files are opened before the privilege drop; closed (flushed) last, once
	// both pipelines have stopped.
	b.capture.opt = o.pcap
	defer b.capture.close()
	if err := b.capture.set(&b.capture.tap, o.pcapTap); err != nil {
		return fmt.Errorf("--pcap-tap: %w", err)
	}
	if err := b.capture.set(&b.capture.port, o.pcapPort); err != nil {
		return fmt.Errorf("--pcap-port: %w", err)
	}
	// Registered even with capture off: `tapgro ctl pcap` may turn it on later.
	hupReopeners.add("pcap capture", b.capture.reopen)

	// Sockets systemd passed (socket activation) are used instead of binding (inherit.go).
	listenFDs, err := netmapio.ListenFDs()
	if err != nil {
		return err
	}
	ep, err := netmapio.OpenWith(o.netdev, supervisorEvents(log), socketOptions(o, listenFDs))
	if err != nil {
		return err
	}
	defer ep.Close()
	spec := netmapio.SpecOf(ep, o.netdev) // inherited sockets resolved to their address

	h := newHealthMon(b, o.healthStall)
	go h.run(ctx)
	var metricsDone func()
	if o.metricsAddr != "" {
		metricsDone, err = serveMetrics(o.metricsAddr, o.pprof, b, ep, h, log)
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
	stopCtl, err := startCtl(o, newCtlServer(b, tap.Name(), ep.Addr(), log))
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
	go reportProblems(ctx, problemInterval, func() map[string]uint64 { return problemCounts(b, portProblems(ep)) }, log)

	fields := logrus.Fields{
		"tap":          tap.Name(),
		"vnet_hdr_len": o.vnetHdrLen,
		"tap_offloads": set.String(),
		"probed":       probed.String(),
		"gro":          onOffString(o.gro && !b.groKilled.Load()),
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

	tapErr := make(chan error, 1)
	tapDone := make(chan struct{})
	go func() { tapErr <- b.runTapToPort(); close(tapDone) }()

	// On shutdown the TAP is closed first, so nothing new is read, and what was read is
	// still delivered: the TAP→port goroutine finishes its batch and flushes the pool
	// into the port before the port is closed (lifecycle.go drainTAP).
	drain := func() { drainTAP(tap, tapDone, drainTimeout, log) }
	err = supervise(ctx, b, ep, log, drain)
	tap.Close()
	<-tapErr
	logSummary(b, ep.Stats(), log)
	return err
}

// qemuHint is the passt-style line that tells the user what to give QEMU.
func qemuHint(spec netmapio.Spec) string {
	if spec.Backend == netmapio.BackendStream && spec.VnetHdr {
		return "vnet-hdr=on: the peer must be another tapgro with vnet-hdr=on (QEMU cannot speak it)"
	}
	opt := spec.QEMUOption("n0")
	if spec.Remote.Type == netmapio.AddrFD {
		return "the port is the inherited connection " + spec.Remote.String() + "; its peer is already attached"
	}
	if opt == "" {
		return "this port has no QEMU counterpart (a NIC in netmap mode)"
	}
	return "give QEMU: -netdev " + opt + " -device virtio-net-pci,netdev=n0"
}

// supervise hands each connection the port endpoint yields to the datapath, one at a
// time, until ctx is cancelled.
func supervise(ctx context.Context, b *bridge, ep netmapio.Endpoint, log *logrus.Logger, drain func()) error {
	for {
		port, err := ep.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, netmapio.ErrInheritedClosed) {
				// fd=N: the supervisor owns the connection; without it there is nothing
				// to serve, and a clean exit tells the supervisor so.
				log.WithField("port", ep.Addr()).Info("the inherited connection has ended; exiting")
				return nil
			}
			return fmt.Errorf("port %s: %w", ep.Addr(), err)
		}
		log.WithField("peer", port.Peer()).Info("port connected")
		// This peer's capabilities decide the TAP's offloads and the software steps.
		if _, err := b.portConnected(port); err != nil {
			log.WithError(err).Warn("cannot set the TAP's offloads for this peer; keeping the previous ones")
		}
		// Before the TAP→port goroutine sees the port, so the two never write at once.
		announce(b, port, log)
		ref := newPortRef(port)
		b.port.Store(ref)

		done := make(chan error, 1)
		go func() { done <- b.runPortToTap(port) }()
		select {
		case err = <-done:
		case <-ctx.Done():
			drain()
			port.Close()
			err = <-done
		}
		b.port.CompareAndSwap(ref, nil)
		port.Close()
		if ctx.Err() != nil {
			log.WithField("peer", port.Peer()).Info("port closed for shutdown")
			return nil
		}
		entry := log.WithField("peer", port.Peer())
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, netmapio.ErrClosed) {
			entry.WithError(err).Warn("port connection ended with an error; waiting for the next one")
		} else {
			entry.Info("port disconnected; waiting for the next connection")
		}
	}
}

// announce tells a new peer the TAP's MAC for each of its addresses (announce.go).
func announce(b *bridge, port netmapio.Port, log *logrus.Logger) {
	mac, addrs, err := b.tap.LinkInfo()
	if err != nil {
		log.WithError(err).Debug("cannot read the TAP's addresses; not announcing them")
		return
	}
	frames := announceFrames(mac, addrs)
	if len(frames) == 0 {
		return
	}
	if hl := port.VnetHdrLen(); hl > 0 {
		// A header-carrying port (vnet-hdr=on, VALE) takes [header][frame]: an all-zero
		// header says "plain, fully checksummed".
		for i, f := range frames {
			frames[i] = append(make([]byte, hl, hl+len(f)), f...)
		}
	}
	if _, err := port.WriteBatch(frames); err != nil {
		log.WithError(err).Debug("announcing the TAP's addresses failed")
		return
	}
	log.WithFields(logrus.Fields{"mac": mac.String(), "addrs": len(frames)}).Debug("announced the TAP's addresses to the peer")
}

func supervisorEvents(log *logrus.Logger) netmapio.Events {
	return netmapio.Events{
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

func onOffString(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// logSummary prints the counters once at exit; `tapgro demo` and the integration tests
// read them from here.
func logSummary(b *bridge, ps *netmapio.Stats, log *logrus.Logger) {
	f := logrus.Fields{
		"tap_to_port_reads":  b.t2p.Reads.Load(),
		"tap_to_port_frames": b.t2p.Frames.Load(),
		"tap_to_port_bytes":  b.t2p.Bytes.Load(),
		"port_to_tap_frames": b.p2t.Frames.Load(),
		"port_to_tap_bytes":  b.p2t.Bytes.Load(),
		"port_to_tap_reads":  b.p2t.Reads.Load(),
	}
	if c := b.coal; c != nil {
		s := c.Stats()
		f["gro_segments"] = s.Segments.Load()
		f["gro_packets"] = s.Packets.Load()
		f["gro_gso_packets"] = s.GSOOut.Load()
		f["gro_coalesced"] = s.Coalesced.Load()
	}
	ts := b.tap.Stats()
	f["tap_write_einval"] = ts.WriteErrEINVAL.Load()
	f["gso_write_fallback"] = b.p2t.GSOFallback.Load()
	f["tap_to_port_gso_passthrough"] = b.t2p.GSOPassthrough.Load()
	f["port_to_tap_gso_passthrough"] = b.p2t.GSOPassthrough.Load()
	f["port_to_tap_malformed"] = b.p2t.DropMalformed.Load()
	f["tap_to_port_shm"] = ps.ShmFramesOut.Load()
	f["port_to_tap_shm"] = ps.ShmFramesIn.Load()
	f["dropped"] = b.t2p.DropNoPeer.Load() + b.t2p.DropMalformed.Load() + b.t2p.DropPortError.Load() +
		b.p2t.DropMalformed.Load() + b.p2t.DropTapEIO.Load() + b.p2t.DropTapError.Load()
	// Per-direction accounting: every frame read from the TAP was delivered, split (GSO),
	// or counted here (the SIGTERM-under-load test checks the balance).
	f["tap_to_port_dropped"] = b.t2p.DropNoPeer.Load() + b.t2p.DropMalformed.Load() + b.t2p.DropPortError.Load() +
		b.rxStats.Drops[rxpool.DropTooBig].Load()
	f["tap_to_port_gso_segmented"] = b.t2p.GSOSegmented.Load()
	f["tap_to_port_port_error"] = b.t2p.DropPortError.Load()
	f["pcap_tap_frames"] = b.capture.tap.stats.Frames.Load()
	f["pcap_tap_dropped"] = b.capture.tap.stats.Dropped.Load()
	f["pcap_port_frames"] = b.capture.port.stats.Frames.Load()
	f["pcap_port_dropped"] = b.capture.port.stats.Dropped.Load()
	log.WithFields(f).Info("tapgro exiting")
}
