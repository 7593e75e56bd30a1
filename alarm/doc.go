// Package alarm wakes the Go runtime's network poller at an exact instant, so that a
// read deadline closer than a millisecond fires when it is due.
//
// # Why
//
// A goroutine blocked in a read with a deadline is woken by a runtime timer. When no
// goroutine can run, the runtime sleeps in epoll_wait until its earliest timer, and
// epoll_wait counts its timeout in whole milliseconds: the runtime rounds any positive
// delay below one millisecond up to one (runtime/netpoll_epoll.go, netpoll: "delay <
// 1e6 → waitms = 1"), and a longer one down, so that the last stretch of every wait is
// rounded up again. On an idle process a deadline 50 µs away therefore fires after about
// 1.1 ms (BenchmarkDeadline: 1.09 ms without an alarm, against its 50 µs with one).
// Go's own fix, epoll_pwait2, is an open change behind a GODEBUG setting
// (golang/go#44343, "80us -> 1ms" on Linux).
//
// tapgro's timer flush (--gro-flush timer) holds a GRO aggregate for --rsc-interval,
// 50 µs by default, behind exactly such a deadline on the port's socket. Under load the
// next segment arrives within microseconds and the runtime never sleeps that long, but
// a lone UDP datagram, or the last full-sized segment of a TCP burst sent without PSH,
// waited twenty times longer than configured on its way to the TAP.
//
// # How
//
// An Alarm is a timerfd (timerfd_create(2), CLOCK_MONOTONIC, non-blocking) in the
// runtime's own epoll set: os.NewFile registers any descriptor already in non-blocking
// mode with the poller (os/file_unix.go, newFile, kindNonBlock). Set arms it for the
// deadline; the timerfd is an hrtimer and becomes readable at that instant
// (fs/timerfd.c, timerfd_tmrproc), which ends the runtime's epoll_wait; the runtime then
// runs its expired timers, the read deadline among them, before it looks for work.
// This is how netty's epoll transport gets timeouts finer than epoll_wait's.
//
// Nothing ever reads the timerfd. The poller only needs the wake-up: each expiry wakes
// the timerfd's waiters anew, which queues a new event even for an edge-triggered
// registration (the runtime adds descriptors with EPOLLET), and timerfd_settime clears
// the expiry count whenever it is armed again.
//
// The alarm fires Slack after the deadline: the runtime's timer and the timerfd are set
// from two readings of the clock a few hundred nanoseconds apart, and an alarm that rang
// before the runtime's timer was due would leave the runtime to sleep its rounded
// millisecond all the same.
//
// # Cost
//
// One timerfd_settime(2) for each Set whose instant differs from the one armed, nothing
// for a Set of the same instant; the caller sets it once per read batch in which
// something is held. An alarm left armed after the deadline stopped mattering costs one
// spurious wake-up of an idle runtime, so nothing disarms it.
package alarm
