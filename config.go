package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"tapgro/netdev"
	"tapgro/onoff"
	"tapgro/pcapio"
	"tapgro/rxpool"
	"tapgro/sandbox"
	"tapgro/tapdev"
	"tapgro/vhostnet"
	"tapgro/vnethdr"
)

// options is everything the command line can say. Zero values are never used: parseFlags
// fills every field, so the datapath never guesses.
type options struct {
	tap    string
	tapFDs []int // --tap-fd: queues a manager opened (tapdev.Adopt)
	// vhostFD is --fd: the vhost-user socket a manager passed, listening or connected
	// (-1: none). --socket-path is --netdev vhost-user,path= and leaves no trace here.
	vhostFD     int
	netdev      netdev.Spec
	addrs       []netip.Prefix
	mtu         int
	txQueueLen  int
	vnetHdrLen  int
	multiQueue  bool
	gro         bool
	udpGRO      bool
	groFlush    string // "auto", "batch" or "timer"; timerFlush decides for a port
	rscInterval time.Duration
	// callInterval moderates vhost-user's calls to the guest's receive queue under load
	// (--call-interval; vhostnet.Config.CallInterval).
	callInterval time.Duration
	// pollWindow is vhost-user's poll window (--vhost-poll; vhostnet.Config.PollWindow).
	pollWindow time.Duration
	// txHold is vhost-user's transmit hold under bulk (--tx-hold; vhostnet.Config.TXHold).
	txHold time.Duration
	// qemu is the QEMU release the start-up hint is written for (--qemu-version);
	// qemuAuto: look it up on the PATH at start (qemu_hint.go).
	qemu        netdev.QEMUVersion
	qemuAuto    bool
	maxFlows    int
	offload     vnethdr.Choice
	logLevel    logrus.Level
	logFormat   string
	metricsAddr string
	pprof       bool
	allowRemote bool
	batch       int
	procs       int           // --procs: GOMAXPROCS; 0 picks it (procsFor)
	scaleProcs  bool          // procsFor's choice: package procscale follows the load
	rx          rxpool.Config // --rx-*: the TAP→port receive pool

	// Operations (security.go, lifecycle.go, health.go).
	socketMode  os.FileMode   // --socket-mode: UNIX socket paths tapgro creates
	socketGroup int           // --socket-group as a gid; 0 leaves the creator's group
	user        *account      // --user/--group: drop to this after opening everything
	logFile     string        // --log-file: reopened on SIGHUP; "" is stderr
	healthStall time.Duration // --health-stall: /healthz fails after this long stalled

	// --allow-unsafe-dir: create socket paths even in a directory others may write that
	// has no sticky bit (netdev.Options.AllowUnsafeDir).
	allowUnsafeDir bool

	// vhost-user front-ends (security.go): who may connect (--allow-peer), how much
	// memory a session may map (--vhost-max-mapped), from which filesystems
	// (--vhost-any-fs-memory).
	peers       vhostnet.Peers
	maxMapped   uint64
	anyFSMemory bool

	// sandbox is --sandbox (package sandbox): how tapgro confines itself after set-up.
	sandbox sandbox.Mode

	// Runtime control (ctl.go).
	ctlSocket        string // --ctl-socket; "" disables the control socket
	ctlSocketDefault bool   // ctlSocket is the default path: failing to create it only warns

	// Capture (capture.go): files for each side ("" is off) and the Writer's limits.
	pcapTap, pcapPort string
	pcapDir           string // --pcap-dir: where ctl may start captures once confined
	pcap              pcapio.Options
}

// parseOffloads is --offload (and TAPGRO_OFFLOAD): vnethdr.ParseChoice with the flag's
// name in its errors.
func parseOffloads(s string) (vnethdr.Choice, error) {
	c, err := vnethdr.ParseChoice(s)
	if err != nil {
		return c, fmt.Errorf("--offload %q: %w", s, err)
	}
	return c, nil
}

type prefixList []netip.Prefix

func (p *prefixList) String() string {
	var s []string
	for _, x := range *p {
		s = append(s, x.String())
	}
	return strings.Join(s, ",")
}

func (p *prefixList) Set(v string) error {
	pr, err := netip.ParsePrefix(v)
	if err != nil {
		return fmt.Errorf("want an address with prefix length such as 198.18.0.1/24 or fd00:198:18::1/64: %w", err)
	}
	*p = append(*p, pr)
	return nil
}

