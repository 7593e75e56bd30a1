package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// runDemo is `tapgro demo`: the main job on an embedded default, no QEMU needed.
//
//	netns A                                   netns B
//	198.18.0.1 ─ TAP ─ tapgro ══ stream ══ tapgro ─ TAP ─ 198.18.0.2
//	(TSO on: 64 KB   (segments to     (unix    (coalesces MTU
//	 GSO frames)      MTU frames)     socket)   frames to 64 KB)
//
// The link between the two tapgro processes carries exactly what a QEMU guest behind
// -netdev stream would see: plain, MTU-sized, fully checksummed frames.
func runDemo(args []string, stdout, stderr io.Writer) int {
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
	if os.Geteuid() != 0 {
		fmt.Fprintln(stderr, "tapgro demo: needs root (it creates network namespaces and TAP devices)")
		return 2
	}
	if _, err := exec.LookPath("ip"); err != nil {
		fmt.Fprintln(stderr, "tapgro demo: needs the ip command (apt-get install -y iproute2)")
		return 2
	}
	d := &demo{stdout: stdout, stderr: stderr, tag: strconv.Itoa(os.Getpid())}
	defer d.cleanup()
	if err := d.run(*secs, *mtu, *gro); err != nil {
		fmt.Fprintln(stderr, "tapgro demo:", err)
		return 1
	}
	return 0
}

type demo struct {
	stdout, stderr io.Writer
	tag            string
	namespaces     []string
	procs          []*demoProc
	sock           string
}

type demoProc struct {
	name string
	cmd  *exec.Cmd
	log  *bytes.Buffer
}

func (d *demo) ns(side string) string { return "tapgro-demo-" + d.tag + "-" + side }

func (d *demo) run(secs, mtu int, gro string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	for _, side := range []string{"a", "b"} {
		if out, err := exec.Command("ip", "netns", "add", d.ns(side)).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns add %s: %v: %s", d.ns(side), err, out)
		}
		d.namespaces = append(d.namespaces, d.ns(side))
		exec.Command("ip", "-n", d.ns(side), "link", "set", "lo", "up").Run()
	}
	d.sock = filepath.Join(os.TempDir(), "tapgro-demo-"+d.tag+".sock")
	common := []string{"--tap", "tgdemo0", "--mtu", strconv.Itoa(mtu), "--log-level", "info"}
	a := append([]string{"--addr", "198.18.0.1/24", "--addr", "fd00:198:18::1/64",
		"--netdev", "stream,server=on,addr.type=unix,addr.path=" + d.sock}, common...)
	b := append([]string{"--addr", "198.18.0.2/24", "--addr", "fd00:198:18::2/64", "--gro", gro,
		"--netdev", "stream,server=off,addr.type=unix,addr.path=" + d.sock}, common...)
	if err := d.start("tapgro A", d.ns("a"), self, a...); err != nil {
		return err
	}
	if err := d.start("tapgro B", d.ns("b"), self, b...); err != nil {
		return err
	}
	fmt.Fprintf(d.stdout, "two namespaces (%s, %s), a tapgro on a TAP in each, joined by a QEMU-protocol stream socket (%s); MTU %d, receiving GRO %s\n",
		d.ns("a"), d.ns("b"), d.sock, mtu, gro)
	if err := d.waitPing(20 * time.Second); err != nil {
		return err
	}
	fmt.Fprintln(d.stdout, "ping 198.18.0.1 -> 198.18.0.2 and fd00:198:18::1 -> ::2: ok")

	for _, dir := range []struct {
		name    string
		reverse bool
	}{{"A -> B (B's tapgro coalesces)", false}, {"B -> A (A's tapgro coalesces)", true}} {
		gbps, tool, err := d.throughput(self, secs, dir.reverse)
		if err != nil {
			return err
		}
		fmt.Fprintf(d.stdout, "TCP %-30s %6.2f Gbit/s  (%s, %d s)\n", dir.name, gbps, tool, secs)
	}
	d.stopAll()
	for _, p := range d.procs {
		fmt.Fprintf(d.stdout, "%s counters: %s\n", p.name, summaryLine(p.log.String()))
	}
	return nil
}

