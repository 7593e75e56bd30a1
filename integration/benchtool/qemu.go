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
// tests build, integration/guest/build.sh) behind -netdev stream, with tapgro on the host
// side. TCG emulates every guest instruction, so these rows measure the emulator more than
// tapgro; they are there to show the real guest path works at all and how it compares
// with GRO on and off, and are marked TCG-bound in the report.

var qemuCases = []caseDef{
	{"QEMU guest (TCG-bound) + tapgro GRO on", kindTapgro, nil},
	{"QEMU guest (TCG-bound) + tapgro GRO off", kindTapgro, []string{"--gro", "off"}},
}

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
// receiver's Gbit/s. reverse makes the host send (host -> guest).
func (b *bench) qemuTCP(c caseDef, kernel, initrd string, reverse bool) (float64, error) {
	sock := filepath.Join(b.work, "q.sock")
	os.Remove(sock)
	b.relayPIDs = map[string]int{}
	exec.Command("ip", "netns", "del", b.nsHost).Run()
	if err := run("ip", "netns", "add", b.nsHost); err != nil {
		return 0, err
	}
	defer b.teardown()
	run("ip", "-n", b.nsHost, "link", "set", "lo", "up")
	args := append([]string{"--tap", "tg0", "--mtu", strconv.Itoa(b.mtu), "--addr", "198.18.0.1/24", "--log-level", "warn",
		"--netdev", "stream,server=on,addr.type=unix,addr.path=" + sock}, c.args...)
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
		return 0, err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	rev := ""
	if reverse {
		rev = " -R"
	}
	script := fmt.Sprintf("i=0; until ping -c1 -W1 198.18.0.1 >/dev/null 2>&1; do i=$((i+1)); [ $i -gt 20 ] && exit 3; done\niperf3 -c 198.18.0.1 -t %d -f m%s\n", b.secs, rev)
	line := fmt.Sprintf("console=ttyS0 quiet panic=-1 mitigations=off tg.ip=198.18.0.2/24 tg.mtu=%d tg.cmd=%s",
		b.mtu, base64.StdEncoding.EncodeToString([]byte(script)))
	q := exec.Command("ip", "netns", "exec", b.nsHost, "qemu-system-x86_64",
		"-nodefaults", "-no-user-config", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd, "-append", line,
		"-netdev", "stream,id=n0,server=off,addr.type=unix,addr.path="+sock,
		"-device", "virtio-net-pci,netdev=n0")
	done := make(chan []byte, 1)
	go func() { out, _ := q.CombinedOutput(); done <- out }()
	var out []byte
	select {
	case out = <-done:
	case <-time.After(time.Duration(b.secs)*time.Second + 90*time.Second):
		q.Process.Kill()
		out = <-done
		return 0, fmt.Errorf("guest did not finish: %s", out)
	}
	m := guestRecvRe.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no iperf3 result on the guest console: %s", out)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	if string(m[2]) == "M" {
		v /= 1000
	}
	return v, nil
}
