package main

import (
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
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
}

const qemuVhostUserRow = "QEMU guest (TCG-bound) + tapgro vhost-user"

// guestRAM is the guest's -m in MiB; with vhost-user the memfd backend must be exactly
// as large (QEMU refuses a memory-backend whose size differs from -m).
const guestRAM = 256

func guestImage(work string) (kernel, initrd string, err error) {
	cache := os.Getenv("TAPGRO_GUEST_CACHE")
	if cache == "" {
		cache = "/var/tmp/tapgro-guest"
	}
	script, err := filepath.Abs("integration/guest/build.sh")
	if err != nil {
		return "", "", err
	}
	if out, err := exec.Command("bash", script, cache).CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("guest image: %v: %s", err, out)
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
	sock := filepath.Join(b.work, "q.sock")
	os.Remove(sock)
	b.relayPIDs = map[string]int{}
	exec.Command("ip", "netns", "del", b.nsHost).Run()
	if err := run("ip", "netns", "add", b.nsHost); err != nil {
		return 0, 0, err
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
	args := append([]string{"--tap", "tg0", "--mtu", strconv.Itoa(b.mtu), "--addr", "198.18.0.1/24", "--log-level", "warn",
		"--netdev", netdev}, c.args...)
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
		return 0, 0, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	rev := ""
	if reverse {
		rev = " -R"
	}
	script := fmt.Sprintf("i=0; until ping -c1 -W1 198.18.0.1 >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 20 ] && exit 3; done\niperf3 -c 198.18.0.1 -t %d -f m%s\n", b.secs, rev)
	line := fmt.Sprintf("console=ttyS0 quiet panic=-1 mitigations=off tg.ip=198.18.0.2/24 tg.mtu=%d tg.cmd=%s",
		b.mtu, base64.StdEncoding.EncodeToString([]byte(script)))
	qargs := append([]string{"netns", "exec", b.nsHost, "qemu-system-x86_64",
		"-nodefaults", "-no-user-config", "-accel", "tcg", "-m", strconv.Itoa(guestRAM), "-smp", "1",
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd, "-append", line}, mem...)
	q := exec.Command("ip", append(qargs, qnet...)...)
	done := make(chan []byte, 1)
	go func() { out, _ := q.CombinedOutput(); done <- out }()
	var out []byte
	select {
	case out = <-done:
	case <-time.After(time.Duration(b.secs)*time.Second + 90*time.Second):
		q.Process.Kill()
		out = <-done
		return 0, 0, fmt.Errorf("guest did not finish: %s", out)
	}
	if err := b.relaysAlive(); err != nil {
		return 0, 0, fmt.Errorf("%w; guest console: %s", err, out)
	}
	cpu = b.cpu()["host"]
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
