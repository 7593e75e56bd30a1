//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// The QEMU guest: a Debian kernel and a busybox initramfs built by guest/build.sh, booted
// by the flavour's QEMU (flavour_test.go) under TCG (this machine's /dev/kvm cannot boot a
// stock kernel) with one virtio-net-pci NIC on a -netdev that points at tapgro.
// guest/init configures eth0 from the kernel command line, runs the test's shell script
// (/tg/cmd.sh, in an initramfs archive appended per boot), prints
// TAPGRO-GUEST-EXIT=<status> on the serial console and powers off, so QEMU exits by
// itself.

// guestOpts describes one guest boot.
type guestOpts struct {
	Name    string        // for logs; "guest" if empty
	Flavour *qemuFlavour  // the QEMU and guest kernel (forEachFlavour)
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

// guestCmdline is the kernel command line for o: only eth0's settings, which are short.
// The script goes in the initramfs (guestInitrd): Linux 6.12 panics with "Too many boot
// init vars" on the long command line a script made.
func guestCmdline(o guestOpts) string {
	// quiet keeps the boot log off the serial console; mitigations=off saves a little
	// emulated time in a throwaway guest.
	line := "console=ttyS0 quiet panic=-1 mitigations=off"
	if o.IP != "" {
		line += " tg.ip=" + o.IP
	}
	if o.IP6 != "" {
		line += " tg.ip6=" + o.IP6
	}
	if o.MTU != 0 {
		line += " tg.mtu=" + strconv.Itoa(o.MTU)
	}
	return line
}

// startGuest boots a guest. QEMU is killed at the end of the test if it is still running,
// and its console is logged when the test failed.
func startGuest(t testing.TB, o guestOpts) *guest {
	t.Helper()
	f := o.Flavour
	if f == nil {
		t.Fatal("startGuest: guestOpts.Flavour not set")
	}
	if o.Name == "" {
		o.Name = "guest"
	}
	args := append(append([]string(nil), f.QEMUArgs...),
		"-nodefaults", "-no-user-config", "-accel", "tcg", "-m", "256", "-smp", "1",
		"-display", "none", "-serial", "stdio", "-no-reboot",
		"-kernel", f.Kernel, "-initrd", guestInitrd(t, f.Initrd, o.Cmd), "-append", guestCmdline(o),
	)
	args = append(args, o.QEMUArgs...)
	if o.Netdev != "" {
		dev := "virtio-net-pci,netdev=n0"
		if o.HostMTU != 0 {
			dev += ",host_mtu=" + strconv.Itoa(o.HostMTU)
		}
		dev += o.DevOpts
		if !strings.Contains(dev, "vectors=") {
			dev += f.devOpts()
		}
		args = append(args, "-netdev", o.Netdev+",id=n0", "-device", dev)
	}
	return launchQEMU(t, o.NS, f, o.Name, fmt.Sprintf("%s, netdev %q", f.Name, o.Netdev), args)
}

// launchQEMU starts f's QEMU with args, in ns if it is not nil. QEMU is killed at the end
// of the test if it is still running, and its console is logged (headed by name and
// about) when the test failed.
func launchQEMU(t testing.TB, ns *netnstest.NS, f *qemuFlavour, name, about string, args []string) *guest {
	t.Helper()
	var cmd *exec.Cmd
	if ns != nil {
		// ip netns exec execs in place: the PID we hold is QEMU's.
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns.Name, f.QEMU}, args...)...)
	} else {
		cmd = exec.Command(f.QEMU, args...)
	}
	g := &guest{t: t, name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = g.out
	cmd.Stderr = g.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", f.QEMU, err)
	}
	go func() { cmd.Wait(); close(g.done) }()
	t.Cleanup(func() {
		g.kill()
		if t.Failed() {
			t.Logf("--- console of %s (%s) ---\n%s", g.name, about, g.console())
		}
	})
	return g
}

// guestInitrd writes, into a test directory, the initramfs for one boot: the image at
// base with a second newc archive appended that holds script as /tg/cmd.sh, which
// guest/init runs. The kernel unpacks concatenated archives one over the other
// (init/initramfs.c unpack_to_rootfs reads archives, skipping zero padding between them,
// until the image ends); each must start 4-byte aligned, where it looks for the "0707"
// magic.
func guestInitrd(t testing.TB, base, script string) string {
	t.Helper()
	src, err := os.Open(base)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.CreateTemp(t.TempDir(), "initrd-*.img")
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	n, err := io.Copy(dst, src)
	if err != nil {
		t.Fatalf("copy %s: %v", base, err)
	}
	var a bytes.Buffer
	a.Write(make([]byte, (4-n%4)%4))
	newcEntry(&a, 1, "tg", 0o040755, nil)
	newcEntry(&a, 2, "tg/cmd.sh", 0o100755, []byte(script))
	newcEntry(&a, 0, "TRAILER!!!", 0, nil)
	if _, err := dst.Write(a.Bytes()); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return dst.Name()
}

// newcEntry appends one entry of a "newc" cpio archive, as the kernel parses it
// (init/initramfs.c do_header, do_name, do_copy): a 110-byte header of "070701" and 13
// eight-digit hex fields, the name with its NUL, and the data, each padded to 4 bytes.
// Owner root, mtime 0.
func newcEntry(w *bytes.Buffer, ino int, name string, mode uint32, data []byte) {
	nlink := 1
	if mode&0o040000 != 0 {
		nlink = 2
	}
	fmt.Fprintf(w, "070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	w.WriteString(name)
	w.WriteByte(0)
	w.Write(make([]byte, (4-(110+len(name)+1)%4)%4))
	w.Write(data)
	w.Write(make([]byte, (4-len(data)%4)%4))
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
