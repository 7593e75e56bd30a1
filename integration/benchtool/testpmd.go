package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// The -testpmd table: ping round trips through tapgro's vhost-user port with DPDK's
// testpmd as the front-end, beside testpmd on its own and beside a veth pair. Each row
// is two namespaces the bench creates and deletes, A (198.18.0.1, where ping runs) and
// B (198.18.0.2):
//
//	veth:            A ─ veth pair ─ B
//	testpmd alone:   A ─ TAP ══ testpmd: net_tap ⇄ net_tap ══ TAP ─ B
//	through tapgro:  A ─ tg0 ─ tapgro ══ vhost-user ══ testpmd: virtio-user ⇄ net_tap ══ TAP ─ B
//
// Why testpmd: its forwarding lcore busy-polls both ports and hands each frame over
// untouched (--forward-mode=io), so it adds almost no latency of its own and never
// sleeps on a wake-up. The TAP to B is the same in both testpmd rows, so "through
// tapgro" minus "testpmd alone" is what tapgro's two crossings (TAP to ring for the
// request, ring to TAP for the reply) cost a round trip, wake-ups included; the veth
// pair, with no user space at all, is the kernel's floor. A real guest would add its
// own driver and interrupts, which this leaves out on purpose.
//
// testpmd needs a main lcore besides the forwarding one (it exits with "No cores
// defined for forwarding" on -l 0 alone). Both lcores run on CPU 1 (--lcores 0@1,1@1):
// the forwarding lcore spins there, and the main lcore, which otherwise sleeps on
// stdin, is where the kernel sends net_tap's SIGIO (drivers/net/tap/rte_eth_tap.c:
// each TAP is O_ASYNC, the signal handler bumps tap_trigger, and pmd_rx_burst reads a
// TAP only after the trigger moved), so every frame that reaches a net_tap port waits
// for that handler to run. Everything else (ping, tapgro) is pinned to CPU 0 in every
// row: on two cores an unpinned tapgro thread that lands on the spinning CPU waits for
// a time slice, which is the scheduler's latency, not tapgro's (a trial with tapgro
// unpinned had p99s of 3 to 4 ms against about 1 ms pinned). Pinned, tapgro's runtime
// sees one CPU (GOMAXPROCS 1).
//
// -testpmd-shared puts the main lcore on CPU 0 instead (-l 0,1), the layout of the
// first LATENCY.md: there the SIGIO handler shares CPU 0 with ping and tapgro. For
// testpmd alone that CPU is idle when the signal comes (ping sleeps), so the handler
// costs nothing extra; through tapgro it queues behind tapgro's own work, and behind
// a poll window, which keeps CPU 0 busy exactly when the reply's signal arrives. The
// two layouts side by side show how much of "through tapgro minus testpmd alone" is
// that shared CPU.
//
// testpmd runs in the root namespace (its net_tap ports create their TAPs there) and
// the TAPs are moved into A and B once it has started its ports: net_tap configures
// the interface by name while it starts; after that forwarding needs only its file
// descriptor (its by-name link-status queries then fail, unseen).
// Its non-interactive mode waits for a line on stdin; the bench holds that pipe and
// closes it to stop testpmd, which then closes its ports.

// tpArgs collects -testpmd-tapgro-args: each time the flag is given, and each
// ';'-separated part of one, is a variant with its own row.
type tpArgs []string

func (a *tpArgs) String() string { return strings.Join(*a, "; ") }

func (a *tpArgs) Set(s string) error {
	for _, v := range strings.Split(s, ";") {
		if v = strings.TrimSpace(v); v != "" {
			*a = append(*a, v)
		}
	}
	return nil
}

const (
	tpPings    = 1000 // measured round trips per row and round
	tpWarm     = 20   // sent first and dropped: ARP, first-touch of rings and caches
	tpInterval = "0.005"
	tpIdle     = 5 * time.Second
	tpCPU      = "0" // every process but testpmd's forwarding lcore (CPU 1)
	tpRunDir   = "/var/run/dpdk"
)

type tpKind int

const (
	tpVeth tpKind = iota
	tpAlone
	tpTapgro
)