func onOff(name, v string) (bool, error) {
	if on, ok := onoff.Parse(v); ok {
		return on, nil
	}
	return false, fmt.Errorf("--%s: want on or off, got %q", name, v)
}

const usageText = `tapgro bridges a TAP device (IFF_VNET_HDR) and a QEMU network port, coalescing
the guest's MTU-sized TCP/UDP segments into 64 KB GSO packets (userspace GRO).

Usage:
  tapgro --tap NAME --netdev SPEC [flags]
  tapgro demo        run two tapgro datapaths in two network namespaces and measure them
  tapgro ctl REQUEST query or change a running tapgro (tapgro ctl --help)

SPEC mirrors QEMU's -netdev syntax from tapgro's side:
  stream,server=on|off,addr.type=unix,addr.path=PATH
  stream,server=on|off,addr.type=inet,addr.host=HOST,addr.port=PORT
  socket,listen=HOST:PORT | socket,connect=HOST:PORT | socket,udp=HOST:PORT,localaddr=HOST:PORT
  stream,server=on,addr.type=fd,addr.str=N   a listening socket passed as fd N (systemd: N=3)
  stream,server=off,addr.type=fd,addr.str=N | socket,fd=N   a connected stream passed as fd N
  dgram,local.type=inet,local.host=H,local.port=N,remote.type=inet,remote.host=H,remote.port=N
  dgram,local.type=unix,local.path=P,remote.type=unix,remote.path=P
  stream,...,vnet-hdr=on[,shm=off]   tapgro to tapgro only: GSO frames cross whole (over
                                     unix, through shared memory unless shm=off)
  vhost-user,path=P[,server=on|off][,queues=N]  tapgro is QEMU's vhost-user-net back-end on P
                                     (QEMU: -chardev socket,path=P,reconnect-ms=1000, before
                                     9.2 reconnect=1; tapgro logs the options at start);
                                     queues=N: N queue pairs on N queues of a multiqueue TAP

Environment (a flag on the command line wins over its variable):
  TAPGRO_GRO=on|off  TAPGRO_UDP_GRO=on|off  TAPGRO_OFFLOAD=auto|off|LIST   as --gro, --udp-gro, --offload

Flags:
`

// captureFlags, when set, is handed the flag set before it parses anything: the man page
// (manpage.go) is written from the flags' own definitions, so it cannot drift from them.
var captureFlags func(*flag.FlagSet)

