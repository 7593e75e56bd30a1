//go:build linux

package vhostuser

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Signalling an eventfd the front-end can also reach: a ring's call and err fds, and the
// kick when Poke wakes the ring's own worker.
//
// O_NONBLOCK belongs to the open file description, and SCM_RIGHTS hands over the
// description itself, not a copy of it (fs/file.c receive_fd), so the front-end keeps
// a say over it after the back-end set the flag. A front-end that fills a counter to
// its limit (0xfffffffffffffffe, eventfd(2)) and then clears O_NONBLOCK on its own copy
// makes the next write sleep in the kernel until someone reads the counter
// (fs/eventfd.c eventfd_write). eventfd has no write_iter, so pwritev2's RWF_NOWAIT is
// refused (EOPNOTSUPP) and cannot help. Hence the rules here:
//
//   - The write is an ordinary system call (unix.Write), which the Go scheduler
//     accounts for: while it sleeps only its thread waits, sysmon hands its P to other
//     goroutines (runtime/proc.go retake) and a stop-the-world does not wait for it. A
//     raw one (package rawsys) keeps its P, and with it the garbage collector and, on
//     one P, every goroutine of the process.
//   - It is never made with a lock held that the session, teardown or another ring
//     needs: the ring decides under its lock (acquire pins the fd) and writes after
//     unlocking (Vring.unlock).
//   - At most one write per fd is in flight. A signal decided meanwhile is owed by that
//     write's thread, which writes once more when its write returns: the write in
//     flight may already have been seen and its wake-up spent (the driver read the used
//     ring before the entries this signal is for), so merging the two would lose the
//     second interrupt and stall the queue.
//   - Closing never waits for a write in flight. A write can only be asleep if the
//     counter is full, and a full counter is read here (RWF_NOWAIT makes that read
//     non-blocking whatever O_NONBLOCK says: fs/eventfd.c eventfd_read checks
//     IOCB_NOWAIT), which wakes the writer (unjam). The close(2) is then the writer's,
//     so the fd number cannot be reused under a write.
//   - A write asleep for longer than jamLimit is what the session's watchdog looks for
//     (Session.checkJams): the front-end blocked its own fd, and its session ends.
//
// A counter that is merely full (O_NONBLOCK still set) answers EAGAIN: the signal is
// dropped and counted, since the count already in it signals the front-end.
type eventFD struct {
	fd int

	mu       sync.Mutex
	inflight bool // pinned by acquire; the write has not finished
	again    bool // a signal came while inflight: its writer writes once more
	closed   bool // close was called: the writer closes fd when it is done

	since atomic.Int64 // monoNow at the start of the write in flight; 0: none
}

// jamLimit is how long a write to a front-end's eventfd may sleep before the session
// is ended for it. An eventfd write that does not sleep takes microseconds; one that
// sleeps waits for a reader that a working front-end runs continuously.
const jamLimit = time.Second

var one = func() (b [8]byte) { b[0] = 1; return }()

func newEventFD(fd int) *eventFD {
	if fd < 0 {
		return nil
	}
	return &eventFD{fd: fd}
}

// acquire pins e for one write (write must follow). It fails for a nil or closed e,
// and when a write is already in flight, which then owes this signal too (again).
func (e *eventFD) acquire() bool {
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return false
	}
	if e.inflight {
		e.again = true
		return false
	}
	e.inflight = true
	return true
}

// write adds 1 to the counter after acquire, with no lock held, and once more for
// every round in which a signal came while it wrote. It reports whether the kernel
// took the last write.
func (e *eventFD) write() bool {
	for {
		e.since.Store(monoNow())
		n, err := unix.Write(e.fd, one[:])
		e.since.Store(0)
		e.mu.Lock()
		if e.again && !e.closed {
			e.again = false
			e.mu.Unlock()
			continue
		}
		e.inflight, e.again = false, false
		if e.closed {
			unix.Close(e.fd)
		}
		e.mu.Unlock()
		return err == nil && n == len(one)
	}
}

// signal is acquire then write, for a caller that holds no lock.
func (e *eventFD) signal() bool { return e.acquire() && e.write() }

// close closes e now, or, with a write in flight, unjams that write and leaves the
// close to it. It reports whether a write is still in flight (the caller may watch e
// until it is not: busy).
func (e *eventFD) close() (busy bool) {
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return e.inflight
	}
	e.closed = true
	if !e.inflight {
		unix.Close(e.fd)
		return false
	}
	unjam(e.fd)
	return true
}

// busy reports whether a write is still in flight; if one is, it unjams it again (a
// front-end may have filled the counter anew).
func (e *eventFD) busy() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.inflight {
		unjam(e.fd)
	}
	return e.inflight
}

// jammed reports whether a write has been in flight since before cutoff (monoNow).
func (e *eventFD) jammed(cutoff int64) bool {
	if e == nil {
		return false
	}
	s := e.since.Load()
	return s != 0 && s < cutoff
}

// unjam empties a full counter so that a write asleep on it returns. A counter that
// can still take a write (poll says POLLOUT: fs/eventfd.c eventfd_poll) is left alone:
// its count may be a notification the front-end has yet to read. A full one means the
// front-end stopped reading; taking its count costs it nothing it was going to see.
func unjam(fd int) {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	if n, err := unix.Poll(p, 0); err != nil || n != 0 {
		return
	}
	var cnt [8]byte
	unix.Preadv2(fd, [][]byte{cnt[:]}, -1, unix.RWF_NOWAIT)
}
