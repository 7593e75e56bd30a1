package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
)

// TestConfinement starts tapgro for every port kind with the default --sandbox on and
// reads what the kernel says about the running process: no capability in any set
// (effective, permitted, inheritable, ambient, bounding), no_new_privs, a seccomp
// filter, and a root that is the empty tmpfs holding only what run time opens by name
// (here: the log file's directory). The whole suite runs confined too (the default),
// which is what shows the allow-list is enough.
func TestConfinement(t *testing.T) {
	netnstest.RequirePriv(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(dir, "log")
	if err := os.Mkdir(logDir, 0o700); err != nil {
		t.Fatal(err)
	}
	kinds := []struct{ name, netdev string }{
		{"stream-server", "stream,server=on,addr.type=unix,addr.path=" + filepath.Join(dir, "s.sock")},
		{"stream-client", "stream,server=off,addr.type=inet,addr.host=127.0.0.1,addr.port=5790"},
		{"socket", "socket,listen=127.0.0.1:5791"},
		{"dgram", "dgram,local.type=inet,local.host=127.0.0.1,local.port=5792,remote.type=inet,remote.host=127.0.0.1,remote.port=5793"},
		{"vhost-user-server", "vhost-user,path=" + filepath.Join(dir, "vu.sock")},
		{"vhost-user-client", "vhost-user,path=" + filepath.Join(dir, "vuc.sock") + ",server=off"},
	}
	for i, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			ns := netnstest.New(t, fmt.Sprintf("tgcf%d", i))
			logFile := filepath.Join(logDir, k.name+".log")
			p := startTapgro(t, ns, "tapgro "+k.name, "--tap", "tgc0", "--netdev", k.netdev, "--log-file", logFile)
			waitFile(t, logFile, "tapgro ready", 10*time.Second)
			pid := p.cmd.Process.Pid
			checkConfined(t, pid)
			// The root: nothing but the path down to the kept log directory (and, in a
			// cgo build, the procfs psx needs: Landlock denies all of it but the
			// process's task list).
			var seen []string
			root := fmt.Sprintf("/proc/%d/root", pid)
			if _, err := os.ReadDir(root); err != nil {
				t.Fatalf("tapgro's root: %v", err)
			}
			// WalkDir does not follow a symlink at its root, and /proc/PID/root is one.
			filepath.WalkDir(root+"/", func(path string, d os.DirEntry, err error) error {
				rel := strings.TrimSuffix(strings.TrimPrefix(path, root), "/")
				if err != nil {
					t.Errorf("tapgro's root: %v", err)
					return nil
				}
				if rel == "" {
					return nil
				}
				if rel == "/proc" || rel == logDir {
					seen = append(seen, rel+" (kept)")
					return filepath.SkipDir
				}
				if !strings.HasPrefix(logDir, rel+"/") {
					t.Errorf("tapgro's root holds %s, which is not on the way to the kept %s", rel, logDir)
				}
				seen = append(seen, rel)
				return nil
			})
			log, _ := os.ReadFile(logFile)
			if !strings.Contains(string(log), "sandbox_seccomp=") || !strings.Contains(string(log), `sandbox_caps=none`) {
				t.Errorf("the start-up line does not report the sandbox:\n%s", log)
			}
			t.Logf("%s: root holds %v", k.name, seen)
			p.stop()
		})
	}
}

// checkConfined reads /proc/PID/status: no capability in any set, no_new_privs, a
// seccomp filter.
func checkConfined(t *testing.T, pid int) {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"CapInh": "0000000000000000", "CapPrm": "0000000000000000",
		"CapEff": "0000000000000000", "CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
		"NoNewPrivs": "1", "Seccomp": "2"}
	for _, line := range strings.Split(string(status), "\n") {
		key, val, _ := strings.Cut(line, ":")
		if w, ok := want[key]; ok {
			if strings.TrimSpace(val) != w {
				t.Errorf("/proc/%d/status %s: %s, want %s", pid, key, strings.TrimSpace(val), w)
			}
			delete(want, key)
		}
	}
	if len(want) > 0 {
		t.Errorf("/proc/%d/status lacks %v", pid, want)
	}
}

