//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/vhostuser/vuproto"
)

// What a front-end that means harm can do to the back-end itself, beyond breaking its
// own rings (hardening_test.go, hostile_test.go): stop the process, exhaust its address
// space or memory, or hold the socket.

// blockedEventfd is a front-end's revenge on O_NONBLOCK: an eventfd with a full counter
// (so the next write sleeps) that the back-end receives, makes non-blocking, and that
// the front-end then makes blocking again through its own copy of the same open file.
// The front-end keeps its copy, as a hostile one would.
type blockedEventfd struct{ fd int }

func newBlocked(t *testing.T) *blockedEventfd {
	b := &blockedEventfd{fd: saturated(t)}
	t.Cleanup(func() { unix.Close(b.fd) })
	return b
}

// reblock clears O_NONBLOCK again: after the back-end acked the message that carried it.
func (b *blockedEventfd) reblock(t *testing.T) {
	if err := unix.SetNonblock(b.fd, false); err != nil {
		t.Fatal(err)
	}
}

// alive checks that the whole runtime still runs: a garbage collection stops the world,
// which a goroutine asleep in a raw system call would prevent for as long as it sleeps.
func alive(t *testing.T, when string) {
	t.Helper()
	done := make(chan struct{})
	go func() { runtime.GC(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatalf("%s: a garbage collection did not finish within 2 s: the runtime is stopped", when)
	}
}

// TestBlockedEventfds: a call, err or kick eventfd the front-end made blocking with a
// full counter costs that front-end its signals and its session: the write that sleeps
// parks one goroutine's thread, the runtime goes on, the session ends with a JamError,
// and the next session is served. Each signal path the back-end has is tried.
func TestBlockedEventfds(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ring    int
		req     uint32
		trigger func(t *testing.T, h *harness) (worker chan struct{})
	}{
		{"call after a TX batch", 1, ReqSetVringCall, func(t *testing.T, h *harness) chan struct{} {
			r, v := h.Rings[1], h.vr[1]
			r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: h.G.Alloc(256, 64), Len: 100}}))
			return inWorker(func() {
				if v.Begin() != nil {
					return
				}
				if c, err := v.Pop(make([][]byte, 0, 8)); err == nil {
					v.Push(c.Head, 0)
				}
				v.End() // the call, which sleeps
			})
		}},
		{"err from a looping chain", 1, ReqSetVringErr, func(t *testing.T, h *harness) chan struct{} {
			r, v := h.Rings[1], h.vr[1]
			a := h.G.Alloc(64, 64)
			head := r.AddChain([]vhostusertest.Seg{{GPA: a, Len: 10}, {GPA: a, Len: 10}})
			d := r.Desc[16*int(head):]
			next := binary.LittleEndian.Uint16(d[14:])
			nd := r.Desc[16*int(next):]
			binary.LittleEndian.PutUint16(nd[12:], 1)    // NEXT
			binary.LittleEndian.PutUint16(nd[14:], head) // back to the head: a loop
			r.Publish(head)
			return inWorker(func() {
				if v.Begin() != nil {
					return
				}
				v.Pop(make([][]byte, 0, 64))
				v.End() // the err signal, which sleeps
			})
		}},
		{"err after SET_MEM_TABLE drops the rings' region", 1, ReqSetVringErr, func(t *testing.T, h *harness) chan struct{} {
			// A table without the region the rings are in: the session's own
			// re-translation fails and signals err, on the session goroutine.
			g := h.G.Regions
			last := g[len(g)-1]
			h.FE.Send(ReqSetMemTable, vuproto.FlagVersion, vhostusertest.MemTablePayload([]vuproto.MemRegion{
				{GPA: last.GPA + last.Size, Size: 0x1000, UserAddr: last.UserAddr + last.Size, MmapOffset: 0}}), h.G.FD)
			return nil
		}},
		{"kick written by Poke", 1, ReqSetVringKick, func(t *testing.T, h *harness) chan struct{} {
			v := h.vr[1]
			v.SetPollWindow(time.Millisecond)
			w := inWorker(func() { v.Wait() })
			deadline := time.Now().Add(2 * time.Second)
			for !v.parked.Load() && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			go v.Poke() // the write to the kick, which sleeps
			return w
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stats := new(Stats)
			h := startSession(t, opts{stats: stats})
			b := newBlocked(t)
			h.FE.Send(tc.req, vuproto.FlagVersion, vhostusertest.U64(uint64(tc.ring)), b.fd)
			h.FE.Get(ReqGetFeatures) // handled: the back-end has made it non-blocking
			b.reblock(t)
			worker := tc.trigger(t, h)
			alive(t, "with a write asleep on the front-end's eventfd")
			var err error
			select {
			case err = <-h.done:
				h.done <- err
			case <-time.After(watchEvery + jamLimit + 3*time.Second):
				t.Fatal("the session did not end")
			}
			var je *JamError
			if !errors.As(err, &je) || je.Ring != tc.ring {
				t.Fatalf("session ended with %v, want a JamError for ring %d", err, tc.ring)
			}
			if stats.Jammed.Load() != 1 {
				t.Fatalf("Jammed = %d", stats.Jammed.Load())
			}
			if worker != nil {
				select {
				case <-worker:
				case <-time.After(2 * time.Second):
					t.Fatal("the worker's write did not return after the session ended")
				}
			}
			alive(t, "after the session")
			h.Close()
			nextSessionWorks(t)
		})
	}
}

