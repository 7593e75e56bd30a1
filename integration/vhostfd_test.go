//go:build linux

package integration

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
	"tapgro/vhostuser/vhostusertest"
)

// TestVhostUserFD: QEMU's back-end program convention --fd=N (docs/interop/vhost-user.rst
// "Backend program conventions"), as a manager uses it. A listening socket passed as fd 3
// is served like one tapgro binds: a front-end connects, its session runs, and a second
// one after it. A connected socket passed as fd 3 is served for its one session; when
// the front-end hangs up, tapgro exits 0 on its own.
func TestVhostUserFD(t *testing.T) {
	netnstest.RequirePriv(t)
	t.Run("listening", func(t *testing.T) {
		ns := netnstest.New(t, "vufdl")
		path := filepath.Join(t.TempDir(), "vu.sock")
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		f, err := ln.File()
		ln.SetUnlinkOnClose(false) // the path stays: tapgro serves it through the fd
		ln.Close()
		if err != nil {
			t.Fatal(err)
		}
		tg := startTapgroFiles(t, ns, "tapgro", []*os.File{f}, false, "--tap", "tg0", "--fd", "3", "--ctl-socket", "")
		f.Close()
		tg.waitLog(regexp.MustCompile(`tapgro ready \(vhost-user, on the socket passed as --fd\)`), 10*time.Second)
		for range 2 {
			s := vhostusertest.Dial(t, path, vhostusertest.Options{})
			if s.Offered == 0 {
				t.Fatal("no features offered")
			}
			s.Close()
		}
		tg.stop()
	})
	t.Run("connected", func(t *testing.T) {
		ns := netnstest.New(t, "vufdc")
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		theirs := os.NewFile(uintptr(sp[1]), "backend end")
		tg := startTapgroFiles(t, ns, "tapgro", []*os.File{theirs}, false, "--tap", "tg0", "--fd", "3", "--ctl-socket", "")
		theirs.Close()
		s := vhostusertest.Over(t, sp[0], vhostusertest.Options{})
		if s.Offered == 0 {
			t.Fatal("no features offered")
		}
		s.Close()
		select {
		case <-tg.done:
		case <-time.After(10 * time.Second):
			t.Fatal("tapgro did not exit after the front-end of its --fd connection hung up")
		}
		if code := tg.cmd.ProcessState.ExitCode(); code != 0 {
			t.Fatalf("tapgro exited %d\n%s", code, tg.out.String())
		}
		tg.waitLog(regexp.MustCompile(`handed over with --fd has ended; exiting`), time.Second)
	})
}
