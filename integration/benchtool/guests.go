package main

import (
	"bytes"
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
	"sync"
	"time"
)

// The guest matrix (-guests): each QEMU and guest kernel pair the integration tests boot,
// on tapgro's vhost-user port and on QEMU's own TAP back-end (-netdev tap,vnet_hdr=on,
// QEMU holding the TAP itself: what a user gets with no extra daemon), in one run. A round
// boots one guest per row and runs every test in it in sequence; rounds alternate over
// the rows, so the noise of a shared machine falls on all of them alike, and the table
// shows medians.
//
// The tests: TCP bulk both ways (iperf3), and UDP bulk both ways with one datagram per
// send and with UDP_SEGMENT (40 datagrams of 1,400 bytes per send: a Linux guest's QUIC or
// WireGuard sender), through integration/udpbulk, which checks every byte. Whether UDP
// GSO crosses the NIC whole depends on the guest negotiating VIRTIO_NET_F_HOST_USO /
// GUEST_USO4/6, which the report shows per row from the guest's ethtool -k: where it is
// off, the guest's stack (guest -> host) or the host's (host -> guest, before the TAP)
// segments in software.
//
// CPU: tapgro's process, and QEMU's threads other than the vCPU ("CPU 0/TCG" with
// -name debug-threads=on): on the TAP back-end those threads are where the back-end
// runs; on vhost-user they relay the guest's kicks and tapgro's calls (under TCG there is
// no ioeventfd/irqfd in a kernel to do it), which a KVM host would not pay.

// guestFlavour is one QEMU and guest kernel pair.
type guestFlavour struct {
	name           string   // "qemu7.2-linux6.1"
	kernelPkg      string   // the Debian package the kernel came from
	qemu           []string // the binary and its -L options
	kernel, initrd string
	vectors0       bool   // a vhost-user NIC needs vectors=0 under TCG (QEMU 7.2)
	reconnect      string // the chardev option that retries the connection
}

type guestBackend int

const (
	beVhostUser guestBackend = iota
	beQEMUTap
	beVhostUserBefore // tapgro vhost-user from the -before binary
	beVhostUserArgs   // this tree's tapgro vhost-user with -vhost-args
	beQEMUTapINTx     // QEMU's TAP back-end on a NIC with vectors=0 (-guests-intx)
)

// vhostArgs are extra tapgro flags for an additional vhost-user row (-vhost-args).
var vhostArgs = flag.String("vhost-args", "", "with -guests: also run tapgro vhost-user rows with these extra tapgro flags (space-separated, e.g. \"--vhost-poll 50us\"), alternating with the others")

// guestsINTx adds, for a flavour whose vhost-user NIC needs vectors=0, QEMU's own TAP
// back-end on a NIC with vectors=0 too: the same interrupt path (INTx, whose every
// interrupt the guest acknowledges by reading the ISR register, an exit to the
// emulator) on both back-ends, so their latencies compare like for like.
var guestsINTx = flag.Bool("guests-intx", false, "with -guests: for a QEMU that needs vectors=0 on a vhost-user NIC under TCG (7.2), also run QEMU's TAP back-end with vectors=0, the same interrupt path")

func (be guestBackend) String() string {
	switch be {
	case beVhostUser:
		return "tapgro vhost-user"
	case beVhostUserBefore:
		return "tapgro vhost-user, -before binary"
	case beVhostUserArgs:
		return "tapgro vhost-user " + *vhostArgs
	case beQEMUTapINTx:
		return "QEMU -netdev tap,vnet_hdr=on, NIC vectors=0 (no tapgro)"
	}
	return "QEMU -netdev tap,vnet_hdr=on (no tapgro)"
}

// vhost reports a tapgro vhost-user row.
func (be guestBackend) vhost() bool { return be != beQEMUTap && be != beQEMUTapINTx }

// guestBackends are the rows of flavour f, in the order a round runs them.
func (b *bench) guestBackends(f guestFlavour) []guestBackend {
	var bes []guestBackend
	if b.before != "" {
		bes = append(bes, beVhostUserBefore)
	}
	bes = append(bes, beVhostUser)
	if *vhostArgs != "" {
		bes = append(bes, beVhostUserArgs)
	}
	if *guestsINTx && f.vectors0 {
		bes = append(bes, beQEMUTapINTx)
	}
	return append(bes, beQEMUTap)
}

