//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
	"tapgro/vhostuser"
	"tapgro/vhostuser/vhostusertest"
)

// TestVhostUserHostileFrontEnd plays front-ends that hand a real tapgro process fds and
// memory meant to crash, freeze or spin it. After each, tapgro must answer /metrics,
// serve the next front-end within a second, and end up with the fds, mappings and
// resident memory it had before.
func TestVhostUserHostileFrontEnd(t *testing.T) {
	netnstest.RequirePriv(t)
	ns := netnstest.New(t, "vuhostile")
	sock := filepath.Join(t.TempDir(), "vu.sock")
	const maddr = "127.0.0.1:9113"
	tg := startTapgro(t, ns, "tapgro", "--tap", "tg0", "--mtu", "1500", "--addr", hostIP4+"/24",
		"--netdev", "vhost-user,path="+sock, "--metrics-addr", maddr)
	tg.waitLog(readyRe, 10*time.Second)
	pid := tg.cmd.Process.Pid

	// works: a legitimate front-end is served within a second and its frame crosses.
	works := func(t *testing.T) {
		t.Helper()
		start := time.Now()
		s := vhostusertest.Dial(t, sock, vhostusertest.Options{ConnectWait: time.Second})
		if d := time.Since(start); d > time.Second {
			t.Errorf("the next front-end waited %v for its set-up to be answered", d)
		}
		tx := s.TX(0)
		tx.SendFrame(append(make([]byte, s.HdrLen()), ethFrame([]byte{2, 0, 0, 0, 0, 2}, 300, 1)...), nil, false)
		tx.KickNow()
		if !tx.WaitUsed(tx.AvailIdx(), 5*time.Second) {
			t.Fatal("the next front-end's frame was not taken")
		}
		s.Stop()
		s.Close()
	}
	metricsAnswer := func(t *testing.T) samples {
		t.Helper()
		done := make(chan samples, 1)
		go func() { done <- scrapeQuiet(ns, maddr) }()
		select {
		case m := <-done:
			if len(m) == 0 {
				t.Fatal("/metrics did not answer")
			}
			return m
		case <-time.After(time.Second):
			t.Fatal("/metrics did not answer within a second")
		}
		return nil
	}
	for range 5 {
		works(t) // the runtime's heap grows to its working size over the first sessions
	}
	// The session's teardown ends just after the front-end sees its socket close: wait
	// for the fd count to settle before taking it as the baseline.
	fds0 := procFds(t, pid)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		n := procFds(t, pid)
		if n == fds0 {
			break
		}
		fds0 = n
	}
	rss0 := procRSS(t, pid)

	fullPipe := func(t *testing.T) int {
		var p [2]int
		unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK)
		for {
			if _, err := unix.Write(p[1], make([]byte, 65536)); err != nil {
				break
			}
		}
		unix.SetNonblock(p[1], false)
		t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
		return p[1]
	}
	saturated := func(t *testing.T) int {
		fd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC) // blocking
		var b [8]byte
		for i := range b {
			b[i] = 0xff
		}
		b[0] = 0xfe // 2^64-2: a write of 1 more would block
		unix.Write(fd, b[:])
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	for _, tc := range []struct {
		name string
		// run misbehaves on s; closed says tapgro must end the session.
		run    func(t *testing.T, s *vhostusertest.Session)
		closed bool
	}{
		{"call fd a full pipe", func(t *testing.T, s *vhostusertest.Session) {
			s.FE.Send(vhostuser.ReqSetVringCall, 1, vhostusertest.U64(1), fullPipe(t))
		}, true},
		{"err fd a full pipe", func(t *testing.T, s *vhostusertest.Session) {
			s.FE.Send(vhostuser.ReqSetVringErr, 1, vhostusertest.U64(1), fullPipe(t))
		}, true},
		{"kick fd /dev/zero", func(t *testing.T, s *vhostusertest.Session) {
			f, err := os.Open("/dev/zero")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			s.FE.Send(vhostuser.ReqSetVringKick, 1, vhostusertest.U64(1), int(f.Fd()))
		}, true},
		{"call fd a saturated blocking eventfd", func(t *testing.T, s *vhostusertest.Session) {
			s.FE.Send(vhostuser.ReqSetVringCall, 1, vhostusertest.U64(1), saturated(t))
			tx := s.TX(0)
			for i := range 5 {
				tx.SendFrame(append(make([]byte, s.HdrLen()), ethFrame([]byte{2, 0, 0, 0, 0, 2}, 200, byte(i))...), nil, false)
				tx.KickNow()
			}
			if !tx.WaitUsed(tx.AvailIdx(), 5*time.Second) {
				t.Fatal("frames not taken with a saturated call fd")
			}
			s.FE.Get(vhostuser.ReqGetFeatures)
		}, false},
		{"guest RAM truncated under running rings", func(t *testing.T, s *vhostusertest.Session) {
			tx := s.TX(0)
			head := tx.PrepareFrame(append(make([]byte, s.HdrLen()), ethFrame([]byte{2, 0, 0, 0, 0, 2}, 200, 9)...), nil, false)
			unix.Ftruncate(s.G.FD, int64(tx.Slot(0))) // region B's file offsets are its GPAs
			tx.Publish(head)
			tx.KickNow()
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := vhostusertest.Dial(t, sock, vhostusertest.Options{ConnectWait: time.Second})
			tc.run(t, s)
			if tc.closed && !closedByPeer(s.FE.FD, 2*time.Second) {
				t.Fatal("tapgro did not end the session")
			}
			metricsAnswer(t)
			if !tc.closed {
				s.Stop()
			}
			s.Close()
			works(t)
			metricsAnswer(t)
		})
	}
	m := metricsAnswer(t)
	if v := m.get(t, `tapgro_vhost_rejected_total{reason="fault"}`); v != 1 {
		t.Errorf("faults counted: %v, want 1", v)
	}
	if v := m.get(t, `tapgro_vhost_calls_dropped_total`); v < 1 {
		t.Errorf("calls dropped: %v, want at least 1", v)
	}
	if n := strings.Count(tg.out.String(), "guest memory fault"); n != 1 {
		t.Errorf("the fault is logged %d times, want once:\n%s", n, tg.out.String())
	}
	// Back to what it had: the same fds, no mapping of any guest's RAM, and resident
	// memory within a few MiB (the runtime keeps what it allocated for the sessions).
	var fds int
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if fds = procFds(t, pid); fds == fds0 || time.Now().After(deadline) {
			break
		}
	}
	if fds != fds0 {
		t.Errorf("tapgro has %d fds, %d before the hostile front-ends", fds, fds0)
	}
	maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if n := bytes.Count(maps, []byte("memfd:guest-ram")); n != 0 {
		t.Errorf("tapgro still maps %d regions of guest RAM", n)
	}
	for range 5 {
		works(t) // as many sessions as before the baseline: the heap at its working size
	}
	if rss := procRSS(t, pid); rss > rss0+8<<20 {
		t.Errorf("tapgro's RSS %d KiB, %d KiB before", rss>>10, rss0>>10)
	} else {
		t.Logf("fds %d → %d, RSS %d → %d KiB", fds0, fds, rss0>>10, rss>>10)
	}
}

// closedByPeer waits up to d for the other end of the socket fd to close it.
func closedByPeer(fd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	var b [64]byte
	for time.Now().Before(deadline) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, 50); n == 0 {
			continue
		}
		n, err := unix.Read(fd, b[:])
		if n == 0 || err != nil && err != unix.EINTR && err != unix.EAGAIN {
			return true
		}
	}
	return false
}

func procFds(t *testing.T, pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

var vmRSSRe = regexp.MustCompile(`VmRSS:\s+(\d+) kB`)

func procRSS(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := vmRSSRe.FindSubmatch(b)
	if m == nil {
		t.Fatal("no VmRSS")
	}
	kb, _ := strconv.Atoi(string(m[1]))
	return kb << 10
}
