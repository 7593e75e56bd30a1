// Package demo is `tapgro demo`: tapgro's two kinds of port, each between two network
// namespaces, with a TCP throughput run each way (iperf3 where it is installed, else the
// built-in sender and receiver, Helper), ending in one short table.
//
//	vhost-user (the back-end a VM host runs):
//	netns A: 198.18.0.1 ─ TAP ─ tapgro ══ vhost-user ══ built-in guest ─ TAP ─ 198.18.0.2 :netns B
//	                                     (rings in the guest's memfd)  (demo/vhostrelay)
//
//	stream (QEMU's -netdev stream, where tapgro does GRO):
//	netns A: 198.18.0.1 ─ TAP ─ tapgro ══ stream ══ tapgro ─ TAP ─ 198.18.0.2 :netns B
//	       (TSO on: 64 KB GSO    (segments to   (unix    (coalesces MTU
//	        frames)               MTU frames)    socket)  frames to 64 KB)
//
// The built-in guest is a vhost-user front-end and virtio driver with a TAP where a guest
// kernel would be (tapgro __vhostrelay); the stream link carries exactly what a QEMU guest
// behind -netdev stream would see: plain, MTU-sized, fully checksummed frames. It needs
// root and the ip command, nothing else, and removes the namespaces and processes it made
// by their own names and PIDs. It is a traffic harness, not part of the daemon: package
// main only dispatches to it.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"tapgro/iperfns"
)

// Run is `tapgro demo [--port vhost-user|stream|all] [--seconds N] [--mtu N] [--gro on|off] [-v]`.
func Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapgro demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	port := fs.String("port", "all", "which port to run: vhost-user, stream or all")
	secs := fs.Int("seconds", 5, "length of each throughput run")
	mtu := fs.Int("mtu", 1500, "MTU of both TAPs (the 'guest' MTU)")
	gro := fs.String("gro", "on", "--gro of every tapgro")
	verbose := fs.Bool("v", false, "also print each process's raw counters")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var kinds []portKind
	switch *port {
	case "all":
		kinds = []portKind{vhostUser, stream}
	case string(vhostUser), string(stream):
		kinds = []portKind{portKind(*port)}
	default:
		fmt.Fprintf(stderr, "tapgro demo: --port %q: want vhost-user, stream or all\n", *port)
		return 2
	}
	// Tools first, before anything is created: a missing program must be named as
	// such, not show up 20 s later as "no ping across the bridge".
	tools, notes, err := checkDemoTools(exec.LookPath)
	if err != nil {
		fmt.Fprintln(stderr, "tapgro demo:", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "tapgro demo: needs root (it creates network namespaces and TAP devices)")
		return 2
	}
	for _, n := range notes {
		fmt.Fprintln(stdout, "note:", n)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "tapgro demo:", err)
		return 1
	}
	d := &demo{stdout: stdout, stderr: stderr, tag: strconv.Itoa(os.Getpid()), tools: tools, self: self,
		secs: *secs, mtu: *mtu, gro: *gro, verbose: *verbose}
	var rows []row
	for _, k := range kinds {
		r, err := d.runPort(k)
		d.teardown()
		if err != nil {
			fmt.Fprintf(stderr, "tapgro demo: %s: failed at step %q: %v\n", k, d.step, err)
			// The tapgro logs usually say why (TAP not created, socket not connected, a
			// datapath error), so show their ends rather than only the symptom.
			for _, p := range d.procs {
				fmt.Fprintf(stderr, "--- %s (%s), last lines of its log ---\n%s", p.name, p.state(), tailLines(p.log.String(), demoLogTail))
			}
			return 1
		}
		rows = append(rows, r...)
	}
	fmt.Fprintln(stdout)
	printTable(stdout, rows)
	return 0
}

// demoLogTail is how many lines of each tapgro log a failure shows.
const demoLogTail = 15

// demoTools says which optional programs the demo found; for each missing one it uses
// a built-in stand-in, so only ip is required.
type demoTools struct {
	ping   bool // system ping, else the built-in ICMP echo (demoEcho)
	iperf3 bool // iperf3, else the built-in __sink/__source pair
}

// checkDemoTools looks up the demo's programs with lookPath (exec.LookPath, or a stub
// in tests). It fails for ip, which has no stand-in, and returns a note naming the Debian
// package for each optional program it will replace with a built-in.
func checkDemoTools(lookPath func(string) (string, error)) (demoTools, []string, error) {
	var t demoTools
	var notes []string
	if _, err := lookPath("ip"); err != nil {
		return t, nil, fmt.Errorf("needs the ip command to create the namespaces and run tapgro in them, and it is not on the PATH: apt-get install -y iproute2")
	}
	if _, err := lookPath("ping"); err == nil {
		t.ping = true
	} else {
		notes = append(notes, "ping is not on the PATH, so the demo checks the bridge with its built-in ICMP echo (for the system ping: apt-get install -y iputils-ping)")
	}
	if _, err := lookPath("iperf3"); err == nil {
		t.iperf3 = true
	} else {
		notes = append(notes, "iperf3 is not on the PATH, so the demo measures with its built-in TCP sender (for iperf3's numbers: apt-get install -y iperf3)")
	}
	return t, notes, nil
}

