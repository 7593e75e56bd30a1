// Package main is the benchtool command. It measures tapgro beside the kernel's own path and beside a naive relay,
// in one run and one topology family, and writes docs/benchmarks/BENCHMARKS.md plus a bar chart.
// Run it from the repository's root, where the default paths point.
//
//	go run ./integration/benchtool [-t 5] [-r 3] [-mtu 1500] [-out docs/benchmarks/BENCHMARKS.md] [-png docs/benchmarks/BENCHMARKS.png]
//
// Topology (root; two network namespaces it creates and deletes):
//
//	ns guest: 198.18.0.2 ─ tg0 ─ relay ══ stream (unix) ══ relay ─ tg0 ─ 198.18.0.1 :ns host
//
// where "relay" is tapgro (with the settings the row names) or the naive frame-at-a-time
// relay, and the "veth" row joins the two namespaces with a veth pair (the kernel ceiling).
// The TAP-to-TAP rows are one process (gsorelay) holding both TAPs with no stream
// between: the floor of what any TAP relay pays per frame, with the read and the write of
// a frame on one thread, or on two (-split), the references for the vnet-hdr=on rows.
// The vhost-user row is tapgro --netdev vhost-user on the host side and, on the guest
// side, the bench front-end (integration/vhostrelay): it maps its own memfd guest RAM,
// connects to tapgro's socket as QEMU would and relays between the rings and a TAP of
// its own, so GSO frames cross whole both ways; two processes and two TAP copies, as
// the two-thread relay, which is its ceiling. Its variants: "guest TSO off" (the
// front-end's TAP without TSO, so the TX ring carries MTU segments; tapgro's GRO on vs
// off, guest -> host), "TAP offloads off" (tapgro --offload off, so its TAP hands MTU
// frames; RSC, switched by --gro, on vs off, host -> guest) and "2 queue pairs" (tapgro
// queues=2 and the front-end with two pairs and a two-queue TAP; see the 4-stream table).
// The guest side is emulated the way the issue asks: its TAP keeps TSO on and its tapgro
// segments in software, so the stream carries exactly the MTU frames a QEMU guest behind
// -netdev stream would send, without a per-frame TAP read capping the sender.
//
// Each test runs -r times per direction; tables show median, min, max, the ratio of the
// median to the first row's, and for TCP the CPU seconds each relay process used per GB
// moved (utime+stime from /proc/PID/stat).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

type relayKind int

const (
	kindVeth relayKind = iota
	kindNaive
	kindTapgro
	kindGSORelay
	kindVhostUser
)

type caseDef struct {
	name string
	kind relayKind
	args []string // extra tapgro flags
}