// parseFlags turns argv into options. It never exits: errors go back to the caller, which
// prints them once, so tests can drive it with their own argument lists.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("tapgro", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	o := &options{}
	var addrs prefixList
	var netdevArg, gro, udpGRO, offload, logLevel string
	fs.StringVar(&o.tap, "tap", "", "TAP device to create or attach to (required)")
	fs.StringVar(&netdevArg, "netdev", "", "QEMU-side port, see SPEC above (required)")
	fs.Var(&addrs, "addr", "address with prefix for the TAP, e.g. 198.18.0.1/24 (repeatable; IPv4 and IPv6)")
	fs.IntVar(&o.mtu, "mtu", 0, "TAP MTU, 68..65521; the guest's MTU must match (0 leaves it as it is)")
	fs.IntVar(&o.txQueueLen, "txqueuelen", 0, "TAP transmit queue length in packets (0 leaves the kernel default)")
	fs.IntVar(&o.vnetHdrLen, "vnet-hdr-len", 10, "virtio_net_hdr length on the TAP: 10 or 12")
	fs.BoolVar(&o.multiQueue, "multi-queue", false, "open the TAP with IFF_MULTI_QUEUE (must match an existing TAP)")
	fs.StringVar(&gro, "gro", "on", "coalesce port->TAP TCP segments into GSO packets: on or off")
	fs.StringVar(&udpGRO, "udp-gro", "on", "also coalesce UDP datagrams (only where the TAP accepts USO): on or off")
	fs.StringVar(&o.groFlush, "gro-flush", "auto", "when held aggregates are flushed: batch (when the port has nothing more buffered), timer (held across port reads for at most --rsc-interval; PSH/FIN/short segments still flush at once), or auto (batch on socket and netmap ports, timer on vhost-user)")
	fs.DurationVar(&o.rscInterval, "rsc-interval", 50*time.Microsecond, "with --gro-flush=timer: longest time an aggregate is held")
	fs.IntVar(&o.maxFlows, "gro-flows", 64, "GRO flow table size (aggregates held at once)")
	fs.StringVar(&offload, "offload", "auto", "TAP offloads: auto, off, or a list of csum,tso4,tso6,tso_ecn,uso")
	fs.StringVar(&logLevel, "log-level", "info", "panic|fatal|error|warn|info|debug|trace")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on HOST:PORT (loopback unless --allow-remote)")
	fs.BoolVar(&o.pprof, "pprof", false, "also serve /debug/pprof on --metrics-addr")
	fs.BoolVar(&o.allowRemote, "allow-remote", false, "allow TCP listeners (metrics, ports) on non-loopback addresses")
	fs.IntVar(&o.batch, "batch", 64, "frames per read batch on each side")
	fs.IntVar(&o.procs, "procs", 0, "threads that run tapgro's code at once (GOMAXPROCS); 0: 1, more while the load keeps them busy (a GOMAXPROCS environment variable fixes it too)")
	var socketMode, socketGroup, userName, groupName string
	fs.StringVar(&socketMode, "socket-mode", "0600", "permissions (octal) of the UNIX socket paths tapgro creates; widen with care: whoever can connect can inject frames into the guest")
	fs.StringVar(&socketGroup, "socket-group", "", "group (name or gid) of the UNIX socket paths tapgro creates, e.g. with --socket-mode 0660")
	fs.BoolVar(&o.allowUnsafeDir, "allow-unsafe-dir", false, "create UNIX socket paths (port and --ctl-socket) even in a directory other users can write that has no sticky bit; there anyone could swap tapgro's socket for their own")
	var peers peerList
	fs.Var(&peers, "allow-peer", "vhost-user: only a front-end whose process runs as one of these may connect (or, with server=off, listen): a comma-separated list of uid:USER and gid:GROUP (names or numbers; repeatable; default: whoever the socket's permissions let in)")
	var maxMapped string
	fs.StringVar(&maxMapped, "vhost-max-mapped", "32T", "vhost-user: most guest memory (and dirty log) one front-end may have tapgro map, e.g. 512G or 4T; larger tables are refused")
	fs.BoolVar(&o.anyFSMemory, "vhost-any-fs-memory", false, "vhost-user: accept guest memory on files outside tmpfs and hugetlbfs (DAX, pmem); on a FUSE or network filesystem a page fault may never finish and stop tapgro")
	fs.StringVar(&userName, "user", "", "after opening the TAP, the port and the metrics listener, drop privileges to this user (name or uid)")
	fs.StringVar(&groupName, "group", "", "with --user: the group to drop to (name or gid; default the user's primary group)")
	var sandboxMode, tapFDs, socketPath string
	fs.StringVar(&socketPath, "socket-path", "", "vhost-user: listen on this UNIX socket `PATH`, the same as --netdev vhost-user,path=PATH (QEMU's back-end program convention)")
	fs.Bool("print-capabilities", false, "print the vhost-user back-end's capabilities as JSON, {\"type\": \"net\"}, and exit without doing anything else (QEMU's back-end program convention)")
	fs.IntVar(&o.vhostFD, "fd", -1, "vhost-user: serve the socket passed as descriptor `N` (QEMU's back-end program convention): a listening one (each front-end that connects is served, one at a time) or a connected one (its session, then tapgro exits)")
	fs.StringVar(&sandboxMode, "sandbox", "on", "after set-up, confine tapgro: no capabilities, an empty root in its own mount namespace, Landlock, a seccomp allow-list (on); the same but unlisted system calls are logged by the kernel instead of stopping tapgro (log: for debugging); or nothing (off)")
	fs.StringVar(&tapFDs, "tap-fd", "", "use these open TAP queues (comma-separated fds, one per queue pair; opened with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, link configured by whoever opened them) instead of opening --tap, as QEMU's -netdev tap,fd=")
	fs.StringVar(&o.logFile, "log-file", "", "append the log to this file instead of stderr; SIGHUP reopens it (for logrotate)")
	fs.DurationVar(&o.healthStall, "health-stall", 10*time.Second, "/healthz fails once a direction has had traffic pending without progress for this long")
	fs.StringVar(&o.ctlSocket, "ctl-socket", "", "`PATH` of the control socket tapgro ctl talks to (mode 0600; default "+ctlDefaultDir+"/TAP.ctl; \"\" disables it)")
	var pcapMax string
	fs.StringVar(&o.pcapTap, "pcap-tap", "", "capture frames as the TAP sees them (GSO super-frames whole) into this pcap `FILE`")
	fs.StringVar(&o.pcapPort, "pcap-port", "", "capture frames as they cross the port (what the guest sees) into this pcap `FILE`")
	fs.StringVar(&o.pcapDir, "pcap-dir", "", "`DIR` in which tapgro ctl pcap may start capture files at run time (with the sandbox on, only there and in the directories of --pcap-tap and --pcap-port)")
	fs.IntVar(&o.pcap.SnapLen, "pcap-snaplen", pcapio.DefaultSnapLen, "capture: bytes kept of each frame (the record keeps the true length)")
	fs.StringVar(&pcapMax, "pcap-max-bytes", "0", "capture: rotate a file before it grows past this size, e.g. 100M (0: no cap)")
	fs.IntVar(&o.pcap.Files, "pcap-files", 3, "capture: rotated files kept, FILE.1 … FILE.N (0: stop capturing at the cap)")
	var qemuVer string
	fs.StringVar(&qemuVer, "qemu-version", "auto", "the QEMU release the start-up hint's options are for (they differ: reconnect, vectors=0 under TCG): MAJOR.MINOR, e.g. 7.2 or 10.0, or auto (that of the qemu-system-x86_64 on the PATH; without one the newest release's options, older ones' named)")
	var rxBuf, rxPool, rxThreshold, rxBatch string
	var rxDelay time.Duration
	fs.StringVar(&rxBuf, "rx-buf-size", "2048", "TAP->port receive pool: bytes per buffer (a frame spans ceil(len/size) buffers), e.g. 2048 or 4K")
	fs.StringVar(&rxPool, "rx-pool-bytes", "4M", "TAP->port receive pool: total bytes, the hard cap on frames queued for the port, e.g. 4M")
	fs.DurationVar(&rxDelay, "rx-flush-delay", rxpool.DefaultFlushDelay, "after the port was full and became writable: longest wait for more room before flushing (0: none)")
	fs.DurationVar(&o.txHold, "tx-hold", 150*time.Microsecond, "vhost-user: after a TX batch that emptied the ring and moved 16 KiB or more, wait this long with the guest's kicks off before the next batch, instead of waking on every kick (at most 1ms; 0: off)")
	fs.DurationVar(&o.pollWindow, "vhost-poll", 0, "vhost-user: after a pair hands the guest frames, its TX worker watches the ring this long for the answer before sleeping on the kick (fewer kicks and wake-ups for CPU; needs a spare core; at most 1ms; 0: off)")
	fs.DurationVar(&o.callInterval, "call-interval", 500*time.Microsecond, "vhost-user: under load, at most one call (interrupt) to the guest's receive queue per this interval (0: one per batch)")
	fs.StringVar(&rxThreshold, "rx-flush-threshold", "auto", "after the port was full: free send-buffer room that flushes at once, in bytes (e.g. 256K) or percent of the buffer (e.g. 50%); auto: room for everything queued, at most 50%")
	fs.StringVar(&rxBatch, "rx-batch", "on", "batch frames to the port (on), or write every frame on its own (off: the baseline for measurements); vhost-user: off publishes and signals every frame")
	if captureFlags != nil {
		captureFlags(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := applyEnv(fs, os.LookupEnv); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if o.sandbox, err = sandbox.ParseMode(sandboxMode); err != nil {
		return nil, err
	}
	if tapFDs != "" {
		if o.tapFDs, err = parseTapFDs(tapFDs); err != nil {
			return nil, err
		}
		name, err := tapdev.NameOf(o.tapFDs[0])
		if err != nil {
			return nil, fmt.Errorf("--tap-fd %d: %w", o.tapFDs[0], err)
		}
		if o.tap != "" && o.tap != name {
			return nil, fmt.Errorf("--tap-fd %d is %s, not --tap %s", o.tapFDs[0], name, o.tap)
		}
		o.tap = name
		if len(addrs) > 0 || o.txQueueLen != 0 {
			return nil, errors.New("--tap-fd: the link is configured by whoever opened the TAP; --addr and --txqueuelen are not applied")
		}
	}
	if o.tap == "" {
		return nil, errors.New("--tap (or --tap-fd) is required")
	}
	if len(o.tap) > 15 {
		return nil, fmt.Errorf("--tap %q: interface names are at most 15 bytes", o.tap)
	}
	ctlSock, ctlDefault, err := resolveCtlSocket(fs, o.ctlSocket, o.tap)
	if err != nil {
		return nil, err
	}
	o.ctlSocket, o.ctlSocketDefault = ctlSock, ctlDefault
	spec, err := vhostConvention(netdevArg, socketPath, o.vhostFD)
	if err != nil {
		return nil, err
	}
	o.netdev = spec
	o.addrs = addrs
	if o.mtu != 0 && (o.mtu < 68 || o.mtu > 65521) {
		return nil, fmt.Errorf("--mtu %d: a TAP takes 68..65521", o.mtu)
	}
	if o.vnetHdrLen != 10 && o.vnetHdrLen != 12 {
		return nil, fmt.Errorf("--vnet-hdr-len %d: want 10 or 12", o.vnetHdrLen)
	}
	if o.gro, err = onOff("gro", gro); err != nil {
		return nil, err
	}
	if o.udpGRO, err = onOff("udp-gro", udpGRO); err != nil {
		return nil, err
	}
	if o.groFlush != "auto" && o.groFlush != "batch" && o.groFlush != "timer" {
		return nil, fmt.Errorf("--gro-flush %q: want auto, batch or timer", o.groFlush)
	}
	if o.qemuAuto = qemuVer == "auto"; !o.qemuAuto {
		if o.qemu, err = netdev.ParseQEMUVersion(qemuVer); err != nil {
			return nil, fmt.Errorf("--qemu-version: %w", err)
		}
	}
	if o.txHold < 0 || o.txHold > time.Millisecond {
		return nil, fmt.Errorf("--tx-hold %v: want 0..1ms", o.txHold)
	}
	if o.pollWindow < 0 || o.pollWindow > time.Millisecond {
		return nil, fmt.Errorf("--vhost-poll %v: want 0..1ms", o.pollWindow)
	}
	if o.callInterval < 0 || o.callInterval > time.Second {
		return nil, fmt.Errorf("--call-interval %v: want 0..1s", o.callInterval)
	}
	if o.rscInterval <= 0 || o.rscInterval > time.Second {
		return nil, fmt.Errorf("--rsc-interval %v: want a duration in (0, 1s]", o.rscInterval)
	}
	if o.maxFlows < 1 || o.maxFlows > 4096 {
		return nil, fmt.Errorf("--gro-flows %d: want 1..4096", o.maxFlows)
	}
	if o.batch < 1 || o.batch > 512 {
		return nil, fmt.Errorf("--batch %d: want 1..512", o.batch)
	}
	if o.procs < 0 || o.procs > 1024 {
		return nil, fmt.Errorf("--procs %d: want 0..1024 (0: tapgro's default)", o.procs)
	}
	if o.rx, err = parseRxFlags(rxBuf, rxPool, rxThreshold, rxBatch, rxDelay); err != nil {
		return nil, err
	}
	if o.offload, err = parseOffloads(offload); err != nil {
		return nil, err
	}
	if o.logLevel, err = logrus.ParseLevel(logLevel); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return nil, fmt.Errorf("--log-format %q: want text or json", o.logFormat)
	}
	if o.pprof && o.metricsAddr == "" {
		return nil, errors.New("--pprof needs --metrics-addr")
	}
	if o.metricsAddr != "" && !o.allowRemote {
		if err := requireLoopback("--metrics-addr", o.metricsAddr); err != nil {
			return nil, err
		}
	}
	if !o.allowRemote {
		for _, a := range exposedAddrs(o) {
			return nil, fmt.Errorf("--netdev %q: tapgro would accept frames on %s, which is not a loopback address; add --allow-remote to listen beyond this host", netdevArg, a)
		}
	}
	if o.socketMode, err = parseSocketMode(socketMode); err != nil {
		return nil, err
	}
	if socketGroup != "" {
		if o.socketGroup, err = lookupGroup("--socket-group", socketGroup); err != nil {
			return nil, err
		}
	}
	if o.user, err = parseAccount(userName, groupName); err != nil {
		return nil, err
	}
	if o.peers, err = peers.resolve(); err != nil {
		return nil, err
	}
	mm, err := parseBytes("vhost-max-mapped", maxMapped)
	if err != nil || mm < 1<<30 {
		return nil, fmt.Errorf("--vhost-max-mapped %q: want a size of at least 1G, such as 512G or 32T", maxMapped)
	}
	o.maxMapped = uint64(mm)
	if err := parsePcapFlags(o, pcapMax); err != nil {
		return nil, err
	}
	if err := checkVhostUser(o); err != nil {
		return nil, err
	}
	if o.healthStall < time.Second {
		return nil, fmt.Errorf("--health-stall %v: want at least 1s (the health monitor samples once a second)", o.healthStall)
	}
	return o, nil
}

