package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"tapgro/ops"
)

// -guests -trace: what each back-end does per GB in the guest matrix's TCP tests, counted
// by the kernel's tracepoints while the test runs (perf stat over the process's threads:
// tapgro's, and QEMU's other than its vCPU, where its TAP back-end runs and where it
// relays kicks and calls for a vhost-user NIC under TCG): system calls by kind, the
// threads' context switches (each a sleep or a preemption) and the wake-ups they make
// (sched_wakeup in the waker's context: futex hand-offs between Go's threads, and the
// eventfd writes that wake QEMU), and for tapgro the frames, kicks and calls its own
// counters saw (tapgro ctl status). The tracepoints need tracefs (mounted here if it is
// not) and perf (Debian's linux-perf).

// traceEvents are the counted tracepoints, in the report's column order.
var traceEvents = []struct{ event, name string }{
	{"syscalls:sys_enter_read", "read"},
	{"syscalls:sys_enter_readv", "readv"},
	{"syscalls:sys_enter_write", "write"},
	{"syscalls:sys_enter_writev", "writev"},
	{"syscalls:sys_enter_epoll_pwait", "epoll_pwait"},
	{"syscalls:sys_enter_ppoll", "ppoll"}, // tapgro's look at the TAP before it parks; QEMU's main loop waits in it
	{"syscalls:sys_enter_futex", "futex"},
	{"syscalls:sys_enter_nanosleep", "nanosleep"},
	{"sched:sched_switch", "ctx switches"},
	{"sched:sched_wakeup", "wake-ups made"},
}

// tracer is one perf stat over a set of threads.
type tracer struct {
	cmd  *exec.Cmd
	file string
}

// traceReady mounts tracefs if the syscall tracepoints are missing and checks perf.
func traceReady() error {
	if _, err := exec.LookPath("perf"); err != nil {
		return fmt.Errorf("-trace needs perf (apt-get install linux-perf)")
	}
	if _, err := os.Stat("/sys/kernel/tracing/events/syscalls"); err != nil {
		if out, err := exec.Command("mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing").CombinedOutput(); err != nil {
			return fmt.Errorf("-trace: mount tracefs: %v: %s", err, out)
		}
	}
	return nil
}

// startTrace counts traceEvents over pid's threads (all of them, or with qemuIO only
// those that are not a vCPU: "CPU n/TCG" with -name debug-threads=on).
func startTrace(dir string, pid int, qemuIO bool, tag string) (*tracer, error) {
	var target []string
	if qemuIO {
		var tids []string
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, e := range ents {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/comm", pid, e.Name()))
			if !strings.HasPrefix(string(comm), "CPU ") {
				tids = append(tids, e.Name())
			}
		}
		target = []string{"-t", strings.Join(tids, ",")}
	} else {
		target = []string{"-p", strconv.Itoa(pid)}
	}
	tr := &tracer{file: filepath.Join(dir, "perf-"+tag+".csv")}
	args := []string{"stat", "-x", ",", "-o", tr.file}
	for _, e := range traceEvents {
		args = append(args, "-e", e.event)
	}
	tr.cmd = exec.Command("perf", append(args, target...)...)
	if err := tr.cmd.Start(); err != nil {
		return nil, err
	}
	return tr, nil
}

// stop ends the count and returns it by event name.
func (tr *tracer) stop() map[string]float64 {
	tr.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { tr.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		tr.cmd.Process.Kill()
		<-done
	}
	out := map[string]float64{}
	data, _ := os.ReadFile(tr.file)
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Split(l, ",")
		if len(f) < 3 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		for _, e := range traceEvents {
			if f[2] == e.event {
				out[e.name] += v
			}
		}
	}
	return out
}

// vhostCounters are tapgro's own counts at one moment (ctl status).
type vhostCounters struct{ framesTX, framesRX, kicks, calls float64 }

func readVhostCounters(tapgro, ctl string) (vhostCounters, error) {
	out, err := exec.Command(tapgro, "ctl", "--socket", ctl, "--json", "status").Output()
	if err != nil {
		return vhostCounters{}, fmt.Errorf("tapgro ctl status: %v", err)
	}
	var r ops.Response
	if err := json.Unmarshal(out, &r); err != nil || r.Status == nil || r.Status.Vhost == nil {
		return vhostCounters{}, fmt.Errorf("tapgro ctl status: no vhost-user status in %q", out)
	}
	c := r.Status.Counters
	return vhostCounters{float64(c.PortToTap.Frames), float64(c.TapToPort.Frames), float64(r.Status.Vhost.Kicks), float64(r.Status.Vhost.Calls)}, nil
}

// traceTable renders the counts of one test, per unit (GB received, or round trip),
// for every row that has them.
func traceTable(title, unit string, rows []traceRow) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "### %s: per %s\n\n| guest | back-end | threads |", title, unit)
	for _, e := range traceEvents {
		fmt.Fprintf(&b, " %s |", e.name)
	}
	b.WriteString(" frames → TAP | frames → guest | kicks | calls |\n|---|---|---|")
	for range traceEvents {
		b.WriteString("---|")
	}
	b.WriteString("---|---|---|---|\n")
	// Per GB the counts are thousands; per round trip a few, where a tenth matters.
	f := "%.0f"
	if unit == "round trip" {
		f = "%.2f"
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s |", r.flav, r.be, r.threads)
		for _, e := range traceEvents {
			fmt.Fprintf(&b, " "+f+" |", r.per[e.name])
		}
		if r.vhost {
			fmt.Fprintf(&b, " "+f+" | "+f+" | "+f+" | "+f+" |\n", r.per["frames → TAP"], r.per["frames → guest"], r.per["kicks"], r.per["calls"])
		} else {
			b.WriteString(" | | | |\n")
		}
	}
	return b.String()
}

