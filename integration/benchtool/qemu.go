package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"tapgro/ops"
)

// QEMU rows: a real virtio-net guest under TCG (the tiny Debian guest the integration
// tests build, integration/guest/build.sh) behind -netdev stream, or on tapgro's
// vhost-user socket, with tapgro on the host side. TCG emulates every guest instruction,
// so these rows measure the emulator more than tapgro; they are there to show the real
// guest path works at all and how its variants compare, and are marked TCG-bound in the
// report. Behind -netdev stream QEMU's own virtio-net device model copies every frame
// and the guest gets no offloads (net/stream.c has no vnet header); over vhost-user the
// guest's driver and tapgro share the rings and GSO frames pass whole.

var qemuCases = []caseDef{
	{"QEMU guest (TCG-bound) + tapgro GRO on", kindTapgro, nil},
	{"QEMU guest (TCG-bound) + tapgro GRO off", kindTapgro, []string{"--gro", "off"}},
	{qemuVhostUserRow, kindVhostUser, nil},
	// Notification: the default above moderates calls to the guest's receive queue
	// under load (--call-interval, 500 µs); these two are the per-batch call without
	// moderation and the per-frame publish-and-call baseline (--rx-batch off).
	{qemuVhostPerBatch, kindVhostUser, []string{"--call-interval", "0"}},
	{qemuVhostPerFrame, kindVhostUser, []string{"--rx-batch", "off"}},
}

const (
	qemuVhostUserRow  = "QEMU guest (TCG-bound) + tapgro vhost-user"
	qemuVhostPerBatch = "QEMU guest (TCG-bound) + tapgro vhost-user, a call per batch, no moderation"
	qemuVhostPerFrame = "QEMU guest (TCG-bound) + tapgro vhost-user, publish and call per frame"
)

// guestRAM is the guest's -m in MiB; with vhost-user the memfd backend must be exactly
// as large (QEMU refuses a memory-backend whose size differs from -m).
const guestRAM = 256

// guestImage builds (or finds cached) the guest integration/guest/build.sh makes from
// suite's kernel: "bookworm" (Linux 6.1) in $TAPGRO_GUEST_CACHE or /var/tmp/tapgro-guest,
// "bookworm-backports" (Linux 6.12) in /var/tmp/tapgro-guest-bpo, the integration
// tests' caches.
func guestImage(suite string) (kernel, initrd string, err error) {
	cache := "/var/tmp/tapgro-guest-bpo"
	if suite == "bookworm" {
		if cache = os.Getenv("TAPGRO_GUEST_CACHE"); cache == "" {
			cache = "/var/tmp/tapgro-guest"
		}
	}
	script, err := filepath.Abs("integration/guest/build.sh")
	if err != nil {
		return "", "", err
	}
	if out, err := exec.Command("sh", script, cache, suite).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("guest image (%s): %v: %s", suite, err, out)
	}
	kernel = filepath.Join(cache, "vmlinux")
	if _, err := os.Stat(kernel); err != nil {
		kernel = filepath.Join(cache, "vmlinuz")
	}
	return kernel, filepath.Join(cache, "initrd.img"), nil
}

var guestRecvRe = regexp.MustCompile(`([\d.]+) ([MG])bits/sec\s+receiver`)

// qemuTCP boots one guest that runs iperf3 against the host namespace and returns the
// receiver's Gbit/s and the CPU seconds tapgro used over the whole guest run (boot
// included). reverse makes the host send (host -> guest).
func (b *bench) qemuTCP(c caseDef, kernel, initrd string, reverse bool) (gbps, cpu float64, err error) {
	rev := ""
	if reverse {
		rev = " -R"
	}
	script := fmt.Sprintf("%s\niperf3 -c 198.18.0.1 -t %d -f m%s\n", guestWaitHost, b.secs, rev)
	out, cpu, err := b.qemuRun(c, kernel, initrd, script, true, nil)
	if err != nil {
		return 0, 0, err
	}
	m := guestRecvRe.FindSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("no iperf3 result on the guest console: %s", out)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	if string(m[2]) == "M" {
		v /= 1000
	}
	if v <= 0 {
		return 0, 0, fmt.Errorf("iperf3 in the guest reported no throughput: %s", m[0])
	}
	return v, cpu, nil
}