// tpRow is one path's results, pooled over the rounds.
type tpRow struct {
	name  string
	kind  tpKind
	bin   string   // tapgro binary (tpTapgro)
	args  []string // extra tapgro flags
	rtts  []float64
	p50s  []float64 // each round's
	sent  int       // pings over the rounds, warm-up included: what tapgro's CPU is divided by
	tgCPU float64   // tapgro's seconds over the ping runs
	idle  []float64 // tapgro, % of a core with testpmd connected and no traffic, each round
	pmd   []float64 // testpmd, % of a core over each ping run
	lost  int
	// tapgro's own counters over the ping runs (ctl status); uncounted when a round
	// could not read them (an older -before binary).
	kicks, calls, framesIn, framesOut float64
	uncounted                         bool
	features                          string // what tapgro logged the front-end acked
	err                               error
}

// testpmdReady fails when the -testpmd rows cannot run here.
func testpmdReady() error {
	if _, err := exec.LookPath("dpdk-testpmd"); err != nil {
		return fmt.Errorf("-testpmd needs dpdk-testpmd (apt-get install dpdk-dev)")
	}
	for _, tool := range []string{"taskset", "stdbuf"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("-testpmd needs %s on the PATH", tool)
		}
	}
	if runtime.NumCPU() < 2 {
		return fmt.Errorf("-testpmd needs 2 CPUs: testpmd's forwarding lcore spins on CPU 1")
	}
	return nil
}

// tpRun is what one row's round started beyond b.procs: testpmd and its files.
type tpRun struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    lockedBuffer
	done   chan struct{}
	prefix string
	sock   string
	shared bool // -testpmd-shared: the main lcore on CPU 0
}

var tpFeaturesRe = regexp.MustCompile(`features 0x[0-9a-f]+ \(([^)]*)\)`)
var tpTimeRe = regexp.MustCompile(`icmp_seq=(\d+) .*time=([\d.]+) ms`)

// runTestpmd runs b.reps rounds alternating over the rows and writes the report to path.
func (b *bench) runTestpmd(variants []string, path string) error {
	if err := testpmdReady(); err != nil {
		return err
	}
	if b.before != "" {
		var err error
		if b.before, err = filepath.Abs(b.before); err == nil {
			_, err = os.Stat(b.before)
		}
		if err != nil {
			return fmt.Errorf("-before: %v", err)
		}
	}
	tag := strconv.Itoa(os.Getpid())
	b.nsHost, b.nsGuest = "tapgro-bench-"+tag+"-a", "tapgro-bench-"+tag+"-b"
	rows := []*tpRow{
		{name: "veth pair (kernel floor)", kind: tpVeth},
		{name: "testpmd alone (net_tap ⇄ net_tap)", kind: tpAlone},
		{name: "through tapgro", kind: tpTapgro, bin: b.tapgro},
	}
	if b.before != "" {
		rows = append(rows, &tpRow{name: "through tapgro (-before binary)", kind: tpTapgro, bin: b.before})
	}
	for _, v := range variants {
		rows = append(rows, &tpRow{name: "through tapgro, " + v, kind: tpTapgro, bin: b.tapgro, args: strings.Fields(v)})
	}

	// An interrupted run would leave testpmd spinning on a core, and the namespaces.
	var cur atomic.Pointer[tpRun]
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	go func() {
		s := <-sig
		cur.Load().stop()
		b.teardown()
		os.RemoveAll(b.work)
		fatal("%v: stopped", s)
	}()

	for round := 0; round < b.reps; round++ {
		for _, r := range rows {
			if r.err != nil {
				continue
			}
			fmt.Fprintf(os.Stderr, "== round %d: %s\n", round+1, r.name)
			t := &tpRun{prefix: "tgbench" + tag, sock: filepath.Join(b.work, "tp.sock"), shared: b.tpShared}
			cur.Store(t)
			err := b.tpRound(r, t)
			t.stop()
			b.teardown()
			if err != nil {
				r.err = fmt.Errorf("round %d: %w", round+1, err)
				fmt.Fprintf(os.Stderr, "   FAILED: %v\n", r.err)
			}
		}
	}
	md := b.tpReport(rows, variants)
	fmt.Fprint(os.Stderr, md)
	return os.WriteFile(path, []byte(md), 0o644)
}

