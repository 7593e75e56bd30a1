//go:build linux

package integration

import (
	"bytes"
	"encoding/binary"
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
	"tapgro/vhostuser/vuproto"
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
	// --vhost-poll: Poke writes to the kick, one of the writes a front-end can block.
	tg := startTapgro(t, ns, "tapgro", "--tap", "tg0", "--mtu", "1500", "--addr", hostIP4+"/24",
		"--netdev", "vhost-user,path="+sock, "--metrics-addr", maddr, "--vhost-poll", "50us",
		"--vhost-max-mapped", "64G")
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
	// handJammed hands ring 1 a saturated eventfd with req and, once tapgro took it and
	// made it non-blocking, makes it blocking again: the flag belongs to the open file
	// both hold, and the front-end keeps its copy.
	handJammed := func(t *testing.T, s *vhostusertest.Session, req uint32) {
		fd := saturated(t)
		s.FE.Send(req, 1, vhostusertest.U64(1), fd)
		s.FE.Get(vhostuser.ReqGetFeatures) // the message that carried fd was handled
		if err := unix.SetNonblock(fd, false); err != nil {
			t.Fatal(err)
		}
	}
	onExt4 := func(t *testing.T, size int64) int {
		f, err := os.CreateTemp(".", "guest-ram-") // the package directory: the disk's filesystem
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(f.Name())
		var st unix.Statfs_t
		unix.Fstatfs(int(f.Fd()), &st)
		if st.Type == unix.TMPFS_MAGIC {
			t.Skip("the package directory is on tmpfs")
		}
		f.Truncate(size)
		fd, _ := unix.Dup(int(f.Fd()))
		f.Close()
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	for _, tc := range []struct {
		name string
		// run misbehaves on s; closed says tapgro must end the session (within 4 s: a
		// write asleep on an eventfd is noticed within two seconds).
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
		{"call fd re-blocked after the ack, then a TX batch", func(t *testing.T, s *vhostusertest.Session) {
			handJammed(t, s, vhostuser.ReqSetVringCall)
			tx := s.TX(0)
			tx.SendFrame(append(make([]byte, s.HdrLen()), ethFrame([]byte{2, 0, 0, 0, 0, 2}, 200, 1)...), nil, false)
			tx.KickNow()
			metricsAnswer(t)
		}, true},
		{"err fd re-blocked, then a SET_MEM_TABLE without the rings", func(t *testing.T, s *vhostusertest.Session) {
			handJammed(t, s, vhostuser.ReqSetVringErr)
			g := s.G.Regions
			last := g[len(g)-1]
			s.FE.Send(vhostuser.ReqSetMemTable, 1, vhostusertest.MemTablePayload([]vuproto.MemRegion{
				{GPA: last.GPA + last.Size, Size: 0x1000, UserAddr: last.UserAddr + last.Size}}), s.G.FD)
			metricsAnswer(t)
		}, true},
		{"err fd re-blocked, then a looping chain", func(t *testing.T, s *vhostusertest.Session) {
			handJammed(t, s, vhostuser.ReqSetVringErr)
			tx := s.TX(0)
			head := tx.PrepareFrame(append(make([]byte, s.HdrLen()), ethFrame([]byte{2, 0, 0, 0, 0, 2}, 200, 1)...), []int{20}, false)
			d := tx.Desc[16*int(head):]
			next := binary.LittleEndian.Uint16(d[14:])
			nd := tx.Desc[16*int(next):]
			binary.LittleEndian.PutUint16(nd[12:], 1)    // NEXT
			binary.LittleEndian.PutUint16(nd[14:], head) // back to the head
			tx.Publish(head)
			tx.KickNow()
			metricsAnswer(t)
		}, true},
		{"TX kick re-blocked, then Poke writes it", func(t *testing.T, s *vhostusertest.Session) {
			handJammed(t, s, vhostuser.ReqSetVringKick)
			s.RX(0).PostRX(64, 2048, 1)
			// Frames into the TAP (a ping's ARP requests): the RX worker hands them to
			// the guest and pokes the TX worker through its kick.
			go ns.Run("ping", "-c", "3", "-i", "0.2", "-W", "1", "198.18.0.77")
			time.Sleep(300 * time.Millisecond)
			metricsAnswer(t)
		}, true},
		{"guest RAM on a regular file of the disk's filesystem", func(t *testing.T, s *vhostusertest.Session) {
			regs := []vuproto.MemRegion{{GPA: 0, Size: 1 << 20, UserAddr: 1 << 40}}
			if r := s.FE.Ack(vhostuser.ReqSetMemTable, vhostusertest.MemTablePayload(regs), onExt4(t, 1<<20)); r == 0 {
				t.Fatal("guest RAM on a disk file accepted")
			}
		}, false},
		{"dirty log on a regular file of the disk's filesystem", func(t *testing.T, s *vhostusertest.Session) {
			s.FE.Send(vhostuser.ReqSetLogBase, 1, append(vhostusertest.U64(4096), vhostusertest.U64(0)...), onExt4(t, 4096))
		}, true},
		{"sparse regions over the cap", func(t *testing.T, s *vhostusertest.Session) {
			fd, _ := unix.MemfdCreate("sparse", unix.MFD_CLOEXEC)
			t.Cleanup(func() { unix.Close(fd) })
			unix.Ftruncate(fd, 48<<30)
			regs := []vuproto.MemRegion{{GPA: 0, Size: 40 << 30, UserAddr: 1 << 40}, {GPA: 40 << 30, Size: 40 << 30, UserAddr: 1<<40 + 40<<30, MmapOffset: 8 << 30}}
			if r := s.FE.Ack(vhostuser.ReqSetMemTable, vhostusertest.MemTablePayload(regs), fd, fd); r == 0 {
				t.Fatal("96 GiB of mappings accepted under a 64 GiB cap")
			}
		}, false},
		{"avail idx moved backwards", func(t *testing.T, s *vhostusertest.Session) {
			tx := s.TX(0)
			for i := range 3 {
				tx.SendFrame(append(make([]byte, s.HdrLen()), ethFrame([]byte{2, 0, 0, 0, 0, 2}, 200, byte(i))...), nil, false)
			}
			tx.KickNow()
			if !tx.WaitUsed(tx.AvailIdx(), 5*time.Second) {
				t.Fatal("frames not taken")
			}
			idx := binary.LittleEndian.Uint16(tx.Avail[2:])
			binary.LittleEndian.PutUint16(tx.Avail[2:], idx-2)
			tx.KickNow()
			s.FE.Get(vhostuser.ReqGetFeatures)
			time.Sleep(100 * time.Millisecond)
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
			if tc.closed && !closedByPeer(s.FE.FD, 4*time.Second) {
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
	if v := m.get(t, `tapgro_vhost_sessions_jammed_total`); v != 4 {
		t.Errorf("sessions ended for a jammed eventfd: %v, want 4", v)
	}
	if v := m.get(t, `tapgro_vhost_rejected_total{reason="avail_jump"}`); v != 1 {
		t.Errorf("avail->idx moved back: %v rejections counted, want 1", v)
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

// TestVhostUserSilentPeer: a connection that never speaks, or stops half way through a
// header, holds tapgro's one session no longer than its handshake timeout, and a
// front-end that arrives meanwhile is held (not refused) and then served.
func TestVhostUserSilentPeer(t *testing.T) {
	netnstest.RequirePriv(t)
	ns := netnstest.New(t, "vusilent")
	sock := filepath.Join(t.TempDir(), "vu.sock")
	tg := startTapgro(t, ns, "tapgro", "--tap", "tg0", "--mtu", "1500", "--addr", hostIP4+"/24",
		"--netdev", "vhost-user,path="+sock)
	tg.waitLog(readyRe, 10*time.Second)
	for _, first := range [][]byte{nil, {1, 0, 0, 0, 1}} {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
			t.Fatal(err)
		}
		if first != nil {
			unix.Write(fd, first)
		}
		time.Sleep(200 * time.Millisecond) // the silent peer is the session now
		start := time.Now()
		s := vhostusertest.Dial(t, sock, vhostusertest.Options{})
		waited := time.Since(start)
		tx := s.TX(0)
		tx.SendFrame(append(make([]byte, s.HdrLen()), ethFrame([]byte{2, 0, 0, 0, 0, 2}, 300, 1)...), nil, false)
		tx.KickNow()
		if !tx.WaitUsed(tx.AvailIdx(), 5*time.Second) {
			t.Fatal("the front-end after the silent peer carries no frame")
		}
		t.Logf("silent peer (%d bytes sent): the next front-end was served after %v", len(first), waited.Round(time.Millisecond))
		if !closedByPeer(fd, time.Second) {
			t.Error("the silent peer's connection is still open")
		}
		unix.Close(fd)
		s.Stop()
		s.Close()
	}
}
