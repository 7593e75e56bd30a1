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
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"tapgro/iperfns"
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
	nsGuest, nsHost string
	procs           []*exec.Cmd
	relayPIDs       map[string]int // "host"/"guest" -> pid
	selection       string         // the -cases/-tests/-qemu-cases flags given, for the report
	self            string         // this binary, re-run as the ping-pong client
	rr              []rrRow        // the QEMU ping-pong rows (-qemu-rr)
	calls           uint64         // the last QEMU vhost-user run's calls to the guest
	perfDir         string         // -perf: where profiles go ("" off)
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
	tag := strconv.Itoa(os.Getpid())
	b.nsGuest, b.nsHost = "tapgro-bench-"+tag+"-guest", "tapgro-bench-"+tag+"-host"
	defer b.teardown()

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
		kernel, initrd, err := guestImage(b.work)
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

// profile starts perf record -g on every relay for the coming run and returns the
// function that waits for it and writes a summary per relay: the top symbols by self
// time, and by time including callees.
func (b *bench) profile(label string) func() {
	os.MkdirAll(b.perfDir, 0o755)
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return '_'
	}, label)
	var cmds []*exec.Cmd
	var outs []string
	for role, pid := range b.relayPIDs {
		data := filepath.Join(b.perfDir, base+"-"+role+".data")
		cmd := exec.Command("perf", "record", "-g", "-q", "-o", data, "-p", strconv.Itoa(pid), "--", "sleep", strconv.Itoa(max(1, b.secs-1)))
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "   perf: %v\n", err)
			continue
		}
		cmds, outs = append(cmds, cmd), append(outs, data)
	}
	return func() {
		for i, cmd := range cmds {
			cmd.Wait()
			var sum bytes.Buffer
			fmt.Fprintf(&sum, "# %s (%s)\n\n## self\n", label, filepath.Base(outs[i]))
			self, _ := exec.Command("perf", "report", "-i", outs[i], "--stdio", "--no-children", "-g", "none", "--percent-limit", "1").Output()
			sum.Write(self)
			fmt.Fprintf(&sum, "\n## children\n")
			children, _ := exec.Command("perf", "report", "-i", outs[i], "--stdio", "--children", "-g", "none", "--percent-limit", "4").Output()
			sum.Write(children)
			os.WriteFile(strings.TrimSuffix(outs[i], ".data")+".txt", sum.Bytes(), 0o644)
		}
	}
}

// rrRow is one QEMU case's ping-pong round trips, all runs together.
type rrRow struct {
	name  string
	rtts  []float64 // µs
	calls uint64    // calls to the guest over the runs (boot included)
	err   error
}

func (r *rrRow) pct(p float64) float64 {
	v := append([]float64(nil), r.rtts...)
	sort.Float64s(v)
	return v[min(len(v)-1, int(float64(len(v))*p/100))]
}

func (r *rrRow) mean() float64 {
	t := 0.0
	for _, x := range r.rtts {
		t += x
	}
	return t / float64(len(r.rtts))
}

// row is one case's measurements in one test and direction. A row that failed keeps
// its error and is reported as failed, never as a number.
type row struct {
	vals []float64
	cpu  string
	err  error
}

func (r *row) stats() (med, lo, hi float64) {
	v := append([]float64(nil), r.vals...)
	sort.Float64s(v)
	n := len(v)
	med = v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return med, v[0], v[n-1]
}

func fmtVals(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return "[" + strings.Join(s, " ") + "]"
}

func fatal(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "benchtool: "+f+"\n", a...)
	os.Exit(1)
}

