// Package procscale sets GOMAXPROCS from the process's own CPU use: one P while one CPU
// is enough for the work, more while the process keeps the Ps it has busy.
//
// # Why not one P per CPU
//
// A socket port's two pipelines, TAP→port and port→TAP, are bound by system calls and
// hand each other work through the kernel: writing an aggregate to the TAP runs the
// host's TCP receive, whose ACK makes the TAP readable for the other pipeline, and the
// socket does the same towards the peer. With a spare P the Go scheduler keeps a thread
// blocked in epoll_wait without a P (runtime/proc.go, findRunnable, "Poll network until
// next timer"), so each such readiness event wakes a second thread on another CPU, which
// then takes the spare P: a wake-up and two context switches per event, tens of
// thousands of them per GB. With one P the goroutine that parks finds the other one's
// readiness in its own netpoll and switches to it in user space, and the pair runs as
// one event loop: passt serves everything from one thread, and the kernel's vhost-net
// serves both virtqueues of a device from one worker (drivers/vhost/net.c,
// vhost_net_open). A vhost-user port's ring workers are such a pair too: the TX
// worker's TAP write makes the ACK the RX worker reads, and the RX worker's delivery
// makes the guest answer on the TX ring. A goroutine that never blocks is preempted after 10 ms
// (runtime/proc.go, forcePreemptNS), so even a flooded direction delays the other by no
// more than that.
//
// # Why not always one
//
// One P is one CPU, and the goroutines on it take turns. When both directions carry
// bulk data each waits for the other's batches even while the P is partly idle, so
// throughput drops (iperf3 --bidir between two tapgro here: 7.1 Gbit/s in all on one
// P against 7.3-8.7 on two, at the same CPU per GB); and work that keeps the P busy
// needs a second CPU anyway. The caller reports the first (Load.Parallel: it knows
// its directions), the scaler measures the second.
//
// # The rule
//
// Every Interval the scaler reads the process's CPU time (getrusage(RUSAGE_SELF), user
// and system: the kernel work done inside tapgro's system calls counts) and divides by
// the wall time: u CPUs' worth. With p Ps it adds one when u ≥ Up·p (the Ps are busy)
// and removes one when u < Down·(p−1) (p−1 would still have room); while the caller
// reports parallel work it keeps at least two. Down is well below Up because the same
// work costs less CPU on fewer Ps, so a step down lands below the next step up and the
// count does not swing back and forth. runtime.GOMAXPROCS stops the world briefly; it
// is called only when the count changes, at most once per Interval.
package procscale

import (
	"context"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Policy bounds and tunes the scaler.
type Policy struct {
	Min, Max int           // GOMAXPROCS stays within [Min, Max]; Min ≥ 1
	Up, Down float64       // thresholds in CPUs per P (package doc)
	Interval time.Duration // between samples
}

// Default is the policy for Max CPUs: from 1 P up to max.
func Default(max int) Policy {
	return Policy{Min: 1, Max: max, Up: 0.85, Down: 0.7, Interval: time.Second}
}

// Load is what one sample found.
type Load struct {
	CPU      float64 // CPUs' worth of time the process used
	Parallel bool    // two streams of work that gain from running at once (the caller's)
}

// Next returns the P count after a sample that found l with p Ps.
func (pol Policy) Next(p int, l Load) int {
	floor := pol.Min
	if l.Parallel {
		floor = min(pol.Max, max(pol.Min, 2))
	}
	switch {
	case p < floor:
		return floor
	case p > pol.Max:
		return pol.Max
	case p < pol.Max && l.CPU >= pol.Up*float64(p):
		return p + 1
	case p > floor && l.CPU < pol.Down*float64(p-1):
		return p - 1
	}
	return p
}

// Run sets GOMAXPROCS to pol.Min, then rescales it every pol.Interval until ctx ends.
// parallel, if not nil, is asked once per sample whether the work since the last one
// was parallel (Load.Parallel), with the time that passed. changed, if not nil, is
// called after each change with the old and new count and the sample that decided it.
func Run(ctx context.Context, pol Policy, parallel func(wall time.Duration) bool, changed func(from, to int, l Load)) {
	s := scaler{pol: pol, cpuTime: cpuTime, set: runtime.GOMAXPROCS, parallel: parallel, changed: changed}
	t := time.NewTicker(pol.Interval)
	defer t.Stop()
	s.start(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.sample(now)
		}
	}
}

// scaler is Run's state, with the process's clock and GOMAXPROCS behind functions so
// tests can drive it.
type scaler struct {
	pol      Policy
	cpuTime  func() time.Duration
	set      func(int) int
	parallel func(wall time.Duration) bool
	changed  func(from, to int, l Load)

	p        int
	lastWall time.Time
	lastCPU  time.Duration
}

func (s *scaler) start(now time.Time) {
	s.p = s.pol.Min
	s.set(s.p)
	s.lastWall, s.lastCPU = now, s.cpuTime()
}

func (s *scaler) sample(now time.Time) {
	c := s.cpuTime()
	wall := now.Sub(s.lastWall)
	if wall <= 0 {
		return
	}
	l := Load{CPU: float64(c-s.lastCPU) / float64(wall)}
	if s.parallel != nil {
		l.Parallel = s.parallel(wall)
	}
	s.lastWall, s.lastCPU = now, c
	if n := s.pol.Next(s.p, l); n != s.p {
		old := s.p
		s.p = n
		s.set(n)
		if s.changed != nil {
			s.changed(old, n, l)
		}
	}
}

// cpuTime is the process's user and system CPU time so far, all threads.
func cpuTime() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
