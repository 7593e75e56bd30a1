//go:build linux

package integration

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// sharedDir makes a directory with exactly mode (chmod after mkdir: the umask would strip
// the write bits for group and others).
func sharedDir(t *testing.T, mode fs.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tapgro-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSocketDirUnsafe: tapgro refuses to create its port socket or its control socket in
// a directory every user may write that has no sticky bit (anyone could swap the socket
// for their own listener, and QEMU would connect to that), says why and how to proceed,
// and leaves nothing behind. --allow-unsafe-dir, or the sticky bit, lets it start.
func TestSocketDirUnsafe(t *testing.T) {
	netnstest.RequirePriv(t)
	a := netnstest.New(t, "a")
	unsafe := sharedDir(t, 0o777)
	sticky := sharedDir(t, 0o777|fs.ModeSticky)
	safe := openDir(t, 0)
	args := func(port, ctl string, more ...string) []string {
		nd := "stream,server=on,addr.type=unix,addr.path=" + port
		return tapArgs("198.18.0.1/24", "fd00:198:18::1/64", append([]string{"--netdev", nd, "--ctl-socket", ctl}, more...)...)
	}
	refused := func(name, path string, argv []string) {
		t.Helper()
		p := startTapgro(t, a, name, argv...)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			p.kill()
			t.Fatalf("%s: still running in a 0777 directory:\n%s", name, p.out.String())
		}
		out := p.out.String()
		if p.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(out, "--allow-unsafe-dir") ||
			!strings.Contains(out, "no sticky bit") || !strings.Contains(out, filepath.Dir(path)) {
			t.Errorf("%s: exit %d, want a failure naming the directory, the sticky bit and --allow-unsafe-dir:\n%s",
				name, p.cmd.ProcessState.ExitCode(), out)
		}
		if _, err := os.Lstat(path); err == nil {
			t.Errorf("%s: refused, yet %s was created", name, path)
		}
	}
	refused("port in 0777", filepath.Join(unsafe, "p.sock"), args(filepath.Join(unsafe, "p.sock"), filepath.Join(safe, "c.ctl")))
	refused("ctl in 0777", filepath.Join(unsafe, "c.ctl"), args(filepath.Join(safe, "p.sock"), filepath.Join(unsafe, "c.ctl")))

	started := func(name, dir string, more ...string) {
		t.Helper()
		port, ctl := filepath.Join(dir, "p.sock"), filepath.Join(dir, "c.ctl")
		p := startTapgro(t, a, name, args(port, ctl, more...)...)
		p.waitLog(readyRe, 20*time.Second)
		for _, path := range []string{port, ctl} {
			if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: %s is %v (%v), want a 0600 socket", name, path, fi, err)
			}
		}
		p.stop()
		for _, path := range []string{port, ctl} {
			if _, err := os.Lstat(path); err == nil {
				t.Errorf("%s: %s left behind after a clean exit", name, path)
			}
		}
	}
	started("0777 with --allow-unsafe-dir", unsafe, "--allow-unsafe-dir")
	started("1777 (sticky)", sticky)
}