var cases = []caseDef{
	{"veth pair (kernel ceiling)", kindVeth, nil},
	{"naive relay (frame at a time, no vnet hdr)", kindNaive, nil},
	{"tapgro GRO on (batch flush), offload auto", kindTapgro, []string{"--gro-flush", "batch"}},
	{"tapgro GRO off, offload auto", kindTapgro, []string{"--gro", "off"}},
	{"tapgro GRO on (batch flush), offload off", kindTapgro, []string{"--offload", "off", "--gro-flush", "batch"}},
	{"tapgro GRO off, offload off", kindTapgro, []string{"--gro", "off", "--offload", "off"}},
	{"tapgro GRO on, timer flush 50us", kindTapgro, []string{"--gro-flush", "timer"}},
	{vnetRow, kindTapgro, nil},
	{vnetSocketRow, kindTapgro, nil},
	{gsoRelayRow, kindGSORelay, nil},
	{gsoSplitRow, kindGSORelay, []string{"-split"}},
	{vhostUserRow, kindVhostUser, nil},
	// Guest TSO off: the front-end's TAP reads MTU frames (CSUM only) and puts them on
	// the TX ring as MTU segments, HOST_TSO4/6 still acked (a Linux guest after ethtool
	// -K tso off); tapgro's GRO toward its TAP coalesces them or (off) writes each one.
	// Guest -> host is the direction it changes.
	{vhostGuestTSOOffGROOn, kindVhostUser, []string{"--gro", "on"}},
	{vhostGuestTSOOffGROOff, kindVhostUser, []string{"--gro", "off"}},
	// TAP offloads off: tapgro's TAP reads MTU frames; RSC (--gro on) coalesces them
	// into GSO packets in the guest's buffers, or (off) each goes in as it came, and
	// the front-end writes what it gets to its TAP as is. Host -> guest is the direction.
	{vhostTAPOffRSCOn, kindVhostUser, []string{"--offload", "off", "--gro", "on"}},
	{vhostTAPOffRSCOff, kindVhostUser, []string{"--offload", "off", "--gro", "off"}},
	// Two queue pairs on both sides (tapgro queues=2, front-end -queues 2, its TAP
	// multi-queue); compare with the plain row in the 4-stream table, where the kernel
	// spreads the flows over the queues.
	{vhostTwoQueues, kindVhostUser, nil},
	// The front-end logs as QEMU does while it migrates (vhostrelay -log: LOG_ALL, the
	// rings flagged, the log collected every 100 ms): tapgro marks every receive buffer
	// and used-ring write. Compare with the plain row: the cost of logging.
	{vhostMigrationLog, kindVhostUser, nil},
	// The front-end posts receive buffers of 68 KiB instead of a page, so every frame the
	// TAP hands over fits one chain of one descriptor, like the two-thread relay's one
	// buffer; a Linux guest's mergeable buffers are at most a page
	// (drivers/net/virtio_net.c get_mergeable_buf_len), so a 64 KiB frame takes 17 chains.
	// Host -> guest is the direction it changes; compare with the plain row.
	{vhostBigRXBuf, kindVhostUser, nil},
}

// vnetRow joins the two tapgro with the vnet-hdr=on stream (tapgro to tapgro only):
// GSO frames cross whole instead of being split and coalesced again, through the
// shared-memory rings two tapgro on one host set up. vnetSocketRow is the same with
// shm=off, every frame crossing the socket (as between hosts).
const (
	vnetRow       = "tapgro vnet-hdr=on (GSO passthrough, shared memory)"
	vnetSocketRow = "tapgro vnet-hdr=on,shm=off (GSO passthrough over the socket)"
	gsoRelayRow   = "TAP-to-TAP relay, one process, GSO passthrough (no socket)"
	gsoSplitRow   = "TAP-to-TAP relay, reader and writer threads (no socket)"
	vhostUserRow  = "tapgro vhost-user (bench front-end relaying to a TAP)"

	vhostGuestTSOOffGROOn  = "tapgro vhost-user, guest TSO off, GRO on"
	vhostGuestTSOOffGROOff = "tapgro vhost-user, guest TSO off, GRO off"
	vhostTAPOffRSCOn       = "tapgro vhost-user, TAP offloads off, RSC on"
	vhostTAPOffRSCOff      = "tapgro vhost-user, TAP offloads off, RSC off"
	vhostTwoQueues         = "tapgro vhost-user, 2 queue pairs"
	vhostMigrationLog      = "tapgro vhost-user, migration dirty logging on"
	vhostBigRXBuf          = "tapgro vhost-user, guest RX buffers of 68 KiB (a frame per chain)"
)

// netdevSuffix is appended to both tapgro --netdev specs of a row (vhost-user rows: to
// the one tapgro's).
var netdevSuffix = map[string]string{vnetRow: ",vnet-hdr=on", vnetSocketRow: ",vnet-hdr=on,shm=off", vhostTwoQueues: ",queues=2"}