// tpRound sets up r's topology once, measures it and leaves the teardown to the caller.
func (b *bench) tpRound(r *tpRow, t *tpRun) error {
	b.relayPIDs = map[string]int{}
	mtu := strconv.Itoa(b.mtu)
	ctl := filepath.Join(b.work, "tp.ctl")
	for _, ns := range []string{b.nsHost, b.nsGuest} {
		exec.Command("ip", "netns", "del", ns).Run()
		if err := run("ip", "netns", "add", ns); err != nil {
			return err
		}
		run("ip", "-n", ns, "link", "set", "lo", "up")
		// No router solicitations, DAD or MLD reports: the idle CPU must see no traffic.
		if err := run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"); err != nil {
			return err
		}
	}
	// The TAP names live in the root namespace until moved: unique per bench process.
	tapA, tapB := "tgpa"+strconv.Itoa(os.Getpid()), "tgpb"+strconv.Itoa(os.Getpid())
	switch r.kind {
	case tpVeth:
		if err := run("ip", "link", "add", "vb0", "netns", b.nsHost, "mtu", mtu, "type", "veth", "peer", "name", "vb1", "netns", b.nsGuest, "mtu", mtu); err != nil {
			return err
		}
		if err := b.tpAddr(b.nsHost, "vb0", "198.18.0.1/24"); err != nil {
			return err
		}
		if err := b.tpAddr(b.nsGuest, "vb1", "198.18.0.2/24"); err != nil {
			return err
		}
	case tpAlone:
		if err := t.start("--vdev=net_tap0,iface="+tapA, "--vdev=net_tap1,iface="+tapB); err != nil {
			return err
		}
		b.relayPIDs["testpmd"] = t.cmd.Process.Pid
		if err := b.tpMove(tapA, b.nsHost, "198.18.0.1/24"); err != nil {
			return err
		}
		if err := b.tpMove(tapB, b.nsGuest, "198.18.0.2/24"); err != nil {
			return err
		}
	case tpTapgro:
		os.Remove(t.sock)
		log := &lockedBuffer{}
		// Info level for the one line that names the features the front-end acked.
		args := append([]string{"netns", "exec", b.nsHost, "taskset", "-c", tpCPU, r.bin, "--tap", "tg0", "--addr", "198.18.0.1/24", "--mtu", mtu,
			"--log-level", "info", "--ctl-socket", ctl, "--netdev", "vhost-user,path=" + t.sock}, r.args...)
		tg := exec.Command("ip", args...)
		tg.Stdout, tg.Stderr = log, log
		if err := tg.Start(); err != nil {
			return err
		}
		b.procs = append(b.procs, tg)
		b.relayPIDs["tapgro"] = tg.Process.Pid // ip netns exec and taskset exec in place
		for i := 0; ; i++ {
			if _, err := os.Stat(t.sock); err == nil {
				break
			}
			if i == 100 {
				return fmt.Errorf("tapgro made no socket in 10 s: %s", tail(log.String()))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err := t.start("--vdev=net_virtio_user0,path="+t.sock+",queues=1,queue_size=256", "--vdev=net_tap0,iface="+tapB); err != nil {
			return fmt.Errorf("%w; tapgro: %s", err, tail(log.String()))
		}
		b.relayPIDs["testpmd"] = t.cmd.Process.Pid
		if err := b.tpMove(tapB, b.nsGuest, "198.18.0.2/24"); err != nil {
			return err
		}
		defer func() {
			if m := tpFeaturesRe.FindStringSubmatch(log.String()); m != nil {
				r.features = m[1]
			}
		}()
	}
	deadline := time.Now().Add(15 * time.Second)
	for exec.Command("ip", "netns", "exec", b.nsHost, "ping", "-c", "1", "-W", "1", "198.18.0.2").Run() != nil {
		if time.Now().After(deadline) {
			msg := ""
			if t.cmd != nil {
				msg = "; testpmd: " + tail(t.out.String())
			}
			if err := b.relaysAlive(); err != nil {
				return fmt.Errorf("no ping across after 15 s: %w%s", err, msg)
			}
			return fmt.Errorf("no ping across after 15 s%s", msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var v0 vhostCounters
	var verr error
	if r.kind == tpTapgro {
		c0, t0 := b.cpu()["tapgro"], time.Now()
		time.Sleep(tpIdle)
		r.idle = append(r.idle, 100*(b.cpu()["tapgro"]-c0)/time.Since(t0).Seconds())
		v0, verr = readVhostCounters(r.bin, ctl)
	}
	cpu0, t0 := b.cpu(), time.Now()
	n := tpWarm + tpPings
	out, err := exec.Command("ip", "netns", "exec", b.nsHost, "taskset", "-c", tpCPU, "ping", "-n", "-c", strconv.Itoa(n), "-i", tpInterval, "198.18.0.2").CombinedOutput()
	cpu1, secs := b.cpu(), time.Since(t0).Seconds()
	if err != nil {
		return fmt.Errorf("ping: %v: %s", err, tail(string(out)))
	}
	if err := b.relaysAlive(); err != nil {
		return err
	}
	var rtts []float64
	got := 0
	for _, m := range tpTimeRe.FindAllStringSubmatch(string(out), -1) {
		got++
		if seq, _ := strconv.Atoi(m[1]); seq <= tpWarm {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		rtts = append(rtts, v*1000)
	}
	if len(rtts) < tpPings*9/10 {
		return fmt.Errorf("ping: %d of %d answered: %s", got, n, tail(string(out)))
	}
	r.lost += n - got
	r.rtts = append(r.rtts, rtts...)
	rr := rrRow{rtts: rtts}
	r.p50s = append(r.p50s, rr.pct(50))
	r.sent += n
	if _, ok := cpu0["testpmd"]; ok {
		r.pmd = append(r.pmd, 100*(cpu1["testpmd"]-cpu0["testpmd"])/secs)
	}
	line := fmt.Sprintf("   p50 %.0f µs  p99 %.0f µs  mean %.0f µs", rr.pct(50), rr.pct(99), rr.mean())
	if r.kind == tpTapgro {
		r.tgCPU += cpu1["tapgro"] - cpu0["tapgro"]
		line += fmt.Sprintf("  tapgro %.1f µs/RT, idle %.2f%%", 1e6*(cpu1["tapgro"]-cpu0["tapgro"])/float64(n), r.idle[len(r.idle)-1])
		v1, err := readVhostCounters(r.bin, ctl)
		if verr == nil && err == nil {
			r.kicks += v1.kicks - v0.kicks
			r.calls += v1.calls - v0.calls
			r.framesIn += v1.framesTX - v0.framesTX
			r.framesOut += v1.framesRX - v0.framesRX
		} else {
			r.uncounted = true
		}
	}
	if len(r.pmd) > 0 {
		line += fmt.Sprintf("  testpmd %.0f%% of a core", r.pmd[len(r.pmd)-1])
	}
	fmt.Fprintln(os.Stderr, line)
	return nil
}

// tpAddr gives dev in ns its address and MTU and brings it up.
func (b *bench) tpAddr(ns, dev, addr string) error {
	for _, a := range [][]string{
		{"ip", "-n", ns, "link", "set", dev, "mtu", strconv.Itoa(b.mtu)},
		{"ip", "-n", ns, "addr", "add", addr, "dev", dev},
		{"ip", "-n", ns, "link", "set", dev, "up"},
	} {
		if err := run(a...); err != nil {
			return err
		}
	}
	return nil
}

// tpMove moves testpmd's TAP dev into ns (which takes it down) and sets it up there.
func (b *bench) tpMove(dev, ns, addr string) error {
	if err := run("ip", "link", "set", dev, "netns", ns); err != nil {
		return err
	}
	return b.tpAddr(ns, dev, addr)
}

// start runs testpmd with vdevs and returns once it forwards.
func (t *tpRun) start(vdevs ...string) error {
	os.RemoveAll(filepath.Join(tpRunDir, t.prefix))
	// --no-huge: the memfd-backed memory virtio-user can share with tapgro, no hugepages
	// to set up; the default mbuf pool (155,456) does not fit in -m 512. stdbuf: testpmd
	// prints "Press enter to exit" with stdout block-buffered on a pipe.
	lcores := "--lcores=0@1,1@1"
	if t.shared {
		lcores = "--lcores=0@0,1@1"
	}
	args := append([]string{"-oL", "dpdk-testpmd", "--no-huge", "-m", "512", "--no-pci", "--file-prefix=" + t.prefix, lcores}, vdevs...)
	args = append(args, "--", "--forward-mode=io", "--auto-start", "--stats-period", "0", "--total-num-mbufs", "16384")
	t.cmd = exec.Command("stdbuf", args...)
	var err error
	if t.stdin, err = t.cmd.StdinPipe(); err != nil {
		return err
	}
	t.cmd.Stdout, t.cmd.Stderr = &t.out, &t.out
	if err := t.cmd.Start(); err != nil {
		t.cmd = nil
		return err
	}
	t.done = make(chan struct{})
	go func() { t.cmd.Wait(); close(t.done) }()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(t.out.String(), "Press enter to exit") {
		select {
		case <-t.done:
			return fmt.Errorf("testpmd exited: %s", tail(t.out.String()))
		case <-deadline:
			return fmt.Errorf("testpmd not forwarding after 30 s: %s", tail(t.out.String()))
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// stop closes testpmd's stdin (it stops forwarding and closes its ports, which removes
// the TAPs), kills it if it has not exited in 10 s, and removes its runtime directory.
// Its memory is memfds, which go with the process.
func (t *tpRun) stop() {
	if t == nil {
		return
	}
	if t.cmd != nil {
		t.stdin.Close()
		select {
		case <-t.done:
		case <-time.After(10 * time.Second):
			t.cmd.Process.Kill()
			<-t.done
		}
		t.cmd = nil
	}
	os.RemoveAll(filepath.Join(tpRunDir, t.prefix))
	os.Remove(tpRunDir) // only if no other DPDK process has files there
	if t.sock != "" {
		os.Remove(t.sock)
	}
}

func (b *bench) tpReport(rows []*tpRow, variants []string) string {
	var md strings.Builder
	md.WriteString("# Ping latency: tapgro's vhost-user port with testpmd as the front-end\n\n")
	hostname, _ := os.Hostname()
	cmd := fmt.Sprintf("go run ./integration/benchtool -testpmd -r %d", b.reps)
	if b.mtu != 1500 {
		cmd += fmt.Sprintf(" -mtu %d", b.mtu)
	}
	if b.before != "" {
		cmd += " -before BIN"
	}
	if b.tpShared {
		cmd += " -testpmd-shared"
	}
	for _, v := range variants {
		cmd += fmt.Sprintf(" -testpmd-tapgro-args '%s'", v)
	}
	pmdVersion := "dpdk-testpmd"
	if v, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "dpdk-dev").Output(); err == nil {
		pmdVersion += " (DPDK " + string(v) + ")"
	}
	fmt.Fprintf(&md, "Generated by `%s` on %s (kernel %s, %d cores, %s), %s, with %s.\n\n",
		cmd, hostname, strings.TrimSpace(output("uname", "-r")), runtime.NumCPU(), cpuModel(), time.Now().UTC().Format("2006-01-02 15:04 UTC"), pmdVersion)
	fmt.Fprintf(&md, "Ping from namespace A (198.18.0.1) to namespace B (198.18.0.2), 56-byte payload, %d round trips per row and round, one every %s s, after %d unmeasured; "+
		"%d rounds alternate over the rows. Percentiles and the mean are over every round's round trips pooled; the brackets are the lowest and highest of the rounds' own p50.\n\n",
		tpPings, tpInterval, tpWarm, b.reps)
	md.WriteString("- **veth pair**: A and B joined by a veth pair; no user space on the path, the kernel's floor.\n")
	md.WriteString("- **testpmd alone**: dpdk-testpmd with two net_tap ports, one TAP in A and one in B, `--forward-mode=io`: its forwarding lcore busy-polls both TAPs.\n")
	md.WriteString("- **through tapgro**: tapgro's TAP in A (`--netdev vhost-user`), and testpmd's virtio-user port on tapgro's socket forwarding to a net_tap port whose TAP is in B. " +
		"The TAP to B and testpmd's polling are the same as in the row above, so the difference to it is what tapgro's crossing each way (TAP to ring, ring to TAP) costs a round trip.\n")
	if b.before != "" {
		md.WriteString("- **-before binary**: the same with the tapgro binary given to -before.\n")
	}
	if len(variants) > 0 {
		md.WriteString("- **through tapgro, FLAGS**: the same with those extra tapgro flags.\n")
	}
	layout := "`--lcores 0@1,1@1`: its forwarding lcore spins on CPU 1, and its main lcore, which runs net_tap's SIGIO handler (every frame reaching a net_tap port waits for it), is on CPU 1 too"
	if b.tpShared {
		layout = "`--lcores 0@0,1@1` (-testpmd-shared): its forwarding lcore spins on CPU 1, and its main lcore, which runs net_tap's SIGIO handler (every frame reaching a net_tap port waits for it), shares CPU 0 with ping and tapgro"
	}
	fmt.Fprintf(&md, "\ntestpmd runs with %s; ping and tapgro are pinned to CPU 0 (`taskset -c %s`) in every row, so tapgro's Go runtime sees one CPU. "+
		"tapgro's CPU is its process's utime+stime over the ping runs divided by the pings sent (warm-up included); its idle CPU is over %v with testpmd connected and no traffic (IPv6 off in both namespaces). "+
		"testpmd's CPU is not per round trip: it polls whether or not frames come.\n\n", layout, tpCPU, tpIdle)

	md.WriteString("| path | p50 µs | p99 µs | mean µs | p50 above testpmd alone | tapgro CPU µs/RT | tapgro idle CPU % |\n|---|---|---|---|---|---|---|\n")
	var ref float64
	for _, r := range rows {
		if r.kind == tpAlone && len(r.rtts) > 0 {
			ref = (&rrRow{rtts: r.rtts}).pct(50)
		}
	}
	for _, r := range rows {
		if len(r.rtts) == 0 {
			fmt.Fprintf(&md, "| %s | FAILED: %s | | | | | |\n", r.name, oneLine(r.err))
			continue
		}
		rr := &rrRow{rtts: r.rtts}
		_, lo, hi := median(r.p50s)
		above := "—"
		if ref > 0 && r.kind != tpAlone {
			above = fmt.Sprintf("%+.0f", rr.pct(50)-ref)
		}
		cpu, idle := "—", "—"
		if r.kind == tpTapgro {
			cpu = fmt.Sprintf("%.1f", 1e6*r.tgCPU/float64(r.sent))
			m, _, _ := median(r.idle)
			idle = fmt.Sprintf("%.2f", m)
		}
		fmt.Fprintf(&md, "| %s | %.0f [%.0f–%.0f] | %.0f | %.0f | %s | %s | %s |", r.name, rr.pct(50), lo, hi, rr.pct(99), rr.mean(), above, cpu, idle)
		if r.err != nil {
			fmt.Fprintf(&md, " (later round failed: %s)", oneLine(r.err))
		}
		md.WriteString("\n")
	}

	md.WriteString("\n## Notes from the run\n\n")
	for _, r := range rows {
		var notes []string
		if len(r.pmd) > 0 {
			m, lo, hi := median(r.pmd)
			notes = append(notes, fmt.Sprintf("testpmd %.0f%% of a core [%.0f–%.0f] over the ping runs", m, lo, hi))
		}
		if r.features != "" {
			notes = append(notes, "virtio-user acked "+r.features)
		}
		if r.kind == tpTapgro && len(r.rtts) > 0 {
			if !r.uncounted {
				notes = append(notes, fmt.Sprintf("per ping sent: %.2f kicks from testpmd, %.2f calls to it, %.2f frames testpmd → TAP, %.2f TAP → testpmd (tapgro's counters)",
					r.kicks/float64(r.sent), r.calls/float64(r.sent), r.framesIn/float64(r.sent), r.framesOut/float64(r.sent)))
			} else {
				notes = append(notes, "no kick and call counts (ctl status unreadable)")
			}
		}
		if r.lost > 0 {
			notes = append(notes, fmt.Sprintf("%d pings unanswered", r.lost))
		}
		if len(notes) > 0 {
			fmt.Fprintf(&md, "- %s: %s.\n", r.name, strings.Join(notes, "; "))
		}
	}
	return md.String()
}

func oneLine(err error) string {
	if err == nil {
		return ""
	}
	return strings.ReplaceAll(strings.ReplaceAll(err.Error(), "\n", " "), "|", "/")
}
