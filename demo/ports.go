package demo

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"time"

	"tapgro/ops"
)

// portKind is a port the demo runs.
type portKind string

const (
	vhostUser portKind = "vhost-user"
	stream    portKind = "stream"
)

// short names the kind in namespace and file names (a namespace name is at most 255
// bytes, a TAP's 15: only the namespaces carry it).
func (k portKind) short() string {
	if k == vhostUser {
		return "vu"
	}
	return "st"
}

// row is one line of the final table: one direction of one port.
type row struct {
	port, dir       string
	gbps            float64
	groSegs, groPkt uint64 // frames into the receiving tapgro's GRO and packets out of it
	drops           uint64 // every tapgro's drops during the run, both directions
}

// runPort sets up kind between two fresh namespaces, checks ping both ways round, runs
// TCP each way and returns the two rows. The caller tears it down.
func (d *demo) runPort(kind portKind) ([]row, error) {
	d.kind, d.procs, d.step = kind, nil, "create the network namespaces"
	for _, side := range []string{"a", "b"} {
		if out, err := osexec.Command("ip", "netns", "add", d.ns(side)).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip netns add %s: %v: %s", d.ns(side), err, out)
		}
		d.namespaces = append(d.namespaces, d.ns(side))
		osexec.Command("ip", "-n", d.ns(side), "link", "set", "lo", "up").Run()
	}
	base := filepath.Join(os.TempDir(), "tapgro-demo-"+d.tag+"-"+kind.short())
	d.sock = base + ".sock"
	// Both TAPs are named tgdemo0 (one per namespace), so each tapgro gets its own
	// control socket instead of both wanting the default /run/tapgro/tgdemo0.ctl; the
	// demo reads the counters through it.
	ctl := func(side string) string { p := base + "-" + side + ".ctl"; d.ctls = append(d.ctls, p); return p }
	common := []string{"--tap", "tgdemo0", "--mtu", strconv.Itoa(d.mtu), "--gro", d.gro, "--log-level", "info"}
	hostAddrs := []string{"--addr", "198.18.0.1/24", "--addr", "fd00:198:18::1/64"}

	d.step = "start the processes"
	// recv is, per direction, the index in d.ctls of the tapgro that writes the
	// direction's packets to its TAP, the one whose GRO counts; -1: a guest receives.
	var fwd, rev string
	var recv [2]int
	switch kind {
	case vhostUser:
		if err := d.start("tapgro", d.ns("a"), append(append(hostAddrs, "--ctl-socket", ctl("a"),
			"--netdev", "vhost-user,path="+d.sock), common...)...); err != nil {
			return nil, err
		}
		// It waits for tapgro's socket, connects, and sets up its rings as QEMU and a
		// Linux guest would (demo/vhostrelay).
		if err := d.start("built-in guest", d.ns("b"), "__vhostrelay", "-connect", d.sock, "-tap", "tgdemo0",
			"-addr", "198.18.0.2/24,fd00:198:18::2/64", "-mtu", strconv.Itoa(d.mtu)); err != nil {
			return nil, err
		}
		fmt.Fprintf(d.stdout, "vhost-user: tapgro on a TAP in %s (198.18.0.1) is the back-end; in %s, the built-in guest (a vhost-user front-end and virtio driver, with a TAP for its kernel, 198.18.0.2); MTU %d\n",
			d.ns("a"), d.ns("b"), d.mtu)
		fwd, rev, recv = "host -> guest", "guest -> host", [2]int{-1, 0}
	case stream:
		if err := d.start("tapgro A", d.ns("a"), append(append(hostAddrs, "--ctl-socket", ctl("a"),
			"--netdev", "stream,server=on,addr.type=unix,addr.path="+d.sock), common...)...); err != nil {
			return nil, err
		}
		if err := d.start("tapgro B", d.ns("b"), append([]string{"--addr", "198.18.0.2/24", "--addr", "fd00:198:18::2/64",
			"--ctl-socket", ctl("b"), "--netdev", "stream,server=off,addr.type=unix,addr.path=" + d.sock}, common...)...); err != nil {
			return nil, err
		}
		fmt.Fprintf(d.stdout, "stream: a tapgro on a TAP in %s and in %s, joined by a QEMU-protocol stream socket; MTU %d, GRO %s\n",
			d.ns("a"), d.ns("b"), d.mtu, d.gro)
		fwd, rev, recv = "A -> B", "B -> A", [2]int{1, 0}
	}
	d.step = "ping across"
	how, err := d.waitPing(20 * time.Second)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(d.stdout, "  ping 198.18.0.1 -> 198.18.0.2 and fd00:198:18::1 -> ::2: ok (%s)\n", how)

	var rows []row
	for i, dir := range []struct {
		name    string
		reverse bool
	}{{fwd, false}, {rev, true}} {
		d.step = "TCP " + dir.name
		before, err := d.counters()
		if err != nil {
			return nil, err
		}
		gbps, tool, err := d.throughput(dir.reverse)
		if err != nil {
			return nil, err
		}
		after, err := d.counters()
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(d.stdout, "  TCP %-14s %6.2f Gbit/s  (%s, %d s)\n", dir.name, gbps, tool, d.secs)
		r := row{port: string(kind), dir: dir.name, gbps: gbps}
		for j := range after {
			r.drops += after[j].TapToPort.Dropped + after[j].PortToTap.Dropped - before[j].TapToPort.Dropped - before[j].PortToTap.Dropped
		}
		if j := recv[i]; j >= 0 {
			r.groSegs, r.groPkt = after[j].GROSegments-before[j].GROSegments, after[j].GROPackets-before[j].GROPackets
		}
		rows = append(rows, r)
	}
	d.step = "stop the processes"
	d.stopAll()
	if d.verbose {
		for _, p := range d.procs {
			fmt.Fprintf(d.stdout, "  %s counters: %s\n", p.name, summaryLine(p.log.String()))
		}
	}
	return rows, nil
}