func run(args ...string) error {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (b *bench) setup(c caseDef) error {
	b.relayPIDs = map[string]int{}
	for _, ns := range []string{b.nsGuest, b.nsHost} {
		exec.Command("ip", "netns", "del", ns).Run()
		if err := run("ip", "netns", "add", ns); err != nil {
			return err
		}
		run("ip", "-n", ns, "link", "set", "lo", "up")
	}
	mtu := strconv.Itoa(b.mtu)
	sock := filepath.Join(b.work, "s.sock")
	os.Remove(sock)
	switch c.kind {
	case kindVeth:
		if err := run("ip", "link", "add", "vb0", "netns", b.nsHost, "mtu", mtu, "type", "veth", "peer", "name", "vb1", "netns", b.nsGuest, "mtu", mtu); err != nil {
			return err
		}
		for _, a := range [][]string{
			{"ip", "-n", b.nsHost, "addr", "add", "198.18.0.1/24", "dev", "vb0"},
			{"ip", "-n", b.nsGuest, "addr", "add", "198.18.0.2/24", "dev", "vb1"},
			{"ip", "-n", b.nsHost, "link", "set", "vb0", "up"},
			{"ip", "-n", b.nsGuest, "link", "set", "vb1", "up"},
		} {
			if err := run(a...); err != nil {
				return err
			}
		}
	case kindNaive:
		b.start("host", b.nsHost, b.naive, "-tap", "tg0", "-addr", "198.18.0.1/24", "-mtu", mtu, "-listen", sock)
		time.Sleep(300 * time.Millisecond)
		b.start("guest", b.nsGuest, b.naive, "-tap", "tg0", "-addr", "198.18.0.2/24", "-mtu", mtu, "-connect", sock)
	case kindTapgro:
		// Both TAPs are tg0: without --ctl-socket "" the two would race for /run/tapgro/tg0.ctl.
		common := append([]string{"--tap", "tg0", "--mtu", mtu, "--log-level", "warn", "--ctl-socket", ""}, c.args...)
		sfx := netdevSuffix[c.name]
		b.start("host", b.nsHost, b.tapgro, append([]string{"--addr", "198.18.0.1/24", "--netdev", "stream,server=on,addr.type=unix,addr.path=" + sock + sfx}, common...)...)
		time.Sleep(300 * time.Millisecond)
		b.start("guest", b.nsGuest, b.tapgro, append([]string{"--addr", "198.18.0.2/24", "--netdev", "stream,server=off,addr.type=unix,addr.path=" + sock + sfx}, common...)...)
	case kindGSORelay:
		// One process for both sides: its CPU is reported as the host side's.
		b.start("host", "", b.gsorelay, append([]string{"-a", b.nsGuest, "-a-addr", "198.18.0.2/24", "-b", b.nsHost, "-b-addr", "198.18.0.1/24", "-mtu", mtu}, c.args...)...)
	case kindVhostUser:
		// tapgro is the host side; the front-end, in the guest namespace, waits for the
		// socket (tapgro binds it once tg0 is up) and connects.
		vsock := filepath.Join(b.work, "vu.sock")
		os.Remove(vsock)
		b.start("host", b.nsHost, b.tapgro, append([]string{"--tap", "tg0", "--mtu", mtu, "--addr", "198.18.0.1/24", "--log-level", "warn",
			"--netdev", "vhost-user,path=" + vsock + netdevSuffix[c.name]}, c.args...)...)
		b.start("guest", b.nsGuest, b.vhostrelay, append([]string{"-connect", vsock, "-tap", "vr0", "-addr", "198.18.0.2/24", "-mtu", mtu}, frontEndArgs[c.name]...)...)
	}
	deadline := time.Now().Add(15 * time.Second)
	for exec.Command("ip", "netns", "exec", b.nsGuest, "ping", "-c", "1", "-W", "1", "198.18.0.1").Run() != nil {
		if time.Now().After(deadline) {
			if err := b.relaysAlive(); err != nil {
				return fmt.Errorf("no ping across %s after 15 s: %w", c.name, err)
			}
			return fmt.Errorf("no ping across %s after 15 s", c.name)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// relaysAlive fails if a relay process of the row has exited: its row's numbers (and
// its CPU) would not be what the row names.
func (b *bench) relaysAlive() error {
	for role, pid := range b.relayPIDs {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if i := bytes.LastIndexByte(data, ')'); err != nil || i < 0 || i+2 >= len(data) || data[i+2] == 'Z' {
			return fmt.Errorf("the %s-side relay (pid %d) exited", role, pid)
		}
	}
	return nil
}

// start runs bin in namespace ns ("": in tapgro's own).
func (b *bench) start(role, ns, bin string, args ...string) {
	cmd := exec.Command(bin, args...)
	if ns != "" {
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, bin}, args...)...)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		fatal("start %s: %v", bin, err)
	}
	b.procs = append(b.procs, cmd)
	b.relayPIDs[role] = cmd.Process.Pid // ip netns exec execs in place
}

// teardown stops the row's processes (SIGTERM, so tapgro and vhostrelay print their
// exit counters; SIGKILL after 3 s) and deletes the namespaces. Last started first: the
// connecting side goes before the listening one, so that no client reconnects to a
// server that is shutting down.
func (b *bench) teardown() {
	for i := len(b.procs) - 1; i >= 0; i-- {
		p := b.procs[i]
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			p.Process.Kill()
			<-done
		}
	}
	b.procs = nil
	for _, ns := range []string{b.nsGuest, b.nsHost} {
		exec.Command("ip", "netns", "del", ns).Run()
	}
}