// guestWaitHost is the guest script's first line: wait until the host answers.
const guestWaitHost = "i=0; until ping -c1 -W1 198.18.0.1 >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 20 ] && exit 3; done"

// rrPort is the guest's echo port for the ping-pong rows.
const rrPort = 7007

// qemuRR boots a guest that echoes every byte back (busybox nc -ll -e cat) and runs
// rrRounds 1-byte round trips to it from the host namespace, one outstanding at a time
// (netperf TCP_RR's pattern): what each notification mode costs a request/response.
// It returns each round trip in µs.
func (b *bench) qemuRR(c caseDef, kernel, initrd string) ([]float64, error) {
	// The guest serves until the host is done, then QEMU is stopped.
	script := fmt.Sprintf("%s\nnc -ll -p %d -e /bin/cat &\nsleep 600\n", guestWaitHost, rrPort)
	var rtts []float64
	_, _, err := b.qemuRun(c, kernel, initrd, script, false, func() error {
		out, err := exec.Command("ip", "netns", "exec", b.nsHost, b.self, "-rr-client",
			fmt.Sprintf("198.18.0.2:%d", rrPort), "-rr-rounds", strconv.Itoa(rrRounds)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ping-pong client: %v: %s", err, out)
		}
		rtts, err = parseRTTs("ping-pong client", out)
		return err
	})
	return rtts, err
}

// parseRTTs reads the round trips (µs, space-separated) that a ping-pong client
// (-rr-client, -udp-rr-client) printed.
func parseRTTs(who string, out []byte) ([]float64, error) {
	var rtts []float64
	for _, f := range strings.Fields(string(out)) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, fmt.Errorf("%s printed %q", who, f)
		}
		rtts = append(rtts, v)
	}
	return rtts, nil
}

// rrRounds is the round trips measured per guest boot, after rrWarm unmeasured ones.
const rrRounds, rrWarm = 2000, 200

