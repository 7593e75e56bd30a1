//go:build linux

package vhostuser

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/vhostuser/vuproto"
)

// These tests play a hostile front-end: each case breaks tapgro's assumptions about the
// memory and fds it is handed, and must end (or be refused) with the process alive, the
// fault counted, no fd or mapping left behind, and the next session working.

// procCount counts /proc/self/fd entries and /proc/self/maps lines naming a memfd of
// the test guests ("guest-ram"), the back-end's mappings included.
func procCount(t *testing.T) (fds, maps int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	m, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents), bytes.Count(m, []byte("memfd:guest-ram"))
}

// checkBaseline fails the test if fds or guest mappings differ from before, once every
// subtest's cleanup has run. Go's runtime may open a few fds of its own (the poller),
// so the baseline is taken after one session has run.
func checkBaseline(t *testing.T, fds, maps int) {
	t.Helper()
	var f, m int
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if f, m = procCount(t); f == fds && m == maps || time.Now().After(deadline) {
			break
		}
	}
	if f != fds || m != maps {
		t.Fatalf("after the hostile cases: %d fds and %d guest mappings, before %d and %d", f, m, fds, maps)
	}
}

// warmup runs one ordinary session, so the baseline includes what the runtime keeps.
func warmup(t *testing.T) {
	t.Run("warmup", func(t *testing.T) { nextSessionWorks(t) })
}

// nextSessionWorks starts a fresh session and moves one TX chain through it.
func nextSessionWorks(t *testing.T) {
	t.Helper()
	h := startSession(t, opts{})
	r, v := h.Rings[1], h.vr[1]
	b := h.G.Alloc(256, 64)
	r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: b, Len: 100}}))
	iov := make([][]byte, 0, 8)
	batch(t, v, func() {
		c, err := v.Pop(iov)
		if err != nil {
			t.Fatalf("next session: %v", err)
		}
		v.Push(c.Head, 0)
	})
	if len(r.Reap()) != 1 {
		t.Fatal("next session: no used entry")
	}
	h.Stop()
	if err := h.Close(); err != nil {
		t.Fatalf("next session ended with %v", err)
	}
}

// TestMemTableRefused: a region that does not lie inside its file is refused at
// SET_MEM_TABLE (REPLY_ACK 1); the session goes on with the table it had.
func TestMemTableRefused(t *testing.T) {
	warmup(t)
	fds0, maps0 := procCount(t)
	small, err := os.CreateTemp(t.TempDir(), "small-ram")
	if err != nil {
		t.Fatal(err)
	}
	small.Truncate(1 << 20)
	for _, tc := range []struct {
		name string
		regs func(g *vhostusertest.Guest) []vuproto.MemRegion
		fd   func(t *testing.T) int
	}{
		{"offset past the end", func(g *vhostusertest.Guest) []vuproto.MemRegion {
			return []vuproto.MemRegion{{GPA: 0, Size: 0x1000, UserAddr: g.Regions[0].UserAddr, MmapOffset: memSize + 0x1000}}
		}, nil},
		{"region past the memfd, rings there", func(g *vhostusertest.Guest) []vuproto.MemRegion {
			r := g.Regions
			return []vuproto.MemRegion{r[0], {GPA: r[1].GPA, Size: 2 * memSize, UserAddr: r[1].UserAddr, MmapOffset: r[1].MmapOffset}}
		}, nil},
		{"region past the memfd, buffers only", func(g *vhostusertest.Guest) []vuproto.MemRegion {
			r := g.Regions
			return []vuproto.MemRegion{r[0], {GPA: r[1].GPA, Size: r[1].Size + 0x1000, UserAddr: r[1].UserAddr, MmapOffset: r[1].MmapOffset}}
		}, nil},
		{"regular file smaller than the region", func(g *vhostusertest.Guest) []vuproto.MemRegion {
			return []vuproto.MemRegion{{GPA: 0, Size: 2 << 20, UserAddr: g.Regions[0].UserAddr}}
		}, func(*testing.T) int { return int(small.Fd()) }},
		{"a pipe", func(g *vhostusertest.Guest) []vuproto.MemRegion {
			return []vuproto.MemRegion{{GPA: 0, Size: 0x1000, UserAddr: g.Regions[0].UserAddr}}
		}, func(t *testing.T) int {
			var p [2]int
			unix.Pipe2(p[:], unix.O_CLOEXEC)
			t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
			return p[0]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stats := new(Stats)
			h := startSession(t, opts{stats: stats})
			regs := tc.regs(h.G)
			fds := make([]int, len(regs))
			for i := range fds {
				fds[i] = h.G.FD
				if tc.fd != nil {
					fds[i] = tc.fd(t)
				}
			}
			if r := h.FE.Ack(ReqSetMemTable, vhostusertest.MemTablePayload(regs), fds...); r == 0 {
				t.Fatal("SET_MEM_TABLE accepted")
			}
			if stats.Failed.Load() != 1 {
				t.Fatalf("Failed = %d", stats.Failed.Load())
			}
			// The old table is still in force: a chain goes through.
			r, v := h.Rings[1], h.vr[1]
			b := h.G.Alloc(256, 64)
			r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: b, Len: 100}}))
			batch(t, v, func() {
				c, err := v.Pop(make([][]byte, 0, 8))
				if err != nil {
					t.Fatalf("after the refusal: %v", err)
				}
				v.Push(c.Head, 0)
			})
			h.Stop()
			if err := h.Close(); err != nil {
				t.Fatalf("session: %v", err)
			}
			nextSessionWorks(t)
		})
	}
	small.Close()
	checkBaseline(t, fds0, maps0)
}