func inWorker(fn func()) chan struct{} {
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	return done
}

// TestMemoryFilesystem: guest RAM and the dirty log are taken only from tmpfs and
// hugetlbfs (a memfd is on one of them), where a page fault always finishes; a regular
// file elsewhere is refused with a reason, unless Config.AnyFSMemory allows it.
func TestMemoryFilesystem(t *testing.T) {
	f := nonTmpfsFile(t, 1<<20)
	for _, anyFS := range []bool{false, true} {
		h := startSession(t, opts{anyFS: anyFS})
		regs := []vuproto.MemRegion{{GPA: 0, Size: 1 << 20, UserAddr: 1 << 40}}
		dup, _ := unix.Dup(int(f.Fd()))
		r := h.FE.Ack(ReqSetMemTable, vhostusertest.MemTablePayload(regs), dup)
		unix.Close(dup)
		if (r == 0) != anyFS {
			t.Fatalf("anyFS %v: SET_MEM_TABLE answered %d", anyFS, r)
		}
		h.Stop()
		h.Close()
	}
	var sf unix.Statfs_t
	unix.Fstatfs(int(f.Fd()), &sf)
	if _, err := mapLog(int(dupFd(t, f)), 4096, 0, new(Stats), memPolicy{maxBytes: DefaultMaxMapped}, 0); err == nil {
		t.Fatalf("a log on a file of filesystem type %#x was mapped", sf.Type)
	}
	if l, err := mapLog(int(dupFd(t, f)), 4096, 0, new(Stats), memPolicy{maxBytes: DefaultMaxMapped, anyFS: true}, 0); err != nil {
		t.Fatalf("log with anyFS: %v", err)
	} else {
		l.unmap()
	}
}

