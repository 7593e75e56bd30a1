package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The relays of one row: the two namespaces, the processes that bridge them, their CPU
// time, and perf profiles of them.

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
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			continue
		}
		out[role], _ = procCPU(pid)
	}
	return out
}