// counters are the port's tapgro processes' counters, in d.ctls's order, read through
// their control sockets (`tapgro ctl status`, package ops).
func (d *demo) counters() ([]ops.Counters, error) {
	var all []ops.Counters
	for _, path := range d.ctls {
		c, err := net.DialTimeout("unix", path, 2*time.Second)
		if err != nil {
			return nil, fmt.Errorf("control socket %s: %w", path, err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		var resp ops.Response
		_, err = io.WriteString(c, "status\n")
		if err == nil {
			err = json.NewDecoder(io.LimitReader(c, ops.MaxResponse)).Decode(&resp)
		}
		c.Close()
		if err == nil && resp.Status == nil {
			err = fmt.Errorf("no status in the reply (%s)", resp.Error)
		}
		if err != nil {
			return nil, fmt.Errorf("status from %s: %w", path, err)
		}
		all = append(all, resp.Status.Counters)
	}
	return all, nil
}

// printTable writes the rows as the demo's one table, with what its GRO column means.
func printTable(w io.Writer, rows []row) {
	const format = "%-10s  %-13s  %6s  %19s  %5s\n"
	fmt.Fprintf(w, format, "port", "direction", "Gbit/s", "GRO segments/packet", "drops")
	for _, r := range rows {
		seg := "-"
		if r.groPkt > 0 {
			seg = fmt.Sprintf("%.1f", float64(r.groSegs)/float64(r.groPkt))
		}
		fmt.Fprintf(w, format, r.port, r.dir, fmt.Sprintf("%.2f", r.gbps), seg, strconv.FormatUint(r.drops, 10))
	}
	fmt.Fprintln(w, "GRO segments/packet: frames that went into the receiving tapgro's GRO per packet it wrote to its TAP")
	fmt.Fprintln(w, "(1.0: they crossed whole, as a vhost-user guest's 64 KB TSO packets do; - : a guest received them).")
}