// rrClient is benchtool -rr-client ADDR: it connects (retrying while the guest boots),
// makes rrWarm and then n 1-byte round trips and prints each measured one in µs.
func rrClient(addr string, n int) error {
	var conn net.Conn
	var err error
	for deadline := time.Now().Add(90 * time.Second); ; {
		if conn, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	defer conn.Close()
	b := []byte{'x'}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for i := 0; i < rrWarm+n; i++ {
		t0 := time.Now()
		if _, err := conn.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(conn, b); err != nil {
			return err
		}
		if i >= rrWarm {
			fmt.Fprintf(out, "%.1f ", float64(time.Since(t0).Nanoseconds())/1e3)
		}
	}
	return nil
}

// qemuRun boots one guest running script behind tapgro and returns its console and the
// CPU seconds tapgro used. With wait the guest's own exit ends the run; otherwise
// during runs against the booted guest and QEMU is stopped after it.
func (b *bench) qemuRun(c caseDef, kernel, initrd, script string, wait bool, during func() error) (console []byte, cpu float64, err error) {
	b.calls = 0
	sock := filepath.Join(b.work, "q.sock")
	os.Remove(sock)
	b.relayPIDs = map[string]int{}
	exec.Command("ip", "netns", "del", b.nsHost).Run()
	if err := run("ip", "netns", "add", b.nsHost); err != nil {
		return nil, 0, err
	}
	defer b.teardown()
	run("ip", "-n", b.nsHost, "link", "set", "lo", "up")
	netdev := "stream,server=on,addr.type=unix,addr.path=" + sock
	// The guest's NIC and what it takes: behind -netdev stream QEMU connects to tapgro.
	mem := []string(nil)
	qnet := []string{"-netdev", "stream,id=n0,server=off,addr.type=unix,addr.path=" + sock, "-device", "virtio-net-pci,netdev=n0"}
	if c.kind == kindVhostUser {
		// tapgro listens, QEMU's chardev connects (reconnect=1 retries until it
		// does); guest RAM is a shared memfd the back-end maps. vectors=0: under TCG
		// QEMU 7.2 crashes in msix_set_vector_notifiers from vhost_net_start with
		// MSI-X (hw/net/vhost_net.c, hw/pci/msix.c).
		netdev = "vhost-user,path=" + sock
		mem = []string{"-object", fmt.Sprintf("memory-backend-memfd,id=mem,size=%dM,share=on", guestRAM), "-machine", "memory-backend=mem"}
		qnet = []string{"-chardev", "socket,id=vu0,path=" + sock + ",reconnect=1", "-netdev", "vhost-user,id=n0,chardev=vu0",
			"-device", "virtio-net-pci,netdev=n0,vectors=0"}
	}
	ctl := filepath.Join(b.work, "q.ctl")
	args := append([]string{"--tap", "tg0", "--mtu", strconv.Itoa(b.mtu), "--addr", "198.18.0.1/24", "--log-level", "warn",
		"--netdev", netdev, "--ctl-socket", ctl}, c.args...)
	b.start("host", b.nsHost, b.tapgro, args...)
	// tapgro binds its socket after the TAP has its address, so once the socket exists
	// the iperf3 server can bind 198.18.0.1.
	for i := 0; i < 50; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	srv := exec.Command("ip", "netns", "exec", b.nsHost, "iperf3", "-s", "-1", "-B", "198.18.0.1")
	if err := srv.Start(); err != nil {
		return nil, 0, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	line := fmt.Sprintf("console=ttyS0 quiet panic=-1 mitigations=off tg.ip=198.18.0.2/24 tg.mtu=%d tg.cmd=%s",
		b.mtu, base64.StdEncoding.EncodeToString([]byte(script)))
	qargs := append([]string{"netns", "exec", b.nsHost, "qemu-system-x86_64",
		"-nodefaults", "-no-user-config", "-accel", "tcg", "-m", strconv.Itoa(guestRAM), "-smp", "1",
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd, "-append", line}, mem...)
	q := exec.Command("ip", append(qargs, qnet...)...)
	var outBuf bytes.Buffer
	q.Stdout, q.Stderr = &outBuf, &outBuf
	if err := q.Start(); err != nil {
		return nil, 0, err
	}
	done := make(chan struct{})
	go func() { q.Wait(); close(done) }()
	var duringErr error
	if during != nil {
		duringErr = during()
	}
	limit := time.Duration(b.secs)*time.Second + 90*time.Second
	if !wait {
		limit = 0
	}
	select {
	case <-done:
	case <-time.After(limit):
		q.Process.Kill()
		<-done
		if wait {
			return nil, 0, fmt.Errorf("guest did not finish: %s", outBuf.Bytes())
		}
	}
	out := outBuf.Bytes()
	if duringErr != nil {
		return nil, 0, fmt.Errorf("%w; guest console: %s", duringErr, out)
	}
	if err := b.relaysAlive(); err != nil {
		return nil, 0, fmt.Errorf("%w; guest console: %s", err, out)
	}
	if c.kind == kindVhostUser {
		if b.calls, err = vhostCalls(b.tapgro, ctl); err != nil {
			return nil, 0, err
		}
	}
	return out, b.cpu()["host"], nil
}

// vhostCalls asks tapgro (ctl status) how many calls it sent the guest.
func vhostCalls(tapgro, ctl string) (uint64, error) {
	out, err := exec.Command(tapgro, "ctl", "--socket", ctl, "--json", "status").Output()
	if err != nil {
		return 0, fmt.Errorf("tapgro ctl status: %v", err)
	}
	var r ops.Response
	if err := json.Unmarshal(out, &r); err != nil || r.Status == nil || r.Status.Vhost == nil {
		return 0, fmt.Errorf("tapgro ctl status: no vhost-user status in %q", out)
	}
	return r.Status.Vhost.Calls, nil
}
