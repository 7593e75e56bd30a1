//go:build linux

package integration

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// The QEMU guest: a Debian 12 kernel and a busybox initramfs built by guest/build.sh, booted
// under TCG (this machine's /dev/kvm cannot boot a stock kernel) with one virtio-net-pci NIC
// on a -netdev that points at tapgro. guest/init configures eth0 from the kernel command
// line, runs the test's shell script, prints TAPGRO-GUEST-EXIT=<status> on the serial
// console and powers off, so QEMU exits by itself.

const qemuBin = "qemu-system-x86_64"

// guestMaxCmdline is x86's COMMAND_LINE_SIZE (2048) less the terminating NUL.
const guestMaxCmdline = 2047

var (
	imageOnce                sync.Once
	imageKernel, imageInitrd string
	imageSkip                string
	imageErr                 error
)

// guestImage builds (or finds cached) the guest kernel and initramfs once per test binary
// and returns their paths. The cache directory is $TAPGRO_GUEST_CACHE or
// /var/tmp/tapgro-guest; build.sh rebuilds only when its own text or init changed. Without
// qemu-system-x86_64 the test is skipped, or failed under TAPGRO_REQUIRE_PRIV=1.
func guestImage(t testing.TB) (kernel, initrd string) {
	t.Helper()
	imageOnce.Do(func() {
		if _, err := exec.LookPath(qemuBin); err != nil {
			imageSkip = qemuBin + " not installed (apt-get install qemu-system-x86)"
			return
		}
		script, err := filepath.Abs(filepath.Join("guest", "build.sh"))
		if err != nil {
			imageErr = err
			return
		}
		cache := os.Getenv("TAPGRO_GUEST_CACHE")
		if cache == "" {
			cache = "/var/tmp/tapgro-guest"
		}
		start := time.Now()
		out, err := exec.Command("sh", script, cache).CombinedOutput()
		if err != nil {
			imageErr = fmt.Errorf("%s %s: %v\n%s", script, cache, err, out)
			return
		}
		t.Logf("guest image ready in %v (%s)%s", time.Since(start).Round(time.Millisecond), cache, out)
		// The uncompressed ELF boots through QEMU's PVH entry in seconds; the bzImage
		// decompresses itself under emulation first (see build.sh).
		imageKernel = filepath.Join(cache, "vmlinux")
		if _, err := os.Stat(imageKernel); err != nil {
			imageKernel = filepath.Join(cache, "vmlinuz")
		}
		imageInitrd = filepath.Join(cache, "initrd.img")
	})
	if imageSkip != "" {
		if os.Getenv("TAPGRO_REQUIRE_PRIV") == "1" {
			t.Fatalf("%s, and TAPGRO_REQUIRE_PRIV=1 forbids skipping", imageSkip)
		}
		t.Skip(imageSkip)
	}
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	return imageKernel, imageInitrd
}

// guestOpts describes one guest boot.
type guestOpts struct {
	Name    string        // for logs; "guest" if empty
	NS      *netnstest.NS // namespace QEMU runs in (its inet sockets live there); nil: the test's own
	Netdev  string        // QEMU -netdev value without id, e.g. "stream,server=off,addr.type=unix,addr.path=/x"; "" for no NIC
	IP      string        // eth0 IPv4 with prefix, e.g. "198.18.0.2/24"
	IP6     string        // eth0 IPv6 with prefix, e.g. "fd00:198:18::2/64"
	MTU     int           // eth0 MTU; 0 keeps the driver's
	HostMTU int           // virtio-net-pci host_mtu (VIRTIO_NET_F_MTU); 0 leaves it unset
	Cmd     string        // shell script run by the guest's busybox sh; its exit status is the guest's
	// QEMUArgs go before the NIC's -netdev (vhost-user's shared memory and -chardev);
	// DevOpts are appended to -device virtio-net-pci (",vectors=0").
	QEMUArgs []string
	DevOpts  string
}

// guest is one running QEMU.
type guest struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

var guestExitRe = regexp.MustCompile(`TAPGRO-GUEST-EXIT=(\d+)`)