// traceRow is one back-end's counts in one test, summed over rounds, per unit.
type traceRow struct {
	flav, be, threads string
	vhost             bool
	per               map[string]float64
}

// tracedTests are the guest matrix's steps -trace counts, and its tables: the TCP tests
// per GB received, the ping-pong per round trip (its warm-up rounds included, as in its
// CPU column: the count runs over the client's whole run).
var tracedTests = []tracedTest{
	{"tcp-g2h", "TCP guest -> host", "GB received", func(r *guestResult) float64 { return r.gigabytes }},
	{"tcp-h2g", "TCP host -> guest", "GB received", func(r *guestResult) float64 { return r.gigabytes }},
	{"tcp-rr", "TCP 1-byte ping-pong, host -> guest", "round trip", func(r *guestResult) float64 {
		if len(r.rtts) == 0 {
			return 0 // the client failed
		}
		return rrRounds + rrWarm
	}},
}

type tracedTest struct {
	key, name, unit string
	units           func(r *guestResult) float64 // the test's units in one round's result
}

// stepTrace follows the guest's steps: a traced step's counts run from its start to the
// next step's.
type stepTrace struct {
	b      *bench
	be     guestBackend
	qpid   int
	cur    string
	tg, q  *tracer
	vc0    vhostCounters
	done   map[string]*stepCounts
	failed error
}

type stepCounts struct {
	tg, q map[string]float64
	vc    vhostCounters
}

func newStepTrace(b *bench, be guestBackend, qpid int) *stepTrace {
	return &stepTrace{b: b, be: be, qpid: qpid, done: map[string]*stepCounts{}}
}

// step ends the current traced step, if any, and starts step if it is traced.
func (s *stepTrace) step(step string) {
	if !s.b.trace {
		return
	}
	s.stop()
	if !slices.ContainsFunc(tracedTests, func(t tracedTest) bool { return t.key == step }) {
		return
	}
	s.cur = step
	var err error
	if s.be.vhost() {
		if s.tg, err = startTrace(s.b.work, s.b.relayPIDs["host"], false, step+"-tapgro"); err != nil {
			s.failed = err
		}
		s.vc0, _ = readVhostCounters(s.b.tapgro, filepath.Join(s.b.work, "g.ctl"))
	}
	if s.q, err = startTrace(s.b.work, s.qpid, true, step+"-qemu"); err != nil {
		s.failed = err
	}
}

func (s *stepTrace) stop() {
	if s.cur == "" {
		return
	}
	c := &stepCounts{}
	if s.tg != nil {
		c.tg = s.tg.stop()
		v, _ := readVhostCounters(s.b.tapgro, filepath.Join(s.b.work, "g.ctl"))
		c.vc = vhostCounters{v.framesTX - s.vc0.framesTX, v.framesRX - s.vc0.framesRX, v.kicks - s.vc0.kicks, v.calls - s.vc0.calls}
	}
	if s.q != nil {
		c.q = s.q.stop()
	}
	s.done[s.cur] = c
	s.cur, s.tg, s.q = "", nil, nil
}

// traceReport is the -trace section: per traced test, each row's counts summed over its
// rounds and divided by the units (gigabytes received, round trips) in them.
func traceReport(rows []key, results map[key][]map[string]*guestResult) string {
	var b strings.Builder
	b.WriteString("## Per GB and per round trip: system calls, context switches, wake-ups (-trace)\n\n")
	b.WriteString("Counted by the kernel's tracepoints (perf stat) while each test ran, summed over the rounds and divided by the gigabytes received (TCP bulk) or the round trips made (ping-pong, warm-up included). " +
		"tapgro: all its threads; QEMU: its threads other than the vCPU (with the TAP back-end they run it; with vhost-user, under TCG, they relay tapgro's calls: the guest's kicks reach tapgro's eventfd from the vCPU thread). " +
		"\"wake-ups made\" are sched_wakeup events in those threads' context (futex hand-offs between threads, eventfd writes that wake another process).\n\n")
	for _, t := range tracedTests {
		var tr []traceRow
		for _, k := range rows {
			var units float64
			tg, q := map[string]float64{}, map[string]float64{}
			var vc vhostCounters
			for _, r := range results[k] {
				x := r[t.key]
				if x == nil || x.traceQ == nil {
					continue
				}
				units += t.units(x)
				for n, v := range x.traceTG {
					tg[n] += v
				}
				for n, v := range x.traceQ {
					q[n] += v
				}
				vc.framesTX += x.vc.framesTX
				vc.framesRX += x.vc.framesRX
				vc.kicks += x.vc.kicks
				vc.calls += x.vc.calls
			}
			if units == 0 {
				continue
			}
			per := func(m map[string]float64) map[string]float64 {
				out := map[string]float64{}
				for n, v := range m {
					out[n] = v / units
				}
				return out
			}
			if k.be.vhost() {
				p := per(tg)
				p["frames → TAP"], p["frames → guest"] = vc.framesTX/units, vc.framesRX/units
				p["kicks"], p["calls"] = vc.kicks/units, vc.calls/units
				tr = append(tr, traceRow{flav: k.flav, be: k.be.String(), threads: "tapgro", vhost: true, per: p})
			}
			tr = append(tr, traceRow{flav: k.flav, be: k.be.String(), threads: "QEMU, not vCPU", per: per(q)})
		}
		if len(tr) > 0 {
			b.WriteString(traceTable(t.name, t.unit, tr))
			b.WriteString("\n")
		}
	}
	return b.String()
}