// guestTests are the matrix's columns, in the order the guest runs them.
var guestTests = []struct{ key, name string }{
	{"tcp-g2h", "TCP guest -> host"},
	{"tcp-h2g", "TCP host -> guest"},
	{"udp-g2h-1", "UDP guest -> host, 1 datagram per send"},
	{"udp-g2h-gso", "UDP guest -> host, UDP_SEGMENT 40 x 1400 B"},
	{"udp-h2g-1", "UDP host -> guest, 1 datagram per send"},
	{"udp-h2g-gso", "UDP host -> guest, UDP_SEGMENT 40 x 1400 B"},
}

const (
	udpG2HPort = 7600
	udpH2GPort = 7601
	udpSize    = 1400
	udpGSO     = 40
)

// guestResult is one test of one boot.
type guestResult struct {
	gbps       float64
	lossPct    float64 // UDP: datagrams sent but not received intact
	bad        uint64  // UDP: datagrams received corrupted
	cpuTapgro  float64 // seconds over the test
	cpuQEMUIO  float64
	sysTapgro  float64 // of those, in the kernel (stime)
	sysQEMUIO  float64
	gigabytes  float64
	guestOffld string    // the guest's view of its NIC's offloads
	rtts       []float64 // tcp-rr: each measured round trip, µs
	// -trace: tracepoint counts over the test (trace.go), for tapgro's threads and for
	// QEMU's other than the vCPU, and tapgro's own counters' growth.
	traceTG, traceQ map[string]float64
	vc              vhostCounters
}

var (
	iperfRecvRe  = regexp.MustCompile(`([\d.]+) ([MG])bits/sec\s+receiver`)
	udpRecvRe    = regexp.MustCompile(`udpbulk: received datagrams=(\d+) bytes=(\d+) bad=(\d+) lost=(\d+) seconds=[\d.]+ gbps=([\d.]+)`)
	guestStepRe  = regexp.MustCompile(`TG-STEP (\S+)`)
	guestOfflRe  = regexp.MustCompile(`(?m)^(tcp-segmentation-offload|tx-udp-segmentation|rx-gro-hw): (\S+( \[fixed\])?)`)
	guestReadyRe = regexp.MustCompile(`udpbulk: ready`)
)

// guestScript is what every matrix guest runs; TG-STEP lines let the host sample CPU at
// each test's start.
func (b *bench) guestScript() string {
	t := strconv.Itoa(b.secs)
	return strings.Join([]string{
		guestWaitHost,
		// Linux's virtio_net makes UDP segmentation available with HOST_USO but leaves it
		// off (virtnet_probe: NETIF_F_GSO_UDP_L4 in hw_features only, outside
		// NETIF_F_ALL_TSO): turn it on where the NIC has it, as a user would.
		"ethtool -K eth0 tx-udp-segmentation on >/dev/null 2>&1 || true",
		"ethtool -k eth0 | grep -E '^(tcp-segmentation-offload|tx-udp-segmentation|rx-gro-hw):'",
		"echo TG-STEP tcp-g2h; iperf3 -c 198.18.0.1 -t " + t + " -f m",
		"echo TG-STEP tcp-h2g; iperf3 -c 198.18.0.1 -t " + t + " -f m -R",
		fmt.Sprintf("echo TG-STEP udp-g2h-1; udpbulk send -to 198.18.0.1:%d -t %s -size %d -gso 1; sleep 3", udpG2HPort, t, udpSize),
		fmt.Sprintf("echo TG-STEP udp-g2h-gso; udpbulk send -to 198.18.0.1:%d -t %s -size %d -gso %d; sleep 3", udpG2HPort, t, udpSize, udpGSO),
		fmt.Sprintf("echo TG-STEP udp-h2g; udpbulk recv -on 198.18.0.2:%d -bursts 2 -idle 2 -max %d", udpH2GPort, 4*b.secs+60),
		// One connection, echoed by cat until the host's ping-pong client closes it.
		fmt.Sprintf("echo TG-STEP tcp-rr; nc -l -p %d -e /bin/cat", rrPort),
		// QEMU must outlive the last step's CPU sample.
		"echo TG-STEP end; sleep 2",
	}, "\n") + "\n"
}