// checkVhostUser refuses, for --netdev vhost-user, the flags its datapath (package
// vhostnet) does not serve, rather than ignoring them. --gro, --udp-gro, --gro-flush,
// --rsc-interval, --gro-flows and --offload apply (vhostnet.Config).
func checkVhostUser(o *options) error {
	if o.netdev.Backend != netdev.BackendVhostUser {
		return nil
	}
	for _, f := range []struct {
		set  bool
		name string
	}{
		{o.multiQueue, "--multi-queue: give vhost-user queue pairs with --netdev vhost-user,...,queues=N (N > 1 opens the TAP with IFF_MULTI_QUEUE, one queue per pair)"},
	} {
		if f.set {
			return fmt.Errorf("--netdev vhost-user: %s", f.name)
		}
	}
	return nil
}

// requireLoopback refuses a listen address that would expose tapgro beyond this host:
// frames injected into a guest's port, or counters, are nobody else's business.
func requireLoopback(flagName, hostPort string) error {
	host, _, ok := strings.Cut(hostPort, ":")
	if i := strings.LastIndex(hostPort, ":"); i >= 0 {
		host, ok = hostPort[:i], true
	}
	if !ok {
		return fmt.Errorf("%s %q: want HOST:PORT", flagName, hostPort)
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" {
		return nil
	}
	a, err := netip.ParseAddr(host)
	if err != nil || !a.IsLoopback() {
		return fmt.Errorf("%s %q: not a loopback address; add --allow-remote to listen beyond this host", flagName, hostPort)
	}
	return nil
}