// waitFile waits until the file at path contains sub.
func waitFile(t *testing.T, path, sub string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), sub) {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("%s: no %q after %v:\n%s", path, sub, limit, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConfinementUnprivileged starts tapgro the way a manager with no privilege to give
// would: as nobody, with a TAP opened for it (--tap-fd, as QEMU's -netdev tap,fd=) in a
// namespace where /dev/net/tun is root's. tapgro then confines itself in a user
// namespace of its own (package sandbox, superviseUserNS): the running process is PID
// 1 of a new PID namespace, maps nobody to 0 and nothing else, holds no capability
// even there, has the empty root; traffic crosses it both ways (the bench front-end,
// integration/vhostrelay, as the guest); the control socket serves nobody and refuses
// root (unmapped, so the kernel reports it as the overflow uid); SIGTERM to the
// supervisor reaches tapgro, which removes its sockets and exits 0.
func TestConfinementUnprivileged(t *testing.T) {
	netnstest.RequirePriv(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux) to start tapgro as nobody")
	}
	relay := vhostrelayBin(t)
	const nobody = 65534
	dir, err := os.MkdirTemp("", "tapgro-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// nobody cannot reach the test binary's build directory: a copy of its own.
	bin := filepath.Join(dir, "tapgro")
	b, err := os.ReadFile(tapgroBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	asNobody := []string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"}

	host, guest := netnstest.New(t, "tgun"), netnstest.New(t, "tgug")
	var tap *os.File
	if err := host.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		tap = os.NewFile(uintptr(fd), "tg0")
		ifr, _ := unix.NewIfreq("tg0")
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}); err != nil {
		t.Fatalf("open tg0: %v", err)
	}
	host.MustRun(t, "ip", "addr", "add", hostIP4+"/24", "dev", "tg0")
	host.MustRun(t, "ip", "link", "set", "tg0", "up")

	sock, ctl, logFile := filepath.Join(dir, "vu.sock"), filepath.Join(dir, "ctl.sock"), filepath.Join(dir, "log")
	argv := append([]string{"netns", "exec", host.Name}, asNobody...)
	argv = append(argv, bin, "--tap-fd", "3", "--netdev", "vhost-user,path="+sock, "--ctl-socket", ctl, "--log-file", logFile)
	cmd := exec.Command("ip", argv...)
	cmd.ExtraFiles = []*os.File{tap}
	p := &proc{t: t, name: "tapgro (nobody)", cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tap.Close() // tapgro holds the queue now
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			l, _ := os.ReadFile(logFile)
			t.Logf("--- log of %s ---\n%s%s", p.name, p.out.String(), l)
		}
	})
	waitFile(t, logFile, "tapgro ready", 10*time.Second)

	// ip netns exec and setpriv exec in place: the PID we hold is the supervisor's.
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
	if err != nil || len(strings.Fields(string(kids))) != 1 {
		t.Fatalf("the supervisor's children: %q, %v", kids, err)
	}
	pid, _ := strconv.Atoi(strings.Fields(string(kids))[0])
	checkConfined(t, pid)
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if !regexp.MustCompile(`(?m)^NSpid:\s+\d+\s+1$`).Match(status) {
		t.Errorf("tapgro is not PID 1 of a PID namespace of its own:\n%s", status)
	}
	if m, _ := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid)); strings.Join(strings.Fields(string(m)), " ") != "0 65534 1" {
		t.Errorf("uid_map %q, want nobody as 0 and nothing else", m)
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/root/", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() != "tmp" && e.Name() != "proc" {
			t.Errorf("tapgro's root holds %s: want only the path to the log directory (and /proc in a cgo build)", e.Name())
		}
	}

	rcmd := exec.Command("ip", "netns", "exec", guest.Name, relay, "-connect", sock, "-tap", "vr0", "-addr", guestIP4+"/24", "-mtu", "1500")
	rout := &syncBuffer{}
	rcmd.Stdout, rcmd.Stderr = rout, rout
	if err := rcmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		rcmd.Process.Kill()
		rcmd.Wait()
		if t.Failed() {
			t.Logf("--- log of vhostrelay ---\n%s", rout.String())
		}
	})
	waitPing(t, guest, hostIP4, 30*time.Second)
	const size = 16 << 20
	transfer(t, guest, host, hostIP4, guestUp, size)
	transfer(t, host, guest, guestIP4, guestDown, size)

	out, err := exec.Command(asNobody[0], append(asNobody[1:], bin, "ctl", "--socket", ctl, "status")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "user (uid 0 inside") {
		t.Errorf("tapgro ctl status as nobody: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "ctl", "--socket", ctl, "status").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "permission denied") {
		t.Errorf("tapgro ctl status as root: %v, want refused (root is unmapped)\n%s", err, out)
	}

	p.stop()
	for _, f := range []string{sock, ctl} {
		if _, err := os.Lstat(f); err == nil {
			t.Errorf("%s left behind after SIGTERM", f)
		}
	}
}