// faultWorker is a ring worker as vhostnet writes one: panics on fault, Guard at the
// top, and it reads every TX buffer it pops.
func faultWorker(v *Vring, done chan struct{}) {
	defer close(done)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	var faulted bool
	defer v.Guard(&faulted)
	iov := make([][]byte, 0, 64)
	var buf [256]byte
	for {
		if err := v.Wait(); err != nil {
			return
		}
		if err := v.Begin(); err != nil {
			return
		}
		for {
			c, err := v.Pop(iov)
			if err != nil {
				break
			}
			CopyFrom(buf[:], c.Iov, 0)
			v.Push(c.Head, 0)
		}
		v.End()
	}
}

// TestGuestMemoryFault: the front-end truncates guest RAM under running (or about to
// run) rings. The worker's access faults; the fault is recovered, counted, the session
// ends with a FaultError, and the next session works.
func TestGuestMemoryFault(t *testing.T) {
	warmup(t)
	fds0, maps0 := procCount(t)
	const ringsEnd = 0x110000 // startSession's rings lie below, their buffers above
	for _, tc := range []struct {
		name string
		// run truncates and makes the worker touch what is gone.
		run      func(t *testing.T, h *harness)
		skipKick bool
	}{
		{"truncated after SET_MEM_TABLE", func(t *testing.T, h *harness) {
			unix.Ftruncate(h.G.FD, 0x100000) // the rings go
			r := h.Rings[1]
			h.FE.Send(ReqSetVringKick, vuproto.FlagVersion, vhostusertest.U64(1), r.Kick) // the session ends at once
		}, true},
		{"truncated under running rings", func(t *testing.T, h *harness) {
			r := h.Rings[1]
			b := h.G.Alloc(256, 64)
			r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: b, Len: 100}}))
			r.KickNow()
			if !waitUsed(r, 1) {
				t.Fatal("first chain never used")
			}
			unix.Ftruncate(h.G.FD, 0x100000)
			r.KickNow() // the worker wakes and re-arms kicks in the used ring
		}, false},
		{"buffers truncated under running rings", func(t *testing.T, h *harness) {
			r := h.Rings[1]
			b := h.G.Alloc(4096, 4096)
			for b < ringsEnd { // past the rings
				b = h.G.Alloc(4096, 4096)
			}
			unix.Ftruncate(h.G.FD, int64(b)) // region B's offsets are its GPAs
			r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: b, Len: 100}}))
			r.KickNow()
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stats := new(Stats)
			rec := newRecorder()
			workers := map[int]chan struct{}{}
			rec.onStart = func(v *Vring) {
				if v.Index() == 1 {
					done := make(chan struct{})
					workers[1] = done
					go faultWorker(v, done)
				}
			}
			rec.onStop = func(v *Vring) {
				if done := workers[v.Index()]; done != nil {
					<-done
				}
			}
			h := startSession(t, opts{stats: stats, skipKick: tc.skipKick, rec: rec})
			tc.run(t, h)
			var err error
			select {
			case err = <-h.done:
				h.done <- err
			case <-time.After(5 * time.Second):
				t.Fatal("the session did not end after the fault")
			}
			var fe *FaultError
			if !errors.As(err, &fe) || fe.Ring != 1 || fe.Region != 1 {
				t.Fatalf("session ended with %v, want a fault on ring 1 in region 1", err)
			}
			if n := stats.Rejected[RejectFault].Load(); n != 1 {
				t.Fatalf("fault counted %d times", n)
			}
			if !h.Rings[1].Errored() {
				t.Fatal("err eventfd not written")
			}
			nextSessionWorks(t)
		})
	}
	checkBaseline(t, fds0, maps0)
}

