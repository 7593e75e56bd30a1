// Package demo is `tapgro demo`: two tapgro processes, each in a network namespace of
// its own with a TAP, joined by the stream port over a UNIX socket, and a TCP
// throughput run each way through them (iperf3 where it is installed, else the
// built-in sender and receiver, Helper). It needs root and the ip command, nothing
// else; it cleans up the namespaces and processes it made by their own names and PIDs.
// It is a traffic harness, not part of the daemon: package main only dispatches to it.
package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"

	"tapgro/iperfns"
	"tapgro/vnethdr"
)

// Run is `tapgro demo`: the main job on an embedded default, no QEMU needed.
//
//	netns A                                   netns B
//	198.18.0.1 ─ TAP ─ tapgro ══ stream ══ tapgro ─ TAP ─ 198.18.0.2
//	(TSO on: 64 KB   (segments to     (unix    (coalesces MTU
//	 GSO frames)      MTU frames)     socket)   frames to 64 KB)
//
// The link between the two tapgro processes carries exactly what a QEMU guest behind
// -netdev stream would see: plain, MTU-sized, fully checksummed frames.
func Run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tapgro demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	secs := fs.Int("seconds", 5, "length of each throughput run")
	mtu := fs.Int("mtu", 1500, "MTU of both TAPs (the 'guest' MTU)")
	gro := fs.String("gro", "on", "--gro for the receiving tapgro")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
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
	d := &demo{stdout: stdout, stderr: stderr, tag: strconv.Itoa(os.Getpid()), tools: tools}
	defer d.cleanup()
	if err := d.run(*secs, *mtu, *gro); err != nil {
		fmt.Fprintf(stderr, "tapgro demo: failed at step %q: %v\n", d.step, err)
		// The tapgro logs usually say why (TAP not created, socket not connected, a
		// datapath error), so show their ends rather than only the symptom.
		for _, p := range d.procs {
			fmt.Fprintf(stderr, "--- %s (%s), last lines of its log ---\n%s", p.name, p.state(), tailLines(p.log.String(), demoLogTail))
		}
		return 1
	}
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
	step           string // what run is doing, for the failure message
	namespaces     []string
	procs          []*demoProc
	sock           string
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

func (d *demo) ns(side string) string { return "tapgro-demo-" + d.tag + "-" + side }

func (d *demo) run(secs, mtu int, gro string) error {
	d.step = "find the tapgro binary"
	self, err := os.Executable()
	if err != nil {
		return err
	}
	d.step = "create the network namespaces"
	for _, side := range []string{"a", "b"} {
		if out, err := exec.Command("ip", "netns", "add", d.ns(side)).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns add %s: %v: %s", d.ns(side), err, out)
		}
		d.namespaces = append(d.namespaces, d.ns(side))
		exec.Command("ip", "-n", d.ns(side), "link", "set", "lo", "up").Run()
	}
	d.sock = filepath.Join(os.TempDir(), "tapgro-demo-"+d.tag+".sock")
	common := []string{"--tap", "tgdemo0", "--mtu", strconv.Itoa(mtu), "--log-level", "info"}
	// Both TAPs are named tgdemo0 (one per namespace), so each tapgro gets its own control
	// socket instead of both wanting the default /run/tapgro/tgdemo0.ctl.
	ctl := func(side string) string { return filepath.Join(os.TempDir(), "tapgro-demo-"+d.tag+"-"+side+".ctl") }
	a := append([]string{"--addr", "198.18.0.1/24", "--addr", "fd00:198:18::1/64", "--ctl-socket", ctl("a"),
		"--netdev", "stream,server=on,addr.type=unix,addr.path=" + d.sock}, common...)
	b := append([]string{"--addr", "198.18.0.2/24", "--addr", "fd00:198:18::2/64", "--gro", gro, "--ctl-socket", ctl("b"),
		"--netdev", "stream,server=off,addr.type=unix,addr.path=" + d.sock}, common...)
	d.step = "start the two tapgro processes"
	if err := d.start("tapgro A", d.ns("a"), self, a...); err != nil {
		return err
	}
	if err := d.start("tapgro B", d.ns("b"), self, b...); err != nil {
		return err
	}
	fmt.Fprintf(d.stdout, "two namespaces (%s, %s), a tapgro on a TAP in each, joined by a QEMU-protocol stream socket (%s); MTU %d, receiving GRO %s\n",
		d.ns("a"), d.ns("b"), d.sock, mtu, gro)
	d.step = "ping across the bridge"
	how, err := d.waitPing(20 * time.Second)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.stdout, "ping 198.18.0.1 -> 198.18.0.2 and fd00:198:18::1 -> ::2: ok (%s)\n", how)

	for _, dir := range []struct {
		name    string
		reverse bool
	}{{"A -> B (B's tapgro coalesces)", false}, {"B -> A (A's tapgro coalesces)", true}} {
		d.step = "TCP " + dir.name
		gbps, tool, err := d.throughput(self, secs, dir.reverse)
		if err != nil {
			return err
		}
		fmt.Fprintf(d.stdout, "TCP %-30s %6.2f Gbit/s  (%s, %d s)\n", dir.name, gbps, tool, secs)
	}
	d.step = "stop the tapgro processes"
	d.stopAll()
	for _, p := range d.procs {
		fmt.Fprintf(d.stdout, "%s counters: %s\n", p.name, summaryLine(p.log.String()))
	}
	return nil
}

