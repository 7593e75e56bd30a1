//go:build linux

package vhostnet

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// holdTimer is the TX worker's sleep for the hold (tx.go): a timerfd waited on through
// the runtime's poller. time.Sleep would do for a hold of a millisecond or more, but not
// below: a Go process with nothing else to run waits for its next timer in epoll_pwait,
// whose timeout is in milliseconds, and the runtime rounds a shorter delay up to 1 ms
// (runtime/netpoll_epoll.go, netpoll), so time.Sleep(150µs) sleeps about 1 ms here. A
// timerfd's expiry is an event in that same epoll, at the precision of the kernel's
// hrtimers. Like the kick eventfd (vhostuser/wait.go), its count is never read: the
// poller's epoll is edge-triggered, and every expiry wakes the timerfd's wait queue
// (fs/timerfd.c timerfd_tmrproc → wake_up_locked_poll), so a hold costs one system call,
// timerfd_settime, besides the wake-up itself.
type holdTimer struct {
	f        *os.File
	fd       int // f's, for timerfd_settime (f stays open as long as the worker runs)
	rc       syscall.RawConn
	spec     unix.ItimerSpec
	d        time.Duration
	deadline int64              // monotonic ns at which the current hold ends
	expired  func(uintptr) bool // h.isExpired, bound once: a method value allocates
}

// holdBase anchors the hold's monotonic clock (time.Since reads the monotonic clock,
// CLOCK_MONOTONIC, the timerfd's clock too).
var holdBase = time.Now()

func holdNow() int64 { return int64(time.Since(holdBase)) }

// newHoldTimer makes a timer for holds of d. On error (no timerfd) the caller falls back
// to time.Sleep.
func newHoldTimer(d time.Duration) (*holdTimer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("timerfd_create", err)
	}
	f := os.NewFile(uintptr(fd), "tx-hold") // non-blocking: registered with the poller
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	h := &holdTimer{f: f, fd: fd, rc: rc, d: d, spec: unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}}
	h.expired = h.isExpired
	return h, nil
}

// sleep returns once the hold has passed. The deadline is taken before the timer is
// armed, so the timer's expiry is never earlier than it.
func (h *holdTimer) sleep() {
	h.deadline = holdNow() + int64(h.d)
	if unix.TimerfdSettime(h.fd, 0, &h.spec, nil) != nil {
		time.Sleep(h.d)
		return
	}
	if h.rc.Read(h.expired) != nil {
		time.Sleep(h.d) // the file was closed under us: not expected, but bounded
	}
}

// isExpired is the RawConn callback: true once the deadline has passed. Before the first
// call RawConn.Read forgets the poller's readiness (internal/poll prepareRead), so an
// expiry that came before it is found here by the clock, with no system call; one that
// comes later wakes the poller. A stale event from an earlier hold only makes it look
// again: the clock decides.
func (h *holdTimer) isExpired(uintptr) bool { return holdNow() >= h.deadline }

func (h *holdTimer) close() { h.f.Close() }