func dupFd(t *testing.T, f *os.File) int {
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// nonTmpfsFile is a regular file of size bytes on a filesystem that is neither tmpfs nor
// hugetlbfs (ext4 or overlay, as a test machine's disk is): the test's temporary
// directory, or failing that the package's own directory.
func nonTmpfsFile(t *testing.T, size int64) *os.File {
	wd, _ := os.Getwd()
	for _, dir := range []string{t.TempDir(), wd} {
		f, err := os.CreateTemp(dir, "guest-ram-")
		if err != nil {
			continue
		}
		os.Remove(f.Name())
		t.Cleanup(func() { f.Close() })
		var st unix.Statfs_t
		if unix.Fstatfs(int(f.Fd()), &st) != nil || st.Type == unix.TMPFS_MAGIC || st.Type == unix.HUGETLBFS_MAGIC {
			continue
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		return f
	}
	t.Skip("no directory here is on a filesystem other than tmpfs (TMPDIR and the package directory are)")
	return nil
}

// TestMappedCap: a table that would map more than the cap is refused before anything
// is mapped, however sparse its files (mapping costs a front-end nothing, the address
// space is tapgro's), and so is a log that would pass it with the table.
func TestMappedCap(t *testing.T) {
	const gib = 1 << 30
	fd, err := unix.MemfdCreate("sparse", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 64*gib); err != nil {
		t.Fatal(err)
	}
	stats := new(Stats)
	h := startSession(t, opts{stats: stats, maxMapped: 40 * gib})
	regs := []vuproto.MemRegion{
		{GPA: 0, Size: 32 * gib, UserAddr: 1 << 40},
		{GPA: 32 * gib, Size: 16 * gib, UserAddr: 1<<40 + 32*gib, MmapOffset: 0},
	}
	_, maps0 := procCount(t)
	if r := h.FE.Ack(ReqSetMemTable, vhostusertest.MemTablePayload(regs), fd, fd); r == 0 {
		t.Fatal("48 GiB accepted under a 40 GiB cap")
	}
	if _, maps := procCount(t); maps != maps0 {
		t.Fatalf("mappings %d -> %d: the refused table was mapped", maps0, maps)
	}
	// An offset counts too: the mapping starts at offset 0 of the file.
	regs = []vuproto.MemRegion{{GPA: 0, Size: 1 * gib, UserAddr: 1 << 40, MmapOffset: 40 * gib}}
	if r := h.FE.Ack(ReqSetMemTable, vhostusertest.MemTablePayload(regs), fd); r == 0 {
		t.Fatal("a region 40 GiB into its file accepted under a 40 GiB cap")
	}
	if stats.Failed.Load() != 2 {
		t.Fatalf("Failed = %d", stats.Failed.Load())
	}
	// The session goes on with its own table.
	r, v := h.Rings[1], h.vr[1]
	r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: h.G.Alloc(256, 64), Len: 100}}))
	batch(t, v, func() {
		if _, err := v.Pop(make([][]byte, 0, 8)); err != nil {
			t.Fatalf("after the refusals: %v", err)
		}
	})
	h.Stop()
	h.Close()

	// The log counts with guest RAM: a SET_LOG_BASE that would pass the cap ends the
	// session (setLogBase says why a log that cannot be mapped must).
	var ram uint64
	for _, g := range vhostusertest.MeasuredLayout(memSize) {
		ram += g.MmapOffset + g.Size
	}
	h = startSession(t, opts{stats: stats, maxMapped: ram + 4096})
	lfd, _ := unix.MemfdCreate("log", unix.MFD_CLOEXEC)
	unix.Ftruncate(lfd, 8192)
	h.FE.Send(ReqSetLogBase, vuproto.FlagVersion|vuproto.FlagNeedReply,
		append(vhostusertest.U64(8192), vhostusertest.U64(0)...), lfd)
	unix.Close(lfd)
	select {
	case err := <-h.done:
		h.done <- err
		if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "cap") {
			t.Fatalf("session ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a log past the cap did not end the session")
	}
	h.Close()
}

// TestAvailBackwards: avail->idx moved behind the last index seen is a violation like a
// jump ahead, not nearly 65536 stale chains to pop over unpublished used entries.
func TestAvailBackwards(t *testing.T) {
	stats := new(Stats)
	h := startSession(t, opts{stats: stats, num: 16})
	r, v := h.Rings[1], h.vr[1]
	b := h.G.Alloc(256, 64)
	for range 4 {
		r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: b, Len: 100}}))
	}
	iov := make([][]byte, 0, 8)
	if err := v.Begin(); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		c, err := v.Pop(iov)
		if err != nil {
			t.Fatal(err)
		}
		v.Push(c.Head, 0)
	}
	v.End()
	if err := v.Begin(); err != nil {
		t.Fatal(err)
	}
	c, _ := v.Pop(iov) // nothing new: ErrEmpty
	_ = c
	idx := binary.LittleEndian.Uint16(r.Avail[2:])
	binary.LittleEndian.PutUint16(r.Avail[2:], idx-2) // back by two
	popped := 0
	var err error
	for ; popped < 70000; popped++ {
		if _, err = v.Pop(iov); err != nil {
			break
		}
	}
	v.End()
	var re *RingError
	if !errors.As(err, &re) || re.Reason != RejectAvailJump || popped != 0 {
		t.Fatalf("avail->idx moved back: %d chains popped, then %v", popped, err)
	}
	if stats.Rejected[RejectAvailJump].Load() != 1 {
		t.Fatal("not counted")
	}
}

// TestSilentPeer: a connection that sends nothing, or half a header, is ended after the
// handshake timeout; one that does not read its replies after msgTimeout.
func TestSilentPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the handshake timeout")
	}
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"nothing", nil},
		{"half a header", []byte{1, 0, 0, 0, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := NewBackend(netConfig(Config{}, 1))
			sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			a, c := unixConn(t, sp[0]), unixConn(t, sp[1])
			defer c.Close()
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- b.Serve(a) }()
			if tc.send != nil {
				c.Write(tc.send)
			}
			select {
			case err := <-done:
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("ended with %v", err)
				}
				if d := time.Since(start); d < handshakeTimeout-100*time.Millisecond {
					t.Fatalf("ended after %v, before the timeout", d)
				}
			case <-time.After(handshakeTimeout + msgTimeout + 2*time.Second):
				t.Fatal("a silent peer still holds the session")
			}
		})
	}
}

