package alarm

import (
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Slack is how long after its deadline an alarm rings (package doc).
const Slack = 2 * time.Microsecond

// Alarm is a timerfd in the runtime's netpoller. It is used by one goroutine at a time.
// The nil Alarm does nothing, so a caller that could not create one keeps working with
// the runtime's own precision.
type Alarm struct {
	f    *os.File // keeps the timerfd open and registered with the poller
	fd   uintptr
	at   int64 // the deadline armed for, Unix ns; 0 for none
	sets uint64
	spec unix.ItimerSpec // Set's argument, here so that it is not allocated per call
}

// New creates an alarm, not armed.
func New() (*Alarm, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("alarm: timerfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "alarm")
	if !registered(f) {
		f.Close()
		return nil, fmt.Errorf("alarm: the timerfd did not join the runtime's poller")
	}
	return &Alarm{f: f, fd: uintptr(fd)}, nil
}

// registered reports whether the runtime polls f: only a polled descriptor honours a
// deadline, so SetReadDeadline fails on any other (os.ErrNoDeadline).
func registered(f *os.File) bool {
	return f.SetReadDeadline(time.Time{}) == nil
}

// Set arms the alarm to ring Slack after deadline, unless it is armed for that deadline
// already or the deadline has passed (the runtime's timer is then due and runs as soon
// as anything wakes it).
func (a *Alarm) Set(deadline time.Time) {
	if a == nil {
		return
	}
	at := deadline.UnixNano()
	if at == a.at {
		return
	}
	d := time.Until(deadline)
	if d <= 0 {
		return
	}
	d += Slack
	a.spec.Value = unix.NsecToTimespec(d.Nanoseconds())
	// Raw: timerfd_settime on a timerfd only starts an hrtimer; it cannot block, so
	// the scheduler's system-call bookkeeping would be pure cost (package rawsys's
	// reasoning). Its only failures are for a bad descriptor or bad arguments.
	if _, _, e := unix.RawSyscall6(unix.SYS_TIMERFD_SETTIME, a.fd, 0,
		uintptr(unsafe.Pointer(&a.spec)), 0, 0, 0); e != 0 {
		return
	}
	a.at = at
	a.sets++
}

// Sets is how many times Set armed the timerfd.
func (a *Alarm) Sets() uint64 {
	if a == nil {
		return 0
	}
	return a.sets
}

// Close releases the timerfd.
func (a *Alarm) Close() error {
	if a == nil {
		return nil
	}
	return a.f.Close()
}