// guestCmdline is the kernel command line for o; the script travels base64-encoded, and
// gzipped first when the plain form would not fit in COMMAND_LINE_SIZE.
func guestCmdline(o guestOpts) (string, error) {
	// quiet keeps the boot log off the serial console; mitigations=off saves a little
	// emulated time in a throwaway guest.
	base := "console=ttyS0 quiet panic=-1 mitigations=off"
	if o.IP != "" {
		base += " tg.ip=" + o.IP
	}
	if o.IP6 != "" {
		base += " tg.ip6=" + o.IP6
	}
	if o.MTU != 0 {
		base += " tg.mtu=" + strconv.Itoa(o.MTU)
	}
	line := base + " tg.cmd=" + base64.StdEncoding.EncodeToString([]byte(o.Cmd))
	if len(line) <= guestMaxCmdline {
		return line, nil
	}
	var z bytes.Buffer
	w, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
	w.Write([]byte(o.Cmd))
	w.Close()
	line = base + " tg.cmdgz=" + base64.StdEncoding.EncodeToString(z.Bytes())
	if len(line) > guestMaxCmdline {
		return "", fmt.Errorf("guest command line is %d bytes even gzipped; the kernel takes %d", len(line), guestMaxCmdline)
	}
	return line, nil
}

// startGuest boots a guest. QEMU is killed at the end of the test if it is still running,
// and its console is logged when the test failed.
func startGuest(t testing.TB, o guestOpts) *guest {
	t.Helper()
	kernel, initrd := guestImage(t)
	if o.Name == "" {
		o.Name = "guest"
	}
	line, err := guestCmdline(o)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{
		"-nodefaults", "-no-user-config", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd, "-append", line,
	}
	args = append(args, o.QEMUArgs...)
	if o.Netdev != "" {
		dev := "virtio-net-pci,netdev=n0"
		if o.HostMTU != 0 {
			dev += ",host_mtu=" + strconv.Itoa(o.HostMTU)
		}
		dev += o.DevOpts
		args = append(args, "-netdev", o.Netdev+",id=n0", "-device", dev)
	}
	var cmd *exec.Cmd
	if o.NS != nil {
		// ip netns exec execs in place: the PID we hold is QEMU's.
		cmd = exec.Command("ip", append([]string{"netns", "exec", o.NS.Name, qemuBin}, args...)...)
	} else {
		cmd = exec.Command(qemuBin, args...)
	}
	g := &guest{t: t, name: o.Name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = g.out
	cmd.Stderr = g.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", qemuBin, err)
	}
	go func() { cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		g.kill()
		if t.Failed() {
			t.Logf("--- console of %s (netdev %q) ---\n%s", g.name, o.Netdev, g.console())
		}
	})
	return g
}

func (g *guest) kill() {
	select {
	case <-g.done:
	default:
		g.cmd.Process.Kill()
		<-g.done
	}
}

// console is everything QEMU and the guest printed so far, with the serial line's CRs gone.
func (g *guest) console() string {
	return strings.ReplaceAll(g.out.String(), "\r", "")
}

// wait waits for QEMU to exit and returns the status the guest's command exited with and
// the console. It fails the test if QEMU is still running after timeout (a hang guard, not
// a measurement) or exited without the guest printing its exit marker.
func (g *guest) wait(timeout time.Duration) (exitStatus int, console string) {
	g.t.Helper()
	select {
	case <-g.done:
	case <-time.After(timeout):
		g.kill()
		g.t.Fatalf("%s still running after %v:\n%s", g.name, timeout, g.console())
	}
	console = g.console()
	m := guestExitRe.FindStringSubmatch(console)
	if m == nil {
		g.t.Fatalf("%s: QEMU exited (%v) without the guest's exit marker:\n%s", g.name, g.cmd.ProcessState, console)
	}
	exitStatus, _ = strconv.Atoi(m[1])
	return exitStatus, console
}

// mustSucceed is wait that also fails the test unless the guest's command exited 0.
func (g *guest) mustSucceed(timeout time.Duration) string {
	g.t.Helper()
	status, console := g.wait(timeout)
	if status != 0 {
		g.t.Fatalf("%s: command exited %d:\n%s", g.name, status, console)
	}
	return console
}

// waitConsole waits until the console matches re and returns the first submatch (or the
// whole match). It fails the test if QEMU exits first or limit passes.
func (g *guest) waitConsole(re *regexp.Regexp, limit time.Duration) string {
	g.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if m := re.FindStringSubmatch(g.console()); m != nil {
			return m[len(m)-1]
		}
		select {
		case <-g.done:
			g.t.Fatalf("%s exited while waiting for %q:\n%s", g.name, re, g.console())
		default:
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("%s: no console line matching %q after %v:\n%s", g.name, re, limit, g.console())
		}
		time.Sleep(50 * time.Millisecond)
	}
}
