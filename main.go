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
	log := newLogger(o, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
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
	// Everything tapgro can fill in software is worth taking from the kernel: one 64 KB
	// read replaces ~45 MTU reads, and splitting in userspace is cheaper than the syscalls.
	const fillable = vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN | vnethdr.OffloadUSO
	want := o.offload.set
	if o.offload.auto {
		want = fillable
	}
	set, err := tap.SetOffloads(want & probed)
	if err != nil {
		return fmt.Errorf("TUNSETOFFLOAD %s on %s: %w", want&probed, o.tap, err)
	}
	// Writes may always carry partial checksums and TCP GSO (wire.md §1.4); UDP_L4 GSO only
	// where the kernel knows it, which is what a successful USO probe shows.
	accepts := vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN | (probed & vnethdr.OffloadUSO)

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
	if o.gro {
		if err := probeGSOWrite(tap, o.vnetHdrLen); err != nil {
			b.groKilled.Store(true)
			log.WithError(err).Warn("start-up GSO probe failed: writing segments instead of GSO packets")
		}
	}

	ep, err := netmapio.Open(o.netdev, supervisorEvents(log))
	if err != nil {
		return err
	}
	defer ep.Close()

	log.WithFields(logrus.Fields{
		"tap":          tap.Name(),
		"vnet_hdr_len": o.vnetHdrLen,
		"tap_offloads": set.String(),
		"probed":       probed.String(),
		"gro":          onOffString(o.gro && !b.groKilled.Load()),
		"netdev":       o.netdev.String(),
		"version":      version,
	}).Info("tapgro ready; " + qemuHint(o.netdev))

	var metricsDone func()
	if o.metricsAddr != "" {
		metricsDone, err = serveMetrics(o.metricsAddr, o.pprof, b, ep, log)
		if err != nil {
			return err
		}
		defer metricsDone()
	}

	tapErr := make(chan error, 1)
	go func() { tapErr <- b.runTapToPort() }()

	err = supervise(ctx, b, ep, log)
	// Closing the TAP ends the TAP→port goroutine; its last batch has been sent already.
	tap.Close()
	<-tapErr
	logSummary(b, log)
	return err
}

// qemuHint is the passt-style line that tells the user what to give QEMU.
func qemuHint(spec netmapio.Spec) string {
	opt := spec.QEMUOption("n0")
	if opt == "" {
		return "this port has no QEMU counterpart (a NIC in netmap mode)"
	}
	return "give QEMU: -netdev " + opt + " -device virtio-net-pci,netdev=n0"
}

// supervise hands each connection the port endpoint yields to the datapath, one at a
// time, until ctx is cancelled.
func supervise(ctx context.Context, b *bridge, ep netmapio.Endpoint, log *logrus.Logger) error {
	for {
		port, err := ep.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("port %s: %w", ep.Addr(), err)
		}
		log.WithField("peer", port.Peer()).Info("port connected")
		// Before the TAP→port goroutine sees the port, so the two never write at once.
		announce(b, port, log)
		ref := &portRef{p: port}
		b.port.Store(ref)

		done := make(chan error, 1)
		go func() { done <- b.runPortToTap(port) }()
		select {
		case err = <-done:
		case <-ctx.Done():
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
func logSummary(b *bridge, log *logrus.Logger) {
	f := logrus.Fields{
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
	f["dropped"] = b.t2p.DropNoPeer.Load() + b.t2p.DropMalformed.Load() + b.t2p.DropPortError.Load() +
		b.p2t.DropMalformed.Load() + b.p2t.DropTapEIO.Load() + b.p2t.DropTapError.Load()
	log.WithFields(f).Info("tapgro exiting")
}
