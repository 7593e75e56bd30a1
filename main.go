// Command tapgro connects a Linux TAP device opened with IFF_VNET_HDR to a QEMU guest.
// First of all it is a vhost-user-net back-end: it moves frames between the guest's
// rings and the TAP with the guest's virtio-net header passed straight through, and
// follows QEMU's back-end program conventions (--socket-path, --fd,
// --print-capabilities). On QEMU's socket netdevs (-netdev stream, socket, dgram) and
// netmap, and on vhost-user where the two ends differ, it does in userspace what the
// kernel's GRO and virtio-net's RSC do: it coalesces MTU-sized TCP and UDP segments into
// 64 KB GSO packets before they reach the host stack, and segments the host's TSO
// packets for a guest that cannot take them. Between two tapgro, a stream with
// vnet-hdr=on (tapgro's own extension) carries GSO frames whole, through shared-memory
// rings over an AF_UNIX socket unless shm=off.
//
// The root package is the process: flags and environment, logging, the sandbox's
// stages and signals, the control socket's client, metrics and health, and run(), which
// opens the port kind's datapath (portkind.go: TAP → engine (package datapath) → endpoint
// (package netdev) for socket and netmap ports, TAP → vhostnet for vhost-user) and puts
// the same operator surfaces (package ops) over either. It is the only package that
// imports logrus or Prometheus.
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
	"tapgro/demo"
	"tapgro/demo/vhostrelay"
	"tapgro/netdev"
	"tapgro/ops"
	"tapgro/procscale"
	"tapgro/sandbox"
)

// printCapabilities answers --print-capabilities, QEMU's back-end program convention
// (docs/interop/vhost-user.rst "Backend program conventions"): the capabilities as JSON
// on stdout (VHostUserBackendCapabilities in docs/interop/vhost-user.json; a net
// back-end has no features to list), every other argument ignored and nothing else
// done. It reports whether it was asked.
func printCapabilities(args []string, stdout io.Writer) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--print-capabilities" || a == "-print-capabilities" {
			fmt.Fprintln(stdout, `{"type": "net"}`)
			return true
		}
	}
	return false
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "demo":
			return demo.Run(args[1:], stdout, stderr)
		case "ctl":
			return runCtl(args[1:], stdout, stderr)
		case "version", "--version":
			fmt.Fprintln(stdout, "tapgro", version)
			return 0
		case "__sink", "__source":
			return demo.Helper(args, stdout, stderr)
		case "__vhostrelay":
			// The demo's guest on the vhost-user port (package demo/vhostrelay).
			return vhostrelay.Main(args[1:])
		case "__manpage":
			if err := writeManPage(stdout); err != nil {
				fmt.Fprintln(stderr, "tapgro:", err)
				return 1
			}
			return 0
		}
	}
	if printCapabilities(args, stdout) {
		return 0
	}
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, errHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "tapgro:", err)
		return 2
	}
	// Before anything is opened: the whole process moves into its own mount, IPC and
	// UTS namespaces by re-executing itself (package sandbox says why).
	if err := sandbox.Reexec(o.sandbox); err != nil {
		fmt.Fprintln(stderr, "tapgro:", err)
		return 1
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
// environment variable (the runtime has applied it already), both fixed; else one P
// scaled up while the load needs more (procscale's doc has why one). That holds for
// vhost-user too: its workers hand each other work through the kernel as a socket
// port's pipelines do (a TAP write's ACK makes the TAP readable for the RX worker), and
// a guest that sends in small batches (under TCG: a few frames per kick) showed it:
// one P against one per CPU took 27 % of tapgro's context switches and 7-11 % of its
// CPU per GB away, at 7-8 % less throughput (benchtool -guests -before -trace, the two
// builds alternating in one run).
func procsFor(o *options, env string, cpus int) (n int, scale bool, why string) {
	switch {
	case o.procs > 0:
		return o.procs, false, "GOMAXPROCS from --procs"
	case env != "":
		if n, err := strconv.Atoi(env); err == nil && n > 0 {
			return n, false, "GOMAXPROCS from the environment"
		}
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

// run opens the port kind's datapath (portkind.go: the engine and its endpoint, or
// vhostnet), puts the operator surfaces over it — /healthz, /metrics, the control
// socket, the problem report — drops privileges once everything privileged is open,
// and serves until ctx ends. Every kind goes through the same steps in the same order.
func run(ctx context.Context, o *options, log *logrus.Logger) error {
	open := openEngine
	if o.netdev.Backend == netdev.BackendVhostUser {
		open = openVhost
	}
	k, err := open(o, log)
	if err != nil {
		return err
	}
	defer k.close()
	dp := k.datapath()
	if o.scaleProcs {
		go procscale.Run(ctx, procscale.Default(runtime.NumCPU()), bothWays(ops.Delivered(dp)), func(from, to int, l procscale.Load) {
			log.WithFields(logrus.Fields{"from": from, "to": to, "cpus_used": fmt.Sprintf("%.2f", l.CPU), "both_ways": l.Parallel}).Debug("GOMAXPROCS rescaled")
		})
	}
	h := ops.NewHealthMonitor(dp, o.healthStall)
	go h.Run(ctx)
	if o.metricsAddr != "" {
		done, err := serveMetrics(o.metricsAddr, o.pprof, ops.NewMetrics(dp, h, version), h, log)
		if err != nil {
			return err
		}
		defer done()
	}
	for _, a := range exposedAddrs(o) {
		log.WithField("addr", a).Warn("--allow-remote: the port accepts frames from beyond this host; anyone who can reach it can inject frames into the guest")
	}
	if o.metricsAddr != "" && o.allowRemote && requireLoopback("--metrics-addr", o.metricsAddr) != nil {
		log.WithField("addr", o.metricsAddr).Warn("--allow-remote: /metrics is served beyond this host")
	}
	// The control socket (ctl.go) is created before the privilege drop, in a directory
	// only root may write, and chowned to --user's account.
	ctlSrv := ops.NewCtlServer(dp, version, engineLogger{log})
	stopCtl, err := startCtl(o, ctlSrv, log)
	if err != nil {
		return err
	}
	defer stopCtl()
	// Everything privileged is open: the TAP, the port's socket, the metrics listener,
	// the control socket, the log and capture files. Confine the process (package
	// sandbox); with --sandbox off only --user's drop is done.
	var confined sandbox.Report
	if o.sandbox == sandbox.Off {
		if o.user != nil {
			if err := dropPrivileges(o.user); err != nil {
				return err
			}
		}
		confined.Mode = sandbox.Off
	} else if confined, err = sandbox.Enter(sandboxPlan(o)); err != nil {
		return err
	}
	ctlSrv.SetSandbox(confined.String())
	go ops.ReportProblems(ctx, ops.ProblemInterval, ops.Problems(dp), engineLogger{log})
	fields, msg := k.ready()
	for key, v := range ops.ReadyFields(dp) {
		if _, ok := fields[key]; !ok {
			fields[key] = v
		}
	}
	fields["version"] = version
	for k, v := range confined.Fields() {
		fields[k] = v
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
	log.WithFields(fields).Info(msg)
	err = k.serve(ctx)
	log.WithFields(ops.Summary(dp)).Info("tapgro exiting")
	return err
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