// errHelp is returned by parseFlags when -h was asked for: usage was printed, exit 0.
var errHelp = flag.ErrHelp

// parseRxFlags turns the --rx-* flags into the receive pool's Config.
func parseRxFlags(buf, pool, threshold, batch string, delay time.Duration) (rxpool.Config, error) {
	var c rxpool.Config
	var err error
	if c.BufSize, err = parseBytes("rx-buf-size", buf); err != nil {
		return c, err
	}
	if c.Bytes, err = parseBytes("rx-pool-bytes", pool); err != nil {
		return c, err
	}
	if c.BufSize < rxpool.MinBufSize || c.BufSize > rxpool.MaxBufSize {
		return c, fmt.Errorf("--rx-buf-size %d: want %d..%d bytes", c.BufSize, rxpool.MinBufSize, rxpool.MaxBufSize)
	}
	if c.Bytes < rxpool.MinBytes || c.Bytes > rxpool.MaxBytes || c.Bytes/c.BufSize < 2 || c.Bytes/c.BufSize > rxpool.MaxBuffers {
		return c, fmt.Errorf("--rx-pool-bytes %d: want %d..%d bytes and 2..%d buffers of --rx-buf-size %d",
			c.Bytes, rxpool.MinBytes, rxpool.MaxBytes, rxpool.MaxBuffers, c.BufSize)
	}
	if delay < 0 || delay > rxpool.MaxDelay {
		return c, fmt.Errorf("--rx-flush-delay %v: want 0..%v", delay, rxpool.MaxDelay)
	}
	c.FlushDelay = delay
	if delay == 0 {
		c.FlushDelay = -1 // rxpool reads 0 as "default"
	}
	switch {
	case threshold == "auto" || threshold == "":
	case strings.HasSuffix(threshold, "%"):
		pct, err := strconv.ParseFloat(strings.TrimSuffix(threshold, "%"), 64)
		if err != nil || pct <= 0 || pct > 100 {
			return c, fmt.Errorf("--rx-flush-threshold %q: want a percentage in (0, 100]", threshold)
		}
		c.FlushThresholdFrac = pct / 100
	default:
		if c.FlushThreshold, err = parseBytes("rx-flush-threshold", threshold); err != nil {
			return c, fmt.Errorf("%w (or auto, or a percentage such as 50%%)", err)
		}
		if c.FlushThreshold < 1 {
			return c, fmt.Errorf("--rx-flush-threshold %q: want at least 1 byte", threshold)
		}
	}
	batching, err := onOff("rx-batch", batch)
	if err != nil {
		return c, err
	}
	c.PerFrame = !batching
	return c, c.Validate()
}