func waitUsed(r *vhostusertest.Ring, n int) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if int(uint16(load32(r.Used, 0)>>16)) >= n {
			return true
		}
	}
	return false
}

// TestRingFdsMustBeEventfds: a kick, call or err fd that is not an eventfd ends the
// session with an error that says what it was, at once; the next session is served.
func TestRingFdsMustBeEventfds(t *testing.T) {
	warmup(t)
	fds0, maps0 := procCount(t)
	pipe := func(t *testing.T, eof bool) int {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(p[0]) })
		if eof {
			unix.Close(p[1])
		} else {
			t.Cleanup(func() { unix.Close(p[1]) })
		}
		if eof {
			return p[0]
		}
		// A full pipe: a blocking write to it would never return.
		unix.SetNonblock(p[1], true)
		for {
			if _, err := unix.Write(p[1], make([]byte, 65536)); err != nil {
				break
			}
		}
		unix.SetNonblock(p[1], false)
		return p[1]
	}
	open := func(path string) func(t *testing.T) int {
		return func(t *testing.T) int {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			return int(f.Fd())
		}
	}
	for _, tc := range []struct {
		name string
		req  uint32
		fd   func(t *testing.T) int
		want string
	}{
		{"call: a full pipe", ReqSetVringCall, func(t *testing.T) int { return pipe(t, false) }, "pipe"},
		{"err: a full pipe", ReqSetVringErr, func(t *testing.T) int { return pipe(t, false) }, "pipe"},
		{"kick: a pipe at EOF", ReqSetVringKick, func(t *testing.T) int { return pipe(t, true) }, "pipe"},
		{"kick: a regular file", ReqSetVringKick, open("/proc/self/exe"), "not an eventfd"},
		{"kick: /dev/zero", ReqSetVringKick, open("/dev/zero"), "/dev/zero"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startSession(t, opts{})
			start := time.Now()
			h.FE.Send(tc.req, vuproto.FlagVersion, vhostusertest.U64(1), tc.fd(t))
			var err error
			select {
			case err = <-h.done:
				h.done <- err
			case <-time.After(time.Second):
				t.Fatal("the session goes on with a bad fd")
			}
			if err == nil || !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("session ended with %v, want a protocol error naming %q", err, tc.want)
			}
			t.Logf("%v after %v", err, time.Since(start).Round(time.Millisecond))
			nextSessionWorks(t)
		})
	}
	checkBaseline(t, fds0, maps0)
}