type demo struct {
	stdout, stderr io.Writer
	tag            string
	tools          demoTools
	self           string // the tapgro binary, for the processes the demo starts
	secs, mtu      int
	gro            string
	verbose        bool

	// The port being run; teardown resets it.
	kind       portKind
	step       string // what runPort is doing, for the failure message
	namespaces []string
	procs      []*demoProc
	ctls       []string // the tapgro processes' control sockets
	sock       string
}

type demoProc struct {
	name string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{} // closed when cmd.Wait returns; err is set by then
	err  error
}

// state says whether the process is still running, for the failure message.
func (p *demoProc) state() string {
	select {
	case <-p.done:
		if p.err != nil {
			return "exited: " + p.err.Error()
		}
		return "exited"
	default:
		return "running"
	}
}

// syncBuffer collects a tapgro's output: exec copies into it from its own goroutine
// while the demo may read it for a failure message.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ns is the name of namespace side ("a" or "b") of the port being run.
func (d *demo) ns(side string) string {
	return "tapgro-demo-" + d.tag + "-" + d.kind.short() + "-" + side
}

// start runs the tapgro binary with args in namespace ns, its output kept for the
// failure message and -v.
func (d *demo) start(name, ns string, args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, d.self}, args...)...)
	buf := &syncBuffer{}
	cmd.Stdout = buf
	cmd.Stderr = buf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &demoProc{name: name, cmd: cmd, log: buf, done: make(chan struct{})}
	// One waiter per process, so waitPing can notice a tapgro that died at start-up
	// (no /dev/net/tun, socket path taken) instead of pinging it for 20 s.
	go func() { p.err = cmd.Wait(); close(p.done) }()
	d.procs = append(d.procs, p)
	return nil
}