func (d *demo) start(name, ns, self string, args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, self}, args...)...)
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

// demoEcho is the built-in ICMP echo the demo uses when ping is not installed: a raw
// ICMP socket opened inside namespace A, so one request and its reply take the same
// path through both tapgro processes as the system ping's would. It is a raw socket
// (not an unprivileged ICMP datagram one) because the demo runs as root and a fresh
// namespace's net.ipv4.ping_group_range allows no group.
type demoEcho struct {
	c   net.PacketConn
	v6  bool
	dst net.IP
	id  uint16
	seq uint16
}

// newDemoEcho opens the raw ICMP (or ICMPv6) socket for dst inside the named namespace.
// The socket stays bound to that namespace after the thread switches back.
func newDemoEcho(nsName string, dst net.IP) (*demoEcho, error) {
	network := "ip4:icmp"
	v6 := dst.To4() == nil
	if v6 {
		network = "ip6:ipv6-icmp"
	}
	type result struct {
		c   net.PacketConn
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(nsName)
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{nil, fmt.Errorf("open namespace %s: %w", nsName, err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			res <- result{nil, fmt.Errorf("enter namespace %s: %w", nsName, err)}
			return
		}
		c, err := net.ListenPacket(network, "")
		if serr := netns.Set(orig); serr != nil {
			// The thread stays locked, so the runtime ends it with this goroutine
			// rather than running other code in the wrong namespace.
			if c != nil {
				c.Close()
			}
			res <- result{nil, fmt.Errorf("leave namespace %s: %w", nsName, serr)}
			return
		}
		runtime.UnlockOSThread()
		res <- result{c, err}
	}()
	r := <-res
	if r.err != nil {
		return nil, r.err
	}
	return &demoEcho{c: r.c, v6: v6, dst: dst, id: uint16(os.Getpid())}, nil
}

func (e *demoEcho) close() { e.c.Close() }

// ping sends one echo request and waits up to timeout for its reply.
func (e *demoEcho) ping(timeout time.Duration) (time.Duration, error) {
	e.seq++
	reqType, replyType := byte(8), byte(0) // ICMP echo request / reply
	if e.v6 {
		reqType, replyType = 128, 129
	}
	msg := make([]byte, 8, 8+16)
	msg[0] = reqType
	binary.BigEndian.PutUint16(msg[4:], e.id)
	binary.BigEndian.PutUint16(msg[6:], e.seq)
	msg = append(msg, "tapgro demo echo"...)
	if !e.v6 {
		// Linux fills in the ICMPv6 checksum of a raw socket itself (it needs the
		// pseudo-header), but not ICMPv4's.
		binary.BigEndian.PutUint16(msg[2:], vnethdr.Checksum(msg, 0))
	}
	start := time.Now()
	if err := e.c.SetReadDeadline(start.Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := e.c.WriteTo(msg, &net.IPAddr{IP: e.dst}); err != nil {
		return 0, err
	}
	buf := make([]byte, 1500)
	for {
		// The socket sees every ICMP message of the namespace (neighbour discovery,
		// other echoes); only our reply counts. Go strips the IPv4 header.
		n, from, err := e.c.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, fmt.Errorf("no echo reply from %s within %v", e.dst, timeout)
			}
			return 0, err
		}
		if n >= 8 && buf[0] == replyType && buf[1] == 0 &&
			binary.BigEndian.Uint16(buf[4:]) == e.id && binary.BigEndian.Uint16(buf[6:]) == e.seq {
			if a, ok := from.(*net.IPAddr); ok && a.IP.Equal(e.dst) {
				return time.Since(start), nil
			}
		}
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
func (d *demo) throughput(self string, secs int, reverse bool) (float64, string, error) {
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

func (d *demo) cleanup() {
	d.stopAll()
	for _, ns := range d.namespaces {
		exec.Command("ip", "netns", "del", ns).Run()
	}
	if d.sock != "" {
		os.Remove(d.sock)
	}
}

// summaryLine pulls the counters out of tapgro's "tapgro exiting" log line.
func summaryLine(log string) string {
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "tapgro exiting") {
			if i := strings.Index(l, "gro_"); i >= 0 {
				return l[i:]
			}
			return l
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