// parseBytes reads a byte count with an optional K, M or G suffix (powers of 1024).
func parseBytes(name, v string) (int, error) {
	mult := 1
	num := v
	if n := len(v); n > 0 {
		switch v[n-1] {
		case 'k', 'K':
			mult, num = 1<<10, v[:n-1]
		case 'm', 'M':
			mult, num = 1<<20, v[:n-1]
		case 'g', 'G':
			mult, num = 1<<30, v[:n-1]
		case 't', 'T':
			mult, num = 1<<40, v[:n-1]
		}
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("--%s %q: want a byte count such as 2048, 512K or 4M", name, v)
	}
	return n * mult, nil
}

// parsePcapFlags checks the --pcap-* flags.
func parsePcapFlags(o *options, maxBytes string) error {
	n, err := parseBytes("pcap-max-bytes", maxBytes)
	if err != nil {
		return err
	}
	o.pcap.MaxBytes = int64(n)
	if err := o.pcap.Validate(); err != nil {
		return fmt.Errorf("--pcap-*: %w", err)
	}
	if o.pcapTap != "" && filepath.Clean(o.pcapTap) == filepath.Clean(o.pcapPort) {
		return fmt.Errorf("--pcap-tap and --pcap-port are both %q: each side needs its own file", o.pcapTap)
	}
	return nil
}