func (d *demo) start(name, ns, self string, args ...string) error {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, self}, args...)...)
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	d.procs = append(d.procs, &demoProc{name: name, cmd: cmd, log: &buf})
	return nil
}

func (d *demo) waitPing(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		e4 := exec.Command("ip", "netns", "exec", d.ns("a"), "ping", "-c", "1", "-W", "1", "198.18.0.2").Run()
		e6 := exec.Command("ip", "netns", "exec", d.ns("a"), "ping", "-6", "-c", "1", "-W", "1", "fd00:198:18::2").Run()
		if e4 == nil && e6 == nil {
			return nil
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, p := range d.procs {
				fmt.Fprintf(&logs, "\n--- %s ---\n%s", p.name, p.log.String())
			}
			return fmt.Errorf("no ping across the bridge after %v (v4: %v, v6: %v)%s", limit, e4, e6, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// throughput runs one TCP transfer from A to B (or B to A) with iperf3 when it is
// installed, else with tapgro's own sender and receiver.
func (d *demo) throughput(self string, secs int, reverse bool) (float64, string, error) {
	if _, err := exec.LookPath("iperf3"); err == nil {
		srv := exec.Command("ip", "netns", "exec", d.ns("b"), "iperf3", "-s", "-1", "-B", "198.18.0.2")
		if err := srv.Start(); err != nil {
			return 0, "", err
		}
		defer srv.Wait()
		var out []byte
		var err error
		for try := 0; try < 50; try++ {
			args := []string{"netns", "exec", d.ns("a"), "iperf3", "-c", "198.18.0.2", "-t", strconv.Itoa(secs), "-J"}
			if reverse {
				args = append(args, "-R")
			}
			out, err = exec.Command("ip", args...).Output()
			if err == nil || !bytes.Contains(out, []byte("Connection refused")) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			srv.Process.Kill()
			return 0, "", fmt.Errorf("iperf3: %v: %s", err, out)
		}
		var r struct {
			End struct {
				SumReceived struct {
					BitsPerSecond float64 `json:"bits_per_second"`
				} `json:"sum_received"`
			} `json:"end"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			return 0, "", fmt.Errorf("iperf3 output: %w", err)
		}
		return r.End.SumReceived.BitsPerSecond / 1e9, "iperf3", nil
	}
	recvNS, sendNS, addr := d.ns("b"), d.ns("a"), "198.18.0.2:5201"
	if reverse {
		recvNS, sendNS, addr = d.ns("a"), d.ns("b"), "198.18.0.1:5201"
	}
	sink := exec.Command("ip", "netns", "exec", recvNS, self, "__sink", addr)
	var sinkOut bytes.Buffer
	sink.Stdout = &sinkOut
	if err := sink.Start(); err != nil {
		return 0, "", err
	}
	time.Sleep(300 * time.Millisecond)
	src := exec.Command("ip", "netns", "exec", sendNS, self, "__source", addr, strconv.Itoa(secs))
	if out, err := src.CombinedOutput(); err != nil {
		sink.Process.Kill()
		sink.Wait()
		return 0, "", fmt.Errorf("built-in sender: %v: %s", err, out)
	}
	sink.Wait()
	gbps, err := strconv.ParseFloat(strings.TrimSpace(sinkOut.String()), 64)
	return gbps, "built-in sender (iperf3 not installed)", err
}

func (d *demo) stopAll() {
	for _, p := range d.procs {
		if p.cmd.Process != nil && p.cmd.ProcessState == nil {
			// ip netns exec execs tapgro in place, so this PID is tapgro's own.
			p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range d.procs {
		if p.cmd.ProcessState == nil {
			done := make(chan struct{})
			go func() { p.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				p.cmd.Process.Kill()
				<-done
			}
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

// runHelper is the built-in TCP sender and receiver the demo falls back on without
// iperf3. They are hidden subcommands so the demo needs nothing but this binary.
func runHelper(args []string, stdout, stderr io.Writer) int {
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