// saturated is a blocking eventfd whose counter is at 2^64-2, the most it holds: one
// more write of 1 would block until someone reads it.
func saturated(t *testing.T) int {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	for i := range b {
		b[i] = 0xff
	}
	b[0] = 0xfe
	if _, err := unix.Write(fd, b[:]); err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestSaturatedEventfds: a call or err eventfd whose counter is full (and that the
// front-end left blocking) costs a dropped signal, never a blocked worker or session.
func TestSaturatedEventfds(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, h *harness)
	}{
		{"call", func(t *testing.T, h *harness) {
			r, v := h.Rings[1], h.vr[1]
			fd := saturated(t)
			h.FE.Send(ReqSetVringCall, vuproto.FlagVersion, vhostusertest.U64(1), fd)
			unix.Close(fd) // nobody else will ever read it
			h.FE.Get(ReqGetFeatures)
			r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: h.G.Alloc(256, 64), Len: 100}}))
			inBackground(t, "a batch that calls", func() {
				batch(t, v, func() {
					c, err := v.Pop(make([][]byte, 0, 8))
					if err != nil {
						t.Errorf("Pop: %v", err)
						return
					}
					v.Push(c.Head, 0)
				})
			})
			if n := h.b.Stats().CallsDropped.Load(); n != 1 {
				t.Fatalf("CallsDropped = %d", n)
			}
		}},
		{"call replaced on a running ring", func(t *testing.T, h *harness) {
			r, v := h.Rings[1], h.vr[1]
			r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: h.G.Alloc(256, 64), Len: 100}}))
			batch(t, v, func() {
				c, _ := v.Pop(make([][]byte, 0, 8))
				v.Push(c.Head, 0)
			})
			fd := saturated(t)
			// Entries are published, so the new fd is signalled at once.
			h.FE.Send(ReqSetVringCall, vuproto.FlagVersion, vhostusertest.U64(1), fd)
			unix.Close(fd)
		}},
		{"err", func(t *testing.T, h *harness) {
			r, v := h.Rings[1], h.vr[1]
			fd := saturated(t)
			h.FE.Send(ReqSetVringErr, vuproto.FlagVersion, vhostusertest.U64(1), fd)
			unix.Close(fd)
			h.FE.Get(ReqGetFeatures)
			r.Publish(uint16(r.Num + 3)) // a head out of range: the ring breaks, err is signalled
			inBackground(t, "a batch that breaks the ring", func() {
				batch(t, v, func() { v.Pop(make([][]byte, 0, 8)) })
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startSession(t, opts{stats: new(Stats)})
			tc.run(t, h)
			inBackground(t, "GET_FEATURES", func() { h.FE.Get(ReqGetFeatures) })
			inBackground(t, "GET_VRING_BASE", func() { h.Stop() })
			if err := h.Close(); err != nil {
				t.Fatalf("session: %v", err)
			}
			nextSessionWorks(t)
		})
	}
}

// inBackground runs fn and fails the test if it has not returned within a second.
func inBackground(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatalf("%s blocked", what)
	}
}

// TestKickStorm: a kick that keeps ending the worker's wait with no work stops the ring
// instead of spinning a core. The session refuses fds that are not eventfds
// (TestRingFdsMustBeEventfds); this puts one in directly: /dev/zero, which the poller
// cannot wait on, so every wait fails at once.
func TestKickStorm(t *testing.T) {
	stats := new(Stats)
	h := startSession(t, opts{stats: stats})
	v := h.vr[1]
	z, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := z.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	v.mu.Lock()
	v.kick.Close()
	v.kick, v.kickRC = z, rc
	v.mu.Unlock()
	if err := v.Wait(); !errors.Is(err, ErrBroken) {
		t.Fatalf("Wait: %v", err)
	}
	if n := stats.Rejected[RejectKick].Load(); n != 1 {
		t.Fatalf("kick counted %d times", n)
	}
	if !h.Rings[1].Errored() {
		t.Fatal("err eventfd not written")
	}
	h.Stop()
}

// TestPollBackoff: a ring kicked by polling (no kick fd) sleeps 50 µs after work and
// doubles that while it stays empty, up to pollMax.
func TestPollBackoff(t *testing.T) {
	v := newVring(1, false, new(Stats))
	want := pollMin
	for range 12 {
		if err := v.sleep(nil, true); err != nil {
			t.Fatal(err)
		}
		if v.pollWait != want {
			t.Fatalf("poll wait %v, want %v", v.pollWait, want)
		}
		want = min(2*want, pollMax)
	}
	if v.pollWait != pollMax {
		t.Fatalf("backoff stops at %v, want %v", v.pollWait, pollMax)
	}
	if err := v.sleep(nil, false); !errors.Is(err, ErrStopped) {
		t.Fatalf("no kick and no polling: %v", err)
	}
}

// TestBaseOfUnstartedRing: GET_VRING_BASE on a ring that never started answers what
// SET_VRING_BASE set, as libvhost-user, DPDK and rust-vmm do.
func TestBaseOfUnstartedRing(t *testing.T) {
	h := startSession(t, opts{skipKick: true})
	h.FE.Send(ReqSetVringBase, vuproto.FlagVersion, vhostusertest.State(0, 77))
	h.FE.Send(ReqGetVringBase, vuproto.FlagVersion, vhostusertest.State(0, 0))
	p := h.FE.Reply(ReqGetVringBase, 8)
	if got := binary.LittleEndian.Uint32(p[4:]); got != 77 {
		t.Fatalf("GET_VRING_BASE of an unstarted ring: %d, want 77", got)
	}
}