// timerFlush is --gro-flush for a port: auto is the timer on vhost-user and the batch
// flush on every other port. The vhost-user worker writes everything it holds before
// it waits (vhostnet/gro.go, endBatch), so its timer only lets aggregates span TX
// batches while the guest keeps sending; a socket port's timer holds across reads
// even when nothing more arrives, which costs a lone datagram the whole interval at
// each coalescing hop (docs/offloads.md, "Flush policy", has both measured).
func (o *options) timerFlush(vhostUser bool) bool {
	if o.groFlush == "auto" {
		return vhostUser
	}
	return o.groFlush == "timer"
}

// parseTapFDs reads --tap-fd: descriptors 3 and up (0-2 are stdio), no repeats.
func parseTapFDs(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 3 {
			return nil, fmt.Errorf("--tap-fd %q: want descriptor numbers of 3 or more, comma-separated", v)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("--tap-fd %q: fd %d given twice", v, n)
		}
		out = append(out, n)
	}
	return out, nil
}

// vhostConvention reads the port from --netdev, or from QEMU's back-end program
// conventions for vhost-user (docs/interop/vhost-user.rst "Backend program
// conventions"): --socket-path=PATH, or --fd=N, a socket a manager passed, which
// openVhost looks at. They name the same thing as --netdev, so only one may be given.
func vhostConvention(netdevArg, socketPath string, fd int) (netdev.Spec, error) {
	given := 0
	for _, set := range []bool{netdevArg != "", socketPath != "", fd >= 0} {
		if set {
			given++
		}
	}
	switch {
	case given == 0:
		return netdev.Spec{}, errors.New("--netdev is required (for vhost-user, --socket-path or --fd will do)")
	case given > 1:
		return netdev.Spec{}, errors.New("--netdev, --socket-path and --fd each name the port: give one of them")
	case socketPath != "":
		return netdev.ParseSpec("vhost-user,path=" + socketPath)
	case fd >= 0:
		if fd <= 2 {
			return netdev.Spec{}, fmt.Errorf("--fd %d: want a descriptor above stdio", fd)
		}
		return netdev.Spec{Backend: netdev.BackendVhostUser, Role: netdev.RoleServer,
			Local: netdev.Addr{Type: netdev.AddrFD, FD: fd}}, nil
	}
	return netdev.ParseSpec(netdevArg)
}