// cpu returns utime+stime in seconds of each relay process.
func (b *bench) cpu() map[string]float64 {
	out := map[string]float64{}
	for role, pid := range b.relayPIDs {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command name; utime and stime are 14 and 15.
		f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		out[role] = (ut + st) / 100 // USER_HZ is 100 on Linux
	}
	return out
}

func (b *bench) iperf(d direction, args ...string) ([]byte, error) {
	return iperfns.Run(d.server, d.client, d.dst, args...)
}

func (b *bench) iperfTCP(d direction, streams int) (float64, error) {
	out, err := b.iperf(d, "-t", strconv.Itoa(b.secs), "-P", strconv.Itoa(streams))
	if err != nil {
		return 0, err
	}
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, err
	}
	if r.Error != "" || r.End.SumReceived.BitsPerSecond == 0 {
		return 0, fmt.Errorf("iperf3 reported no throughput (error %q)", r.Error)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, nil
}

// iperfUDP64 returns thousands of 64-byte datagrams per second that arrived.
func (b *bench) iperfUDP64(d direction) (float64, error) {
	out, err := b.iperf(d, "-u", "-l", "64", "-b", "0", "-t", strconv.Itoa(b.secs))
	if err != nil {
		return 0, err
	}
	var r struct {
		End struct {
			Sum struct {
				Packets     float64 `json:"packets"`
				LostPackets float64 `json:"lost_packets"`
				Seconds     float64 `json:"seconds"`
			} `json:"sum"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, err
	}
	if r.End.Sum.Seconds == 0 {
		return 0, fmt.Errorf("iperf3 UDP: no summary")
	}
	return (r.End.Sum.Packets - r.End.Sum.LostPackets) / r.End.Sum.Seconds / 1e3, nil
}

var rttRe = regexp.MustCompile(`= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms`)

// pingRTT returns the mean round-trip time of 200 pings 5 ms apart, in µs: one small
// request and its answer crossing both relays each way.
func (b *bench) pingRTT(d direction) (float64, error) {
	out, err := exec.Command("ip", "netns", "exec", d.client, "ping", "-q", "-c", "200", "-i", "0.005", d.dst).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ping: %v: %s", err, out)
	}
	m := rttRe.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("ping output: %s", out)
	}
	avg, _ := strconv.ParseFloat(string(m[2]), 64)
	return avg * 1000, nil
}

func (b *bench) report(path, pngPath string, sel []caseDef, tests []testDef, dirs []direction, res map[string]map[string]map[string]*row) error {
	var w bytes.Buffer
	host, _ := os.Hostname()
	fmt.Fprintf(&w, "# tapgro benchmarks\n\n")
	fmt.Fprintf(&w, "Generated by `go run ./integration/benchtool -t %d -r %d -mtu %d%s` on %s.\n\n", b.secs, b.reps, b.mtu, b.selection, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&w, "Machine: %s, kernel %s, %d cores (%s), Go %s. Shared and noisy: compare ratios within one table, not absolutes across runs.\n\n",
		host, strings.TrimSpace(output("uname", "-r")), runtime.NumCPU(), cpuModel(), runtime.Version())
	fmt.Fprintf(&w, "Topology: two network namespaces; the relay on each side bridges a TAP (MTU %d) and a QEMU-protocol stream socket (`-netdev stream` framing over UNIX). The guest side's TAP keeps TSO on, so the stream carries the plain MTU frames a QEMU guest behind `-netdev stream` sends. The vnet-hdr=on rows use tapgro's own extension of that stream instead (headers with every frame, GSO frames whole; tapgro to tapgro only). The TAP-to-TAP rows are one process holding both TAPs, no socket: what any TAP relay pays, reading and writing each frame on one thread or (reader and writer threads) handing it from the reading thread to a writing one, as any relay with a hop between the two TAPs must. Every row: %d runs of %d s per direction; ratio = median / first row's median. CPU = seconds of CPU (user+system) per GB moved, host-side relay / guest-side relay (vhost-user row: tapgro / the bench front-end; QEMU rows: tapgro alone, over the whole guest run including boot). A row that failed says so instead of a number.\n\n", b.mtu, b.reps, b.secs)
	fmt.Fprintf(&w, "![TCP bulk throughput](%s)\n\n", filepath.Base(pngPath))
	for _, t := range tests {
		for _, d := range dirs {
			fmt.Fprintf(&w, "## %s, %s (%s)\n\n", t.name, d.name, t.unit)
			if t.tcp {
				fmt.Fprintf(&w, "| case | median | min | max | ratio | CPU s/GB |\n|---|---|---|---|---|---|\n")
			} else {
				fmt.Fprintf(&w, "| case | median | min | max | ratio |\n|---|---|---|---|---|\n")
			}
			var base float64
			for i, c := range sel {
				r := res[t.name][d.name][c.name]
				if r == nil {
					continue
				}
				if r.err != nil {
					msg := strings.ReplaceAll(strings.SplitN(r.err.Error(), "\n", 2)[0], "|", "/")
					if t.tcp {
						fmt.Fprintf(&w, "| %s | **failed**: %s | - | - | - | - |\n", c.name, msg)
					} else {
						fmt.Fprintf(&w, "| %s | **failed**: %s | - | - | - |\n", c.name, msg)
					}
					continue
				}
				med, lo, hi := r.stats()
				if i == 0 {
					base = med
				}
				ratio := "-"
				if base > 0 {
					ratio = fmt.Sprintf("%.2f", med/base)
				}
				if t.tcp {
					cpu := r.cpu
					if cpu == "" {
						cpu = "-"
					}
					fmt.Fprintf(&w, "| %s | %.2f | %.2f | %.2f | %s | %s |\n", c.name, med, lo, hi, ratio, cpu)
				} else {
					fmt.Fprintf(&w, "| %s | %.1f | %.1f | %.1f | %s |\n", c.name, med, lo, hi, ratio)
				}
			}
			fmt.Fprintln(&w)
		}
	}
	if len(b.rr) > 0 {
		fmt.Fprintf(&w, "## 1-byte TCP ping-pong, host -> QEMU guest (µs)\n\n")
		fmt.Fprintf(&w, "%d runs (one guest boot each) of %d round trips after %d unmeasured, one outstanding at a time; the guest echoes with `nc -ll -e /bin/cat`.\n\n", b.reps, rrRounds, rrWarm)
		fmt.Fprintf(&w, "| case | p50 | p90 | p99 | round trips/s (1/mean) | calls per round trip (boot included) |\n|---|---|---|---|---|---|\n")
		for _, r := range b.rr {
			if r.err != nil {
				fmt.Fprintf(&w, "| %s | **failed**: %s | - | - | - | - |\n", r.name, strings.ReplaceAll(strings.SplitN(r.err.Error(), "\n", 2)[0], "|", "/"))
				continue
			}
			fmt.Fprintf(&w, "| %s | %.0f | %.0f | %.0f | %.0f | %.2f |\n", r.name, r.pct(50), r.pct(90), r.pct(99), 1e6/r.mean(), float64(r.calls)/float64(len(r.rtts)+rrWarm*b.reps))
		}
		fmt.Fprintln(&w)
	}
	fmt.Fprintf(&w, "## Commands\n\n```\n")
	fmt.Fprintf(&w, "tapgro (host):  ip netns exec HOST  tapgro --tap tg0 --mtu %d --addr 198.18.0.1/24 --netdev stream,server=on,addr.type=unix,addr.path=S [row flags]\n", b.mtu)
	fmt.Fprintf(&w, "tapgro (guest): ip netns exec GUEST tapgro --tap tg0 --mtu %d --addr 198.18.0.2/24 --netdev stream,server=off,addr.type=unix,addr.path=S [row flags]\n", b.mtu)
	fmt.Fprintf(&w, "naive relay:    ip netns exec NS naiverelay -tap tg0 -addr ... -mtu %d -listen|-connect S\n", b.mtu)
	fmt.Fprintf(&w, "TAP-to-TAP:     gsorelay -a GUEST -a-addr 198.18.0.2/24 -b HOST -b-addr 198.18.0.1/24 -mtu %d [-split]\n", b.mtu)
	fmt.Fprintf(&w, "vhost-user:     ip netns exec HOST  tapgro --tap tg0 --mtu %d --addr 198.18.0.1/24 --netdev vhost-user,path=V\n", b.mtu)
	fmt.Fprintf(&w, "                ip netns exec GUEST vhostrelay -connect V -tap vr0 -addr 198.18.0.2/24 -mtu %d   (integration/vhostrelay)\n", b.mtu)
	fmt.Fprintf(&w, "TCP bulk:       iperf3 -c DST -J -t %d [-P 4]\n", b.secs)
	fmt.Fprintf(&w, "UDP 64 B:       iperf3 -c DST -J -u -l 64 -b 0 -t %d   (received datagrams/s)\n", b.secs)
	fmt.Fprintf(&w, "latency:        ping -q -c 200 -i 0.005 DST            (mean RTT)\n")
	fmt.Fprintf(&w, "```\n\nRow flags:\n\n")
	for _, c := range sel {
		switch {
		case c.kind == kindTapgro:
			flags := strings.Join(c.args, " ")
			if sfx := netdevSuffix[c.name]; sfx != "" {
				flags = strings.TrimSpace(flags + " --netdev ...,addr.path=S" + sfx)
			}
			fmt.Fprintf(&w, "- %s: `%s`\n", c.name, flags)
		case c.kind == kindVhostUser && (len(c.args) > 0 || len(frontEndArgs[c.name]) > 0 || netdevSuffix[c.name] != ""):
			tg := strings.Join(c.args, " ")
			if sfx := netdevSuffix[c.name]; sfx != "" {
				tg = strings.TrimSpace(tg + " --netdev vhost-user,path=V" + sfx)
			}
			fmt.Fprintf(&w, "- %s: tapgro `%s`, vhostrelay `%s`\n", c.name, tg, strings.Join(frontEndArgs[c.name], " "))
		}
	}
	if err := os.WriteFile(path, w.Bytes(), 0o644); err != nil {
		return err
	}
	var bars []bar
	for _, c := range sel {
		for _, d := range dirs {
			if r := res[tcp1][d.name][c.name]; r != nil && r.err == nil {
				med, _, _ := r.stats()
				bars = append(bars, bar{label: c.name, series: d.name, value: med})
			}
		}
	}
	return drawChart(pngPath, "TCP bulk, 1 stream: median Gbit/s ("+strconv.Itoa(b.reps)+" runs)", []string{dirs[0].name, dirs[1].name}, bars)
}

func output(name string, args ...string) string {
	out, _ := exec.Command(name, args...).Output()
	return string(out)
}

func cpuModel() string {
	data, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(l, "model name") {
			if _, v, ok := strings.Cut(l, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return "unknown CPU"
}

// replotFrom redraws the chart from a report this tool wrote: the medians of its two
// "TCP bulk, 1 stream" tables, so a change to the chart needs no new measurement.
func replotFrom(mdPath, pngPath string) error {
	md, err := os.ReadFile(mdPath)
	if err != nil {
		return err
	}
	var bars []bar
	var dirs []string
	title := ""
	for _, sec := range strings.Split(string(md), "\n## ")[1:] {
		head, body, _ := strings.Cut(sec, "\n")
		if !strings.HasPrefix(head, "TCP bulk, 1 stream, ") {
			continue
		}
		dir := strings.TrimSuffix(strings.TrimPrefix(head, "TCP bulk, 1 stream, "), " (Gbit/s)")
		dirs = append(dirs, dir)
		for _, line := range strings.Split(body, "\n") {
			f := strings.Split(line, "|")
			if len(f) < 4 || strings.TrimSpace(f[1]) == "case" || strings.HasPrefix(strings.TrimSpace(f[1]), "---") {
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(f[2]), 64)
			if err != nil {
				continue
			}
			bars = append(bars, bar{label: strings.TrimSpace(f[1]), series: dir, value: v})
		}
	}
	if len(dirs) != 2 || len(bars) == 0 {
		return fmt.Errorf("%s: no two \"TCP bulk, 1 stream\" tables to plot", mdPath)
	}
	m := regexp.MustCompile(`-r (\d+)`).FindStringSubmatch(string(md))
	if m != nil {
		title = "TCP bulk, 1 stream: median Gbit/s (" + m[1] + " runs)"
	}
	return drawChart(pngPath, title, dirs, bars)
}