// TestFaultOutsideMappings: a fault at an address in no mapping of the session is not a
// front-end's doing but tapgro's own bug, and goes on as a panic; one in the dirty log
// is named as such.
func TestFaultOutsideMappings(t *testing.T) {
	h := startSession(t, opts{})
	v := h.vr[1]
	// Under the ring's lock, as every caller holds it.
	func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("a fault outside every mapping was recovered as the front-end's")
			}
		}()
		v.faultOrPanic(fakeFault(0x10))
	}()
	h.StartLog()
	v.mu.Lock()
	lg := v.log
	var addr uintptr
	var region int
	var inLog bool
	if lg != nil {
		addr, region, inLog = v.faultOrPanic(fakeFault(addrOf(lg.mapping) + 8))
	}
	v.mu.Unlock()
	if lg == nil {
		t.Fatal("ring not logging")
	}
	if !inLog || region != -1 {
		t.Fatalf("fault in the log: region %d, inLog %v", region, inLog)
	}
	e := &FaultError{Ring: 1, Addr: addr, Region: region, InLog: inLog}
	if want := "dirty log"; !strings.Contains(e.Error(), want) {
		t.Fatalf("%q does not name the %s", e.Error(), want)
	}
	h.Stop()
	h.Close()
}

type fakeFault uintptr

func (f fakeFault) Error() string { return "fake fault" }
func (f fakeFault) Addr() uintptr { return uintptr(f) }

func unixConn(t *testing.T, fd int) *net.UnixConn {
	f := os.NewFile(uintptr(fd), "socketpair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c.(*net.UnixConn)
}

// TestLogRecordsBounded: while dirty logging, what the ring keeps of each receive chain
// popped is kept for one batch and bounded, whatever the guest posts: here a
// 32768-entry ring whose every head is an indirect table of 900 one-byte buffers, popped
// 40,000 times (kept per head for the session, that was 14 KiB a head and stayed).
func TestLogRecordsBounded(t *testing.T) {
	const num, entries, perBatch, rounds = 32768, 900, 2000, 20
	h := startSession(t, opts{num: num})
	r, v := h.Rings[0], h.vr[0]
	tbl, buf := h.G.Alloc(entries*16, 16), h.G.Alloc(4096, 64)
	tb := h.G.At(tbl, entries*16)
	for i := range entries {
		addr, ln := buf+64+uint64(i), uint32(1)
		if i == 0 {
			addr, ln = buf, 64
		}
		fl := uint16(vhostusertest.DescFWrite)
		if i+1 < entries {
			fl |= vhostusertest.DescFNext
		}
		vhostusertest.PutDesc(tb[16*i:], addr, ln, fl, uint16(i+1))
	}
	h.StartLog()
	rss0 := vmRSS(t)
	iov := make([][]byte, 0, entries+8)
	heads := make([]uint16, perBatch)
	next := 0
	for range rounds {
		for k := range heads {
			heads[k] = uint16(next % num)
			vhostusertest.PutDesc(r.Desc[16*int(heads[k]):], tbl, entries*16, vhostusertest.DescFIndirect, 0)
			next++
		}
		r.Republish(heads)
		batch(t, v, func() {
			for range perBatch {
				c, err := v.Pop(iov)
				if err != nil {
					t.Fatalf("Pop: %v", err)
				}
				v.Push(c.Head, 100)
			}
		})
	}
	v.mu.Lock()
	pieces, pops := cap(v.logPieces), cap(v.logPops)
	v.mu.Unlock()
	grew := vmRSS(t) - rss0
	t.Logf("%d chains of %d buffers popped while logging: records hold %d pieces, %d pops; RSS grew %d KiB",
		rounds*perBatch, entries, pieces, pops, grew>>10)
	if pieces > 2*maxLogPieces || grew > 32<<20 {
		t.Fatalf("records not bounded: room for %d pieces, RSS +%d MiB", pieces, grew>>20)
	}
	h.StopLog()
	h.Stop()
	h.Close()
}

// vmRSS is the test process's resident set, in bytes.
func vmRSS(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc")
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			var kb int
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb << 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}