// frontEndArgs are a vhost-user row's extra bench front-end (vhostrelay) flags; its
// args are tapgro's.
var frontEndArgs = map[string][]string{
	vhostGuestTSOOffGROOn:  {"-tso=false"},
	vhostGuestTSOOffGROOff: {"-tso=false"},
	vhostTwoQueues:         {"-queues", "2"},
	vhostMigrationLog:      {"-log"},
	vhostBigRXBuf:          {"-rx-buf", "69632"},
}

type testDef struct {
	name  string
	unit  string
	tcp   bool // CPU per GB is meaningful
	run   func(b *bench, dir direction) (float64, error)
	lower bool // lower is better (latency)
}

type direction struct {
	name           string
	client, server string // namespaces
	dst            string
}

type bench struct {
	secs, reps, mtu int
	work            string
	tapgro, naive   string
	gsorelay        string
	vhostrelay      string
	udpbulk         string // static, for the guest too
	nsGuest, nsHost string
	procs           []*exec.Cmd
	relayPIDs       map[string]int // "host"/"guest" -> pid
	selection       string         // the -cases/-tests/-qemu-cases flags given, for the report
	self            string         // this binary, re-run as the ping-pong client
	rr              []rrRow        // the QEMU ping-pong rows (-qemu-rr)
	calls           uint64         // the last QEMU vhost-user run's calls to the guest
	perfDir         string         // -perf: where profiles go ("" off)
	trace           bool           // -trace: tracepoint counts in the guest matrix (trace.go)
	before          string         // -before: a second tapgro binary for the guest matrix ("" none)
	tpShared        bool           // -testpmd-shared: testpmd's main lcore on CPU 0 with ping and tapgro
	log             *bufio.Writer
}