// TestInFlightLimit: a driver that makes more chains available than the ring holds,
// counting those tapgro holds popped but not yet published, breaks the ring.
func TestInFlightLimit(t *testing.T) {
	stats := new(Stats)
	h := startSession(t, opts{stats: stats, num: 16})
	r, v := h.Rings[1], h.vr[1]
	b := h.G.Alloc(256, 64)
	var heads []uint16
	for range r.Num {
		heads = append(heads, r.AddChain([]vhostusertest.Seg{{GPA: b, Len: 100}}))
	}
	r.Publish(heads...)
	iov := make([][]byte, 0, 8)
	if err := v.Begin(); err != nil {
		t.Fatal(err)
	}
	for range r.Num {
		c, err := v.Pop(iov)
		if err != nil {
			t.Fatal(err)
		}
		v.Push(c.Head, 0) // pushed, not yet published
	}
	r.Publish(heads[0]) // a 17th chain while 16 are unpublished: a head reused
	_, err := v.Pop(iov)
	v.End()
	var re *RingError
	if !errors.As(err, &re) || re.Reason != RejectAvailJump {
		t.Fatalf("Pop past the ring size: %v", err)
	}
	if stats.Rejected[RejectAvailJump].Load() != 1 {
		t.Fatal("not counted")
	}
}

// TestUnsealedMemfdReported: guest RAM in a memfd that can shrink is accepted and
// reported once per table; one sealed with F_SEAL_SHRINK (QEMU's memory-backend-memfd
// default) is not reported.
func TestUnsealedMemfdReported(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	logf := func(format string, a ...any) {
		mu.Lock()
		lines = append(lines, fmt.Sprintf(format, a...))
		mu.Unlock()
	}
	h := startSession(t, opts{logf: logf})
	mu.Lock()
	n := len(lines)
	mu.Unlock()
	if n != 1 || !strings.Contains(lines[0], "not sealed against shrinking") {
		t.Fatalf("log %q, want one line about the unsealed memfd", lines)
	}
	h.Stop()
	h.Close()

	fd, err := unix.MemfdCreate("guest-ram", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, 1<<20)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		t.Fatal(err)
	}
	var mt vuproto.MemTable
	mt.N = 1
	mt.Regions[0] = vuproto.MemRegion{GPA: 0, Size: 1 << 20, UserAddr: 1 << 30}
	dup, _ := unix.Dup(fd)
	g, warn, err := mapMemTable(&mt, []int{dup}, testMemPolicy, 0)
	if err != nil || warn != "" {
		t.Fatalf("sealed memfd: %v, warning %q", err, warn)
	}
	g.unmap()
}

// TestGuestMemoryNotDumped: the back-end's mappings of guest RAM carry MADV_DONTDUMP
// (VmFlags "dd" in /proc/self/smaps), so a core dump of tapgro holds no guest memory;
// the front-end double's own mapping does not.
func TestGuestMemoryNotDumped(t *testing.T) {
	h := startSession(t, opts{})
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var guest, dd int
	inGuest := false
	for _, line := range strings.Split(string(smaps), "\n") {
		if f := strings.Fields(line); len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			inGuest = strings.Contains(line, "memfd:guest-ram")
			if inGuest {
				guest++
			}
			continue
		}
		if inGuest && strings.HasPrefix(line, "VmFlags:") && strings.Contains(line+" ", " dd ") {
			dd++
		}
	}
	// The double maps the memfd once; the back-end maps each of its two regions.
	if guest != 3 || dd != 2 {
		t.Fatalf("%d mappings of guest RAM, %d of them not dumped; want 3 and 2", guest, dd)
	}
	h.Stop()
}

// TestFaultInSleepLook: sleep's first look at avail->idx (awaitKickFd) reads guest
// memory with mu held, like waitAvail; a fault there must reach Guard knowing that, or
// Guard would take mu a second time and the worker would hang instead of ending the
// session.
func TestFaultInSleepLook(t *testing.T) {
	h := startSession(t, opts{})
	v := h.vr[1]
	unix.Ftruncate(h.G.FD, 0x100000) // the rings go
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		var faulted bool
		defer v.Guard(&faulted)
		v.kickWoke, v.waitWatch = false, false
		v.awaitKickFd(0)
		t.Error("the look at a truncated ring did not fault")
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the worker hung after a fault in sleep's look")
	}
	select {
	case err := <-h.done:
		h.done <- err
		var fe *FaultError
		if !errors.As(err, &fe) || fe.Ring != 1 {
			t.Fatalf("session ended with %v, want a fault on ring 1", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the session did not end after the fault")
	}
	nextSessionWorks(t)
}