// guestBoot boots f's guest on be once and returns each test's result.
func (b *bench) guestBoot(f guestFlavour, be guestBackend) (map[string]*guestResult, error) {
	b.relayPIDs = map[string]int{}
	exec.Command("ip", "netns", "del", b.nsHost).Run()
	if err := run("ip", "netns", "add", b.nsHost); err != nil {
		return nil, err
	}
	defer b.teardown()
	run("ip", "-n", b.nsHost, "link", "set", "lo", "up")

	qargs := append([]string{"netns", "exec", b.nsHost}, f.qemu...)
	qargs = append(qargs, "-name", "tapgro-bench,debug-threads=on",
		"-nodefaults", "-no-user-config", "-accel", "tcg", "-m", strconv.Itoa(guestRAM), "-smp", "1",
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", guestRAM), "-machine", "memory-backend=mem",
		// The script is /tg/cmd.sh in the initramfs (guestInitrd).
		"-kernel", f.kernel, "-initrd", f.initrd, "-append", fmt.Sprintf("console=ttyS0 quiet panic=-1 mitigations=off tg.ip=198.18.0.2/24 tg.mtu=%d", b.mtu))
	tapName := "tgq0"
	switch be {
	case beVhostUser, beVhostUserBefore, beVhostUserArgs:
		bin := b.tapgro
		if be == beVhostUserBefore {
			bin = b.before
		}
		sock := filepath.Join(b.work, "g.sock")
		os.Remove(sock)
		ctl := ""
		if b.trace {
			ctl = filepath.Join(b.work, "g.ctl")
		}
		args := []string{"--tap", "tg0", "--mtu", strconv.Itoa(b.mtu), "--addr", "198.18.0.1/24",
			"--log-level", "warn", "--netdev", "vhost-user,path=" + sock, "--ctl-socket", ctl}
		if be == beVhostUserArgs {
			args = append(args, strings.Fields(*vhostArgs)...)
		}
		b.start("host", b.nsHost, bin, args...)
		for i := 0; i < 50; i++ {
			if _, err := os.Stat(sock); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		dev := "virtio-net-pci,netdev=n0"
		if f.vectors0 {
			dev += ",vectors=0"
		}
		qargs = append(qargs, "-chardev", "socket,id=vu0,path="+sock+","+f.reconnect,
			"-netdev", "vhost-user,id=n0,chardev=vu0", "-device", dev)
	case beQEMUTap, beQEMUTapINTx:
		dev := "virtio-net-pci,netdev=n0"
		if be == beQEMUTapINTx {
			dev += ",vectors=0"
		}
		qargs = append(qargs, "-netdev", "tap,id=n0,ifname="+tapName+",script=no,downscript=no,vnet_hdr=on",
			"-device", dev)
	}
	q := exec.Command("ip", qargs...)
	con := &lockedBuffer{}
	q.Stdout, q.Stderr = con, con
	if err := q.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { q.Wait(); close(done) }()
	defer func() {
		select {
		case <-done:
		default:
			q.Process.Kill()
			<-done
		}
	}()
	qpid := q.Process.Pid // ip netns exec execs in place
	if !be.vhost() {
		// QEMU creates the TAP; the host side's address goes on once it exists.
		deadline := time.Now().Add(20 * time.Second)
		for exec.Command("ip", "-n", b.nsHost, "link", "show", tapName).Run() != nil {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("QEMU did not create %s; console: %s", tapName, tail(con.String()))
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, a := range [][]string{
			{"ip", "-n", b.nsHost, "link", "set", tapName, "mtu", strconv.Itoa(b.mtu)},
			{"ip", "-n", b.nsHost, "addr", "add", "198.18.0.1/24", "dev", tapName},
			{"ip", "-n", b.nsHost, "link", "set", tapName, "up"},
		} {
			if err := run(a...); err != nil {
				return nil, err
			}
		}
	}
	srv := exec.Command("ip", "netns", "exec", b.nsHost, "iperf3", "-s")
	if err := srv.Start(); err != nil {
		return nil, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	udpOut := &lockedBuffer{}
	urecv := exec.Command("ip", "netns", "exec", b.nsHost, b.udpbulk, "recv", "-on", fmt.Sprintf("0.0.0.0:%d", udpG2HPort),
		"-bursts", "2", "-idle", "2", "-max", strconv.Itoa(10*b.secs+240))
	urecv.Stdout, urecv.Stderr = udpOut, udpOut
	if err := urecv.Start(); err != nil {
		return nil, err
	}
	defer func() { urecv.Process.Kill(); urecv.Wait() }()

	cpuAt := map[string][4]float64{} // step -> tapgro, QEMU I/O seconds at its start; then their system time
	var rrTimes []float64
	traced := newStepTrace(b, be, qpid)
	defer traced.stop()
	sample := func(step string) {
		traced.step(step)
		tg, tgSys := procCPU(b.relayPIDs["host"])
		q, qSys := qemuIOCPU(qpid)
		cpuAt[step] = [4]float64{tg, q, tgSys, qSys}
	}
	limit := time.Now().Add(time.Duration(10*b.secs)*time.Second + 4*time.Minute)
	seen := map[string]bool{}
	var hostErr error
	for !seen["end"] && hostErr == nil {
		exited := false
		select {
		case <-done:
			exited = true // the console may still hold the last steps
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(limit) {
			return nil, fmt.Errorf("guest did not finish; console: %s", tail(con.String()))
		}
		text := con.String()
		if exited && !strings.Contains(text, "TG-STEP end") {
			return nil, fmt.Errorf("QEMU exited before the guest finished; console: %s", tail(text))
		}
		for _, m := range guestStepRe.FindAllStringSubmatch(text, -1) {
			if seen[m[1]] {
				continue
			}
			seen[m[1]] = true
			if m[1] != "udp-h2g" {
				sample(m[1])
			}
			if m[1] == "tcp-rr" {
				// The guest's nc is starting; the client retries until it listens.
				out, err := exec.Command("ip", "netns", "exec", b.nsHost, b.self, "-rr-client",
					fmt.Sprintf("198.18.0.2:%d", rrPort), "-rr-rounds", strconv.Itoa(rrRounds)).CombinedOutput()
				sample("tcp-rr-done")
				if err != nil {
					hostErr = fmt.Errorf("ping-pong client: %v: %s", err, out)
					break
				}
				if rrTimes, hostErr = parseRTTs("ping-pong client", out); hostErr != nil {
					break
				}
			}
		}
		if seen["udp-h2g"] && !seen["h2g-sent"] && guestReadyRe.MatchString(text[strings.Index(text, "TG-STEP udp-h2g"):]) {
			seen["h2g-sent"] = true
			for i, gso := range []int{1, udpGSO} {
				sample([]string{"udp-h2g-1", "udp-h2g-gso"}[i])
				out, err := exec.Command("ip", "netns", "exec", b.nsHost, b.udpbulk, "send", "-to", fmt.Sprintf("198.18.0.2:%d", udpH2GPort),
					"-t", strconv.Itoa(b.secs), "-size", strconv.Itoa(udpSize), "-gso", strconv.Itoa(gso)).CombinedOutput()
				if err != nil {
					hostErr = fmt.Errorf("host udpbulk send: %v: %s", err, out)
					break
				}
				time.Sleep(3 * time.Second) // the guest's receiver ends a burst after 2 s idle
			}
		}
	}
	if hostErr != nil {
		return nil, hostErr
	}
	if err := b.relaysAlive(); err != nil {
		return nil, err
	}
	text := con.String()
	res := map[string]*guestResult{}
	offl := strings.Join(guestOffl(text), ", ")
	// Each test's CPU is the difference to the next test's start.
	order := []string{"tcp-g2h", "tcp-h2g", "udp-g2h-1", "udp-g2h-gso", "udp-h2g-1", "udp-h2g-gso", "tcp-rr", "end"}
	for i, k := range order[:len(order)-1] {
		a, z := cpuAt[k], cpuAt[order[i+1]]
		switch k {
		case "udp-g2h-gso":
			z = cpuAt["udp-h2g-1"] // the guest's receiver start-up lies between
		case "tcp-rr":
			z = cpuAt["tcp-rr-done"] // the client's run, no more
		}
		res[k] = &guestResult{cpuTapgro: z[0] - a[0], cpuQEMUIO: z[1] - a[1], sysTapgro: z[2] - a[2], sysQEMUIO: z[3] - a[3], guestOffld: offl}
		if t := traced.done[k]; t != nil {
			res[k].traceTG, res[k].traceQ, res[k].vc = t.tg, t.q, t.vc
		}
	}
	res["tcp-rr"].rtts = rrTimes
	tcp := iperfRecvRe.FindAllStringSubmatch(text, -1)
	if len(tcp) != 2 {
		return nil, fmt.Errorf("want 2 iperf3 receiver lines on the console, got %d; console: %s", len(tcp), tail(text))
	}
	for i, k := range []string{"tcp-g2h", "tcp-h2g"} {
		v, _ := strconv.ParseFloat(tcp[i][1], 64)
		if tcp[i][2] == "M" {
			v /= 1000
		}
		res[k].gbps, res[k].gigabytes = v, v*float64(b.secs)/8
	}
	// The host's receiver saw the guest's two bursts, the guest's the host's.
	for _, src := range []struct {
		text string
		keys []string
	}{
		{udpOut.String(), []string{"udp-g2h-1", "udp-g2h-gso"}},
		{text, []string{"udp-h2g-1", "udp-h2g-gso"}},
	} {
		ms := udpRecvRe.FindAllStringSubmatch(src.text, -1)
		if len(ms) != 2 {
			return nil, fmt.Errorf("want 2 udpbulk results for %v, got %d: %s", src.keys, len(ms), tail(src.text))
		}
		for i, k := range src.keys {
			n, _ := strconv.ParseFloat(ms[i][1], 64)
			by, _ := strconv.ParseFloat(ms[i][2], 64)
			bad, _ := strconv.ParseUint(ms[i][3], 10, 64)
			lost, _ := strconv.ParseFloat(ms[i][4], 64)
			g, _ := strconv.ParseFloat(ms[i][5], 64)
			r := res[k]
			r.gbps, r.gigabytes, r.bad = g, by/1e9, bad
			if n+lost > 0 {
				r.lossPct = 100 * lost / (n + lost)
			}
		}
	}
	return res, nil
}

// guestOffl returns the guest's "name: on/off" lines for the offloads that matter here.
func guestOffl(console string) []string {
	var out []string
	for _, m := range guestOfflRe.FindAllStringSubmatch(console, -1) {
		// rx-gro-hw is virtio_net's name for the guest offloads (GUEST_TSO4/6, GUEST_USO4/6):
		// the device may hand the guest GSO packets (drivers/net/virtio_net.c). "off
		// [fixed]" is an offload the NIC does not have, plain "off" one left off.
		short := map[string]string{"tcp-segmentation-offload": "TSO", "tx-udp-segmentation": "USO", "rx-gro-hw": "GRO-HW"}[m[1]]
		out = append(out, short+" "+m[2])
	}
	return out
}

// qemuIOCPU is the utime+stime, and the stime alone, in seconds, of QEMU's threads
// other than its vCPUs.
func qemuIOCPU(pid int) (total, sys float64) {
	dirs, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
	for _, p := range dirs {
		name, t, st, ok := statCPU(p)
		if !ok || strings.HasPrefix(name, "CPU ") { // "CPU 0/TCG"
			continue
		}
		total += t
		sys += st
	}
	return total, sys
}

// procCPU is a process's utime+stime, and its stime alone, in seconds.
func procCPU(pid int) (total, sys float64) {
	_, total, sys, _ = statCPU(fmt.Sprintf("/proc/%d/stat", pid))
	return total, sys
}

// statCPU reads a /proc stat file: the command name, utime+stime and stime in seconds.
func statCPU(path string) (name string, total, sys float64, ok bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", 0, 0, false
	}
	i, j := bytes.IndexByte(data, '('), bytes.LastIndexByte(data, ')')
	if i < 0 || j < i || j+2 >= len(data) {
		return "", 0, 0, false
	}
	// Fields after the parenthesised command name; utime and stime are 14 and 15.
	f := strings.Fields(string(data[j+2:]))
	if len(f) < 13 {
		return "", 0, 0, false
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return string(data[i+1 : j]), (ut + st) / 100, st / 100, true // USER_HZ is 100 on Linux
}

// runGuestMatrix runs reps alternating rounds over every flavour and back-end and writes
// the report to path.
// key is one row of the guest matrix: a flavour on a back-end.
type key struct {
	flav string
	be   guestBackend
}

func (b *bench) runGuestMatrix(flavours []guestFlavour, path string) error {
	results := map[key][]map[string]*guestResult{}
	errs := map[key]error{}
	var rows []key
	for _, f := range flavours {
		for _, be := range b.guestBackends(f) {
			rows = append(rows, key{f.name, be})
		}
	}
	for round := 0; round < b.reps; round++ {
		for _, f := range flavours {
			for _, be := range b.guestBackends(f) {
				k := key{f.name, be}
				if errs[k] != nil {
					continue
				}
				fmt.Fprintf(os.Stderr, "== round %d: %s, %s\n", round+1, f.name, be)
				r, err := b.guestBoot(f, be)
				if err != nil {
					errs[k] = fmt.Errorf("round %d: %w", round+1, err)
					fmt.Fprintf(os.Stderr, "   FAILED: %v\n", errs[k])
					continue
				}
				for _, t := range guestTests {
					x := r[t.key]
					fmt.Fprintf(os.Stderr, "   %-44s %6.3f Gbit/s  tapgro %.2f s  QEMU I/O %.2f s  loss %.1f%% bad %d\n",
						t.name, x.gbps, x.cpuTapgro, x.cpuQEMUIO, x.lossPct, x.bad)
				}
				x := r["tcp-rr"]
				rr := rrRow{rtts: x.rtts}
				fmt.Fprintf(os.Stderr, "   %-44s p50 %.0f µs  p99 %.0f µs  tapgro %.2f s  QEMU I/O %.2f s\n",
					"TCP 1-byte ping-pong, host -> guest", rr.pct(50), rr.pct(99), x.cpuTapgro, x.cpuQEMUIO)
				results[k] = append(results[k], r)
			}
		}
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# QEMU guests: tapgro vhost-user beside QEMU's own TAP back-end\n\n")
	hostname, _ := os.Hostname()
	before := ""
	if b.before != "" {
		before = " -before BIN"
	}
	if *vhostArgs != "" {
		before += fmt.Sprintf(" -vhost-args %q", *vhostArgs)
	}
	if *guestsINTx {
		before += " -guests-intx"
	}
	if b.trace {
		before += " -trace"
	}
	fmt.Fprintf(&md, "Generated by `go run ./integration/benchtool -guests%s -t %d -r %d -mtu %d` on %s (kernel %s, %d cores, %s), %s.\n",
		before, b.secs, b.reps, b.mtu, hostname, strings.TrimSpace(output("uname", "-r")), runtime.NumCPU(), cpuModel(), time.Now().UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(&md, "Every guest runs under TCG (no KVM here), so the emulator bounds every row; %d alternating rounds, %d s per test, MTU %d; medians [min–max].\n", b.reps, b.secs, b.mtu)
	fmt.Fprintf(&md, "CPU is seconds per GB received: tapgro's process, and QEMU's threads other than the vCPU (where its TAP back-end runs; on vhost-user they relay kicks and calls, which KVM's ioeventfd/irqfd would do in the kernel). "+
		"In brackets, the part of it spent in the kernel (stime): a TAP write runs the host's receive path in the writer's thread, and a TAP read copies the frame out, whichever back-end does them.\n")
	fmt.Fprintf(&md, "UDP rows give the loss (datagrams sent and not received intact) and the datagrams received corrupted (must be 0).\n\n")
	for _, f := range flavours {
		v, _, _ := strings.Cut(output(f.qemu[0], "--version"), "\n")
		fmt.Fprintf(&md, "- `%s`: %s; guest kernel %s\n", f.name, v, f.kernelPkg)
	}
	md.WriteString("\n")
	for _, t := range guestTests {
		fmt.Fprintf(&md, "## %s\n\n| guest | back-end | guest NIC offloads | Gbit/s | vs QEMU TAP | tapgro s/GB | QEMU I/O s/GB |%s\n|---|---|---|---|---|---|---|%s\n",
			t.name, map[bool]string{true: " loss | bad |", false: ""}[strings.HasPrefix(t.key, "udp")], map[bool]string{true: "---|---|", false: ""}[strings.HasPrefix(t.key, "udp")])
		for _, k := range rows {
			if errs[k] != nil && len(results[k]) == 0 {
				fmt.Fprintf(&md, "| %s | %s | | FAILED: %s | | | |\n", k.flav, k.be, strings.ReplaceAll(errs[k].Error(), "\n", " "))
				continue
			}
			med, lo, hi, tg, qio, tgSys, qioSys, loss, bad, offl := summarize(results[k], t.key)
			ratio := ""
			if k.be.vhost() {
				if ref := results[key{k.flav, beQEMUTap}]; len(ref) > 0 {
					if m, _, _, _, _, _, _, _, _, _ := summarize(ref, t.key); m > 0 {
						ratio = fmt.Sprintf("%.2fx", med/m)
					}
				}
			}
			tgs := fmt.Sprintf("%.2f (%.2f)", tg, tgSys)
			if !k.be.vhost() {
				tgs = "—"
			}
			fmt.Fprintf(&md, "| %s | %s | %s | %.3f [%.3f–%.3f] | %s | %s | %.2f (%.2f) |", k.flav, k.be, offl, med, lo, hi, ratio, tgs, qio, qioSys)
			if strings.HasPrefix(t.key, "udp") {
				fmt.Fprintf(&md, " %.1f%% | %d |", loss, bad)
			}
			if errs[k] != nil {
				fmt.Fprintf(&md, " (later round failed: %s)", strings.ReplaceAll(errs[k].Error(), "\n", " "))
			}
			md.WriteString("\n")
		}
		md.WriteString("\n")
	}
	md.WriteString(rrReport(rows, results, errs))
	if b.trace {
		md.WriteString(traceReport(rows, results))
	}
	fmt.Fprint(os.Stderr, md.String())
	return os.WriteFile(path, []byte(md.String()), 0o644)
}

// rrReport is the ping-pong table: every row's round trips pooled over its rounds, and
// CPU per round trip (the warm-up's included: the client's whole run is timed).
func rrReport(rows []key, results map[key][]map[string]*guestResult, errs map[key]error) string {
	var md strings.Builder
	fmt.Fprintf(&md, "## TCP 1-byte ping-pong, host -> guest\n\n")
	fmt.Fprintf(&md, "One connection to the guest's `nc -l -e /bin/cat`, %d round trips after %d unmeasured, one outstanding at a time (netperf TCP_RR's pattern). CPU is µs per round trip over the client's whole run.\n\n", rrRounds, rrWarm)
	fmt.Fprintf(&md, "| guest | back-end | p50 µs | p99 µs | p50 vs QEMU TAP | tapgro CPU µs/RT | QEMU I/O CPU µs/RT |\n|---|---|---|---|---|---|---|\n")
	pooled := func(k key) (rrRow, float64, float64) {
		var r rrRow
		var tg, q float64
		for _, x := range results[k] {
			r.rtts = append(r.rtts, x["tcp-rr"].rtts...)
			tg += x["tcp-rr"].cpuTapgro
			q += x["tcp-rr"].cpuQEMUIO
		}
		n := float64(len(results[k]) * (rrRounds + rrWarm))
		return r, 1e6 * tg / n, 1e6 * q / n
	}
	for _, k := range rows {
		if len(results[k]) == 0 {
			fmt.Fprintf(&md, "| %s | %s | FAILED: %v | | | | |\n", k.flav, k.be, errs[k])
			continue
		}
		r, tg, q := pooled(k)
		ratio, tgs := "", "—"
		if k.be.vhost() {
			tgs = fmt.Sprintf("%.0f", tg)
			if ref := results[key{k.flav, beQEMUTap}]; len(ref) > 0 {
				rq, _, _ := pooled(key{k.flav, beQEMUTap})
				ratio = fmt.Sprintf("%.2fx", r.pct(50)/rq.pct(50))
			}
		}
		fmt.Fprintf(&md, "| %s | %s | %.0f | %.0f | %s | %s | %.0f |\n", k.flav, k.be, r.pct(50), r.pct(99), ratio, tgs, q)
	}
	md.WriteString("\n")
	return md.String()
}

// summarize gives one row's medians over its rounds for test key: throughput (and its
// range), CPU per GB over all rounds together, the median loss, the corrupted datagrams
// in all, and the guest's offloads.
func summarize(rs []map[string]*guestResult, key string) (med, lo, hi, tg, qio, tgSys, qioSys, loss float64, bad uint64, offl string) {
	var v, l []float64
	var gb, ct, cq, st, sq float64
	for _, r := range rs {
		x := r[key]
		v, l = append(v, x.gbps), append(l, x.lossPct)
		gb += x.gigabytes
		ct += x.cpuTapgro
		cq += x.cpuQEMUIO
		st += x.sysTapgro
		sq += x.sysQEMUIO
		bad += x.bad
		offl = x.guestOffld
	}
	med, lo, hi = median(v)
	loss, _, _ = median(l)
	if gb > 0 {
		tg, qio, tgSys, qioSys = ct/gb, cq/gb, st/gb, sq/gb
	}
	return
}

func median(v []float64) (med, lo, hi float64) {
	v = append([]float64(nil), v...)
	sort.Float64s(v)
	n := len(v)
	med = v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return med, v[0], v[n-1]
}

// lockedBuffer is a bytes.Buffer a process writes while the bench reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// guestInitrd returns an initramfs that is base with udpbulk added as /usr/bin/udpbulk
// and the matrix's guest script as /tg/cmd.sh (which the guest's init runs): a second
// newc archive appended to the first, which the kernel unpacks over it
// (init/initramfs.c unpack_to_rootfs reads archives until the end of the image). The
// script cannot go on the kernel command line: Linux 6.12 panics with "Too many boot
// init vars" on it.
func (b *bench) guestInitrd(base, name string) (string, error) {
	dir := filepath.Join(b.work, "extra-"+name)
	for _, d := range []string{"usr/bin", "tg"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	data, err := os.ReadFile(b.udpbulk)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "usr", "bin", "udpbulk"), data, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "tg", "cmd.sh"), []byte(b.guestScript()), 0o755); err != nil {
		return "", err
	}
	cp := exec.Command("sh", "-c", "find usr tg | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0")
	cp.Dir = dir
	extra, err := cp.Output()
	if err != nil {
		return "", fmt.Errorf("cpio: %v", err)
	}
	img, err := os.ReadFile(base)
	if err != nil {
		return "", err
	}
	// Each archive must start 4-byte aligned (unpack_to_rootfs looks for the magic
	// there); cpio pads its output to 512 bytes, but base may come from elsewhere.
	img = append(img, make([]byte, (4-len(img)%4)%4)...)
	out := filepath.Join(b.work, "initrd-"+name+".img")
	return out, os.WriteFile(out, append(img, extra...), 0o644)
}

// guestFlavours provisions the flavours named in list (comma-separated; "" all): each
// QEMU with the guest the integration tests boot with it (integration/flavour_test.go).
func (b *bench) guestFlavours(list string) ([]guestFlavour, error) {
	var out []guestFlavour
	for _, name := range []string{"qemu7.2-linux6.1", "qemu10.0-linux6.12"} {
		if list != "" && !strings.Contains(","+list+",", ","+name+",") {
			continue
		}
		f := guestFlavour{name: name, qemu: []string{"qemu-system-x86_64"}, vectors0: true, reconnect: "reconnect=1"}
		suite := "bookworm"
		if name == "qemu10.0-linux6.12" {
			// bookworm-backports' QEMU, unpacked by qemu.sh, loads its own firmware
			// (-L); it takes MSI-X on a vhost-user NIC under TCG, and its chardev's
			// reconnect is reconnect-ms since 9.2 (chardev/char-socket.c
			// qemu_chr_parse_socket).
			const prefix = "/var/tmp/tapgro-qemu10"
			script, err := filepath.Abs("integration/guest/qemu.sh")
			if err != nil {
				return nil, err
			}
			if o, err := exec.Command("sh", script, prefix).CombinedOutput(); err != nil {
				return nil, fmt.Errorf("QEMU 10.0 from bookworm-backports: %v: %s", err, o)
			}
			f.qemu = []string{filepath.Join(prefix, "usr/bin/qemu-system-x86_64"),
				"-L", filepath.Join(prefix, "usr/share/seabios"), "-L", filepath.Join(prefix, "usr/share/qemu")}
			f.vectors0, f.reconnect = false, "reconnect-ms=1000"
			suite = "bookworm-backports"
		}
		kernel, initrd, err := guestImage(suite)
		if err != nil {
			return nil, err
		}
		if initrd, err = b.guestInitrd(initrd, name); err != nil {
			return nil, err
		}
		pkg, _ := os.ReadFile(filepath.Join(filepath.Dir(kernel), "kernel"))
		f.kernelPkg, f.kernel, f.initrd = strings.TrimSpace(string(pkg)), kernel, initrd
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-guest-flavours %q names no flavour", list)
	}
	return out, nil
}

// tail is the end of a console, for an error message.
func tail(s string) string {
	const n = 600
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return strings.Join(strings.Fields(s), " ")
}