func main() {
	b := &bench{}
	flag.IntVar(&b.secs, "t", 5, "seconds per iperf3 run")
	flag.IntVar(&b.reps, "r", 3, "runs per row")
	flag.IntVar(&b.mtu, "mtu", 1500, "MTU on every link")
	out := flag.String("out", "docs/benchmarks/BENCHMARKS.md", "markdown report")
	png := flag.String("png", "docs/benchmarks/BENCHMARKS.png", "bar chart (TCP bulk medians)")
	only := flag.String("cases", "", "comma-separated case numbers to run (default all; none: only the QEMU rows)")
	onlyTests := flag.String("tests", "", "comma-separated test numbers to run: 0 TCP 1 stream, 1 TCP 4 streams, 2 UDP 64 B, 3 ping RTT, 4 UDP 1-byte RTT (default all)")
	withQEMU := flag.Bool("qemu", true, "add TCP rows for a real QEMU guest under TCG (needs qemu-system-x86_64)")
	onlyQEMU := flag.String("qemu-cases", "", "comma-separated QEMU case numbers to run (default all, none)")
	replot := flag.Bool("replot", false, "only redraw -png from the TCP 1-stream tables of an existing -out report")
	withRR := flag.Bool("qemu-rr", true, "with the QEMU vhost-user rows: also 1-byte TCP ping-pong host -> guest (p50/p99)")
	rrAddr := flag.String("rr-client", "", "internal: be the ping-pong client of ADDR")
	rrN := flag.Int("rr-rounds", rrRounds, "internal: round trips for -rr-client and -udp-rr-client")
	udpEchoAddr := flag.String("udp-echo", "", "internal: echo UDP datagrams on ADDR")
	udpRRAddr := flag.String("udp-rr-client", "", "internal: be the UDP ping-pong client of ADDR")
	guests := flag.Bool("guests", false, "only the QEMU guest matrix (tapgro vhost-user and QEMU's TAP back-end, each guest flavour): writes -guests-out")
	guestsOut := flag.String("guests-out", "docs/benchmarks/GUESTS.md", "the guest matrix's markdown report")
	guestFlavourList := flag.String("guest-flavours", "", "comma-separated guest flavours for -guests (default all)")
	flag.BoolVar(&b.trace, "trace", false, "with -guests: count system calls, context switches and wake-ups per GB in the TCP tests, tapgro's threads and QEMU's other than the vCPU (needs perf and tracefs)")
	tpmd := flag.Bool("testpmd", false, "only the ping latency table through tapgro's vhost-user port with dpdk-testpmd as the front-end, beside testpmd alone and a veth pair: writes -testpmd-out")
	tpmdOut := flag.String("testpmd-out", "docs/benchmarks/LATENCY.md", "the -testpmd markdown report")
	var tpmdArgs tpArgs
	flag.Var(&tpmdArgs, "testpmd-tapgro-args", "extra tapgro flags for an additional 'through tapgro' row, e.g. --vhost-poll 50us (repeat the flag or separate with ';' for several rows)")
	flag.BoolVar(&b.tpShared, "testpmd-shared", false, "with -testpmd: testpmd's main lcore (which runs net_tap's SIGIO handler) on CPU 0 beside ping and tapgro instead of on CPU 1 with its forwarding lcore")
	flag.StringVar(&b.before, "before", "", "with -guests or -testpmd: also run tapgro vhost-user rows from the tapgro binary at PATH (built from an earlier commit), alternating with this tree's, for before/after tables")
	flag.StringVar(&b.perfDir, "perf", "", "during the first run of each TCP row, perf record -g each relay into DIR and write DIR/*.txt summaries (needs perf)")
	flag.Parse()
	if *rrAddr != "" {
		if err := rrClient(*rrAddr, *rrN); err != nil {
			fatal("%v", err)
		}
		return
	}
	if *udpEchoAddr != "" {
		fatal("%v", udpEcho(*udpEchoAddr))
	}
	if *udpRRAddr != "" {
		if err := udpRRClient(*udpRRAddr, *rrN); err != nil {
			fatal("%v", err)
		}
		return
	}
	if *replot {
		if err := replotFrom(*out, *png); err != nil {
			fatal("%v", err)
		}
		return
	}
	if os.Geteuid() != 0 {
		fatal("needs root (network namespaces and TAP devices)")
	}
	if *tpmd {
		if err := testpmdReady(); err != nil {
			fatal("%v", err)
		}
	}
	for _, tool := range []string{"ip", "iperf3", "ping", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			fatal("needs %s on the PATH", tool)
		}
	}
	var err error
	if b.self, err = os.Executable(); err != nil {
		fatal("%v", err)
	}
	if b.work, err = os.MkdirTemp("", "tapgro-benchtool-"); err != nil {
		fatal("%v", err)
	}
	defer os.RemoveAll(b.work)
	b.tapgro = filepath.Join(b.work, "tapgro")
	b.naive = filepath.Join(b.work, "naiverelay")
	b.gsorelay = filepath.Join(b.work, "gsorelay")
	b.vhostrelay = filepath.Join(b.work, "vhostrelay")
	for bin, pkg := range map[string]string{b.tapgro: "tapgro", b.naive: "tapgro/integration/naiverelay", b.gsorelay: "tapgro/integration/gsorelay",
		b.vhostrelay: "tapgro/integration/vhostrelay"} {
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			fatal("go build %s: %v\n%s", pkg, err, out)
		}
	}
	b.udpbulk = filepath.Join(b.work, "udpbulk")
	ub := exec.Command("go", "build", "-o", b.udpbulk, "tapgro/integration/udpbulk")
	ub.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := ub.CombinedOutput(); err != nil {
		fatal("go build udpbulk: %v\n%s", err, out)
	}
	tag := strconv.Itoa(os.Getpid())
	b.nsGuest, b.nsHost = "tapgro-bench-"+tag+"-guest", "tapgro-bench-"+tag+"-host"
	defer b.teardown()

	if *tpmd {
		err := b.runTestpmd(tpmdArgs, *tpmdOut)
		os.RemoveAll(b.work) // fatal skips the deferred one
		if err != nil {
			fatal("%v", err)
		}
		return
	}
	if *guests {
		if b.before != "" {
			if b.before, err = filepath.Abs(b.before); err == nil {
				_, err = os.Stat(b.before)
			}
			if err != nil {
				fatal("-before: %v", err)
			}
		}
		if b.trace {
			if err := traceReady(); err != nil {
				fatal("%v", err)
			}
		}
		fl, err := b.guestFlavours(*guestFlavourList)
		if err != nil {
			fatal("%v", err)
		}
		if err := b.runGuestMatrix(fl, *guestsOut); err != nil {
			fatal("%v", err)
		}
		return
	}
	for _, f := range []struct{ name, v string }{{"cases", *only}, {"tests", *onlyTests}, {"qemu-cases", *onlyQEMU}} {
		if f.v != "" {
			b.selection += " -" + f.name + " " + f.v
		}
	}
	if !*withQEMU {
		b.selection += " -qemu=false"
	}
	sel := pick("-cases", *only, cases)
	qsel := pick("-qemu-cases", *onlyQEMU, qemuCases)
	dirs := []direction{
		{"guest -> host", b.nsGuest, b.nsHost, "198.18.0.1"},
		{"host -> guest", b.nsHost, b.nsGuest, "198.18.0.2"},
	}
	tests := []testDef{
		{name: tcp1, unit: "Gbit/s", tcp: true, run: func(b *bench, d direction) (float64, error) { return b.iperfTCP(d, 1) }},
		{name: "TCP bulk, 4 streams", unit: "Gbit/s", tcp: true, run: func(b *bench, d direction) (float64, error) { return b.iperfTCP(d, 4) }},
		{name: "UDP 64-byte datagrams", unit: "kpps", run: (*bench).iperfUDP64},
		{name: "request/response latency (ping RTT)", unit: "µs", run: (*bench).pingRTT, lower: true},
		{name: "UDP request/response latency (1-byte datagrams, median RTT)", unit: "µs", run: (*bench).udpRR, lower: true},
	}
	tests = pick("-tests", *onlyTests, tests)
	res := map[string]map[string]map[string]*row{} // test -> dir -> case
	for _, c := range sel {
		fmt.Fprintf(os.Stderr, "== %s\n", c.name)
		for _, t := range tests {
			for _, d := range dirs {
				r := &row{}
				if err := b.setup(c); err != nil {
					r.err = err
				}
				cpu0 := b.cpu()
				for i := 0; i < b.reps && r.err == nil; i++ {
					var prof func()
					if i == 0 && t.tcp && b.perfDir != "" && c.kind != kindVeth {
						prof = b.profile(c.name + " " + t.name + " " + d.name)
					}
					v, err := t.run(b, d)
					if prof != nil {
						prof()
					}
					if err != nil {
						r.err = fmt.Errorf("run %d: %w", i+1, err)
						break
					}
					r.vals = append(r.vals, v)
				}
				if r.err == nil {
					r.err = b.relaysAlive()
				}
				if r.err == nil && t.tcp && c.kind != kindVeth {
					gb := 0.0
					for _, v := range r.vals {
						gb += v * float64(b.secs) / 8
					}
					cpu1 := b.cpu()
					if _, ok := cpu1["guest"]; ok {
						r.cpu = fmt.Sprintf("%.2f / %.2f", (cpu1["host"]-cpu0["host"])/gb, (cpu1["guest"]-cpu0["guest"])/gb)
					} else {
						r.cpu = fmt.Sprintf("%.2f (one process)", (cpu1["host"]-cpu0["host"])/gb)
					}
				}
				if r.err != nil {
					fmt.Fprintf(os.Stderr, "   %-38s %-14s FAILED: %v\n", t.name, d.name, r.err)
				} else {
					cpu := ""
					if r.cpu != "" {
						cpu = ", CPU s/GB " + r.cpu
					}
					fmt.Fprintf(os.Stderr, "   %-38s %-14s %v %s%s\n", t.name, d.name, fmtVals(r.vals), t.unit, cpu)
				}
				if res[t.name] == nil {
					res[t.name] = map[string]map[string]*row{}
				}
				if res[t.name][d.name] == nil {
					res[t.name][d.name] = map[string]*row{}
				}
				res[t.name][d.name][c.name] = r
				b.teardown()
			}
		}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); *withQEMU && err == nil && len(qsel) > 0 {
		if tests[0].name != tcp1 {
			fatal("the QEMU rows go in the %q table: include test 0 in -tests or give -qemu=false", tcp1)
		}
		kernel, initrd, err := guestImage("bookworm")
		if err != nil {
			fatal("%v", err)
		}
		for _, c := range qsel {
			fmt.Fprintf(os.Stderr, "== %s\n", c.name)
			for _, d := range dirs {
				r := &row{}
				var cpu, gb float64
				var calls uint64
				for i := 0; i < b.reps; i++ {
					v, used, err := b.qemuTCP(c, kernel, initrd, d.client == b.nsHost)
					if err != nil {
						r.err = fmt.Errorf("run %d: %w", i+1, err)
						break
					}
					r.vals = append(r.vals, v)
					cpu += used
					calls += b.calls
					gb += v * float64(b.secs) / 8
				}
				if r.err != nil {
					fmt.Fprintf(os.Stderr, "   %-38s %-14s FAILED: %v\n", tcp1, d.name, r.err)
				} else {
					r.cpu = fmt.Sprintf("%.2f (tapgro)", cpu/gb)
					if c.kind == kindVhostUser {
						// Interrupts to the guest, both rings, over the whole run.
						r.cpu += fmt.Sprintf("; %.0f calls/GB", float64(calls)/gb)
					}
					fmt.Fprintf(os.Stderr, "   %-38s %-14s %v Gbit/s, CPU s/GB %s\n", tcp1, d.name, fmtVals(r.vals), r.cpu)
				}
				if res[tcp1] == nil {
					res[tcp1] = map[string]map[string]*row{}
				}
				if res[tcp1][d.name] == nil {
					res[tcp1][d.name] = map[string]*row{}
				}
				res[tcp1][d.name][c.name] = r
			}
			if *withRR && c.kind == kindVhostUser {
				r := rrRow{name: c.name}
				for i := 0; i < b.reps && r.err == nil; i++ {
					v, err := b.qemuRR(c, kernel, initrd)
					if err != nil {
						r.err = fmt.Errorf("run %d: %w", i+1, err)
					}
					r.rtts = append(r.rtts, v...)
					r.calls += b.calls
				}
				if r.err != nil {
					fmt.Fprintf(os.Stderr, "   %-38s FAILED: %v\n", "1-byte ping-pong", r.err)
				} else {
					fmt.Fprintf(os.Stderr, "   %-38s p50 %.0f µs, p99 %.0f µs\n", "1-byte ping-pong", r.pct(50), r.pct(99))
				}
				b.rr = append(b.rr, r)
			}
			sel = append(sel, c)
		}
	}
	if err := b.report(*out, *png, sel, tests, dirs, res); err != nil {
		fatal("%v", err)
	}
}

// tcp1 is the test whose table also holds the QEMU rows, and the chart's.
const tcp1 = "TCP bulk, 1 stream"

// pick selects items by the comma-separated indices in list (all if list is empty, none
// if it is "none").
func pick[T any](flagName, list string, items []T) []T {
	if list == "" {
		return items
	}
	var out []T
	if list == "none" {
		return out
	}
	for _, s := range strings.Split(list, ",") {
		i, err := strconv.Atoi(s)
		if err != nil || i < 0 || i >= len(items) {
			fatal("%s: %q is not a number 0..%d", flagName, s, len(items)-1)
		}
		out = append(out, items[i])
	}
	return out
}

func fatal(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "benchtool: "+f+"\n", a...)
	os.Exit(1)
}