// waitPing pings B from A over IPv4 and IPv6 until both answer, with the system ping
// when it is installed, else with demoEcho. It returns which of the two it used.
func (d *demo) waitPing(limit time.Duration) (string, error) {
	type target struct {
		name string
		addr string
		ping func() ([]byte, error)
	}
	var targets []target
	how := "ping"
	if d.tools.ping {
		for _, t := range []struct{ name, addr, flag string }{{"v4", "198.18.0.2", "-4"}, {"v6", "fd00:198:18::2", "-6"}} {
			targets = append(targets, target{t.name, t.addr, func() ([]byte, error) {
				return exec.Command("ip", "netns", "exec", d.ns("a"), "ping", t.flag, "-c", "1", "-W", "1", t.addr).CombinedOutput()
			}})
		}
	} else {
		how = "tapgro's built-in ICMP echo"
		for _, t := range []struct{ name, addr string }{{"v4", "198.18.0.2"}, {"v6", "fd00:198:18::2"}} {
			e, err := newDemoEcho(d.ns("a"), net.ParseIP(t.addr))
			if err != nil {
				return "", fmt.Errorf("built-in ICMP echo (%s): %w (or install the system ping: apt-get install -y iputils-ping)", t.name, err)
			}
			defer e.close()
			targets = append(targets, target{t.name, t.addr, func() ([]byte, error) {
				rtt, err := e.ping(time.Second)
				if err != nil {
					return []byte(err.Error()), err
				}
				return []byte(fmt.Sprintf("echo reply from %s in %v", t.addr, rtt.Round(time.Microsecond))), nil
			}})
		}
	}
	deadline := time.Now().Add(limit)
	errs := make([]error, len(targets))
	outs := make([][]byte, len(targets))
	answered := make([]bool, len(targets))
	for {
		ok := true
		for i, t := range targets {
			if !answered[i] {
				outs[i], errs[i] = t.ping()
				answered[i] = errs[i] == nil
			}
			ok = ok && answered[i]
		}
		if ok {
			return how, nil
		}
		for _, p := range d.procs {
			select {
			case <-p.done:
				return "", fmt.Errorf("%s exited before the bridge came up (%s)", p.name, p.state())
			default:
			}
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			fmt.Fprintf(&b, "no answer across the bridge after %v with %s", limit, how)
			for i, t := range targets {
				res := "ok"
				if errs[i] != nil {
					res = errs[i].Error()
				}
				fmt.Fprintf(&b, "\n  %s to %s: %s; last output:\n%s", t.name, t.addr, res,
					strings.TrimRight(indent(tailLines(string(outs[i]), 5), "    "), "\n"))
			}
			return "", errors.New(strings.TrimRight(b.String(), "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tailLines returns the last n lines of s, each ending in a newline, or "(empty)".
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return "(empty)\n"
	}
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("(%d earlier lines)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n") + "\n"
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix) + "\n"
}

// throughput runs one TCP transfer from A to B (or B to A) with iperf3 when it is
// installed, else with tapgro's own sender and receiver.
func (d *demo) throughput(reverse bool) (float64, string, error) {
	self, secs := d.self, d.secs
	if d.tools.iperf3 {
		args := []string{"-t", strconv.Itoa(secs)}
		if reverse {
			args = append(args, "-R")
		}
		out, err := iperfns.Run(d.ns("b"), d.ns("a"), "198.18.0.2", args...)
		if err != nil {
			return 0, "", err
		}
		bps, err := iperfns.ReceivedBitsPerSecond(out)
		if err != nil {
			return 0, "", err
		}
		return bps / 1e9, "iperf3", nil
	}
	recvNS, sendNS, addr := d.ns("b"), d.ns("a"), "198.18.0.2:5201"
	if reverse {
		recvNS, sendNS, addr = d.ns("a"), d.ns("b"), "198.18.0.1:5201"
	}
	sink := exec.Command("ip", "netns", "exec", recvNS, self, "__sink", addr)
	var sinkOut, sinkErr bytes.Buffer
	sink.Stdout = &sinkOut
	sink.Stderr = &sinkErr
	if err := sink.Start(); err != nil {
		return 0, "", fmt.Errorf("start the built-in receiver: %w", err)
	}
	time.Sleep(300 * time.Millisecond)
	src := exec.Command("ip", "netns", "exec", sendNS, self, "__source", addr, strconv.Itoa(secs))
	if out, err := src.CombinedOutput(); err != nil {
		sink.Process.Kill()
		sink.Wait()
		return 0, "", fmt.Errorf("built-in sender in %s: %v: %s\n  built-in receiver in %s said: %s",
			sendNS, err, strings.TrimSpace(string(out)), recvNS, strings.TrimSpace(sinkErr.String()))
	}
	if err := sink.Wait(); err != nil {
		return 0, "", fmt.Errorf("built-in receiver in %s: %v: %s", recvNS, err, strings.TrimSpace(sinkErr.String()))
	}
	gbps, err := strconv.ParseFloat(strings.TrimSpace(sinkOut.String()), 64)
	return gbps, "built-in sender (iperf3 not installed)", err
}

func (d *demo) stopAll() {
	for _, p := range d.procs {
		select {
		case <-p.done:
		default:
			// ip netns exec execs tapgro in place, so this PID is tapgro's own.
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range d.procs {
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
}

// teardown stops the port's processes and removes its namespaces and sockets. The
// processes stay listed for a failure message.
func (d *demo) teardown() {
	d.stopAll()
	for _, ns := range d.namespaces {
		exec.Command("ip", "netns", "del", ns).Run()
	}
	d.namespaces = nil
	for _, p := range append([]string{d.sock}, d.ctls...) {
		if p != "" {
			os.Remove(p)
		}
	}
	d.sock, d.ctls = "", nil
}

// summaryLine pulls the counters out of tapgro's "tapgro exiting" log line, or out of
// the built-in guest's last report.
func summaryLine(log string) string {
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "tapgro exiting") {
			if i := strings.Index(l, "gro_"); i >= 0 {
				return l[i:]
			}
			return l
		}
		if s, ok := strings.CutPrefix(l, "vhostrelay: to TAP: "); ok {
			return "to TAP: " + s
		}
	}
	return "(no summary line; log follows)\n" + log
}

// Helper is the built-in TCP sender and receiver the demo falls back on without
// iperf3: tapgro's hidden subcommands __sink and __source, so that the demo needs
// nothing but the tapgro binary.
func Helper(args []string, stdout, stderr io.Writer) int {
	switch {
	case args[0] == "__sink" && len(args) == 2:
		ln, err := net.Listen("tcp", args[1])
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		start := time.Now()
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(stdout, "%.3f\n", float64(n)*8/time.Since(start).Seconds()/1e9)
		return 0
	case args[0] == "__source" && len(args) == 3:
		secs, _ := strconv.Atoi(args[2])
		c, err := net.Dial("tcp", args[1])
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
		defer cancel()
		buf := make([]byte, 128<<10)
		for ctx.Err() == nil {
			if _, err := c.Write(buf); err != nil {
				fmt.Fprintln(stderr, err)
				return 1
			}
		}
		c.Close()
		return 0
	}
	fmt.Fprintln(stderr, "usage: tapgro __sink ADDR | __source ADDR SECONDS")
	return 2
}
