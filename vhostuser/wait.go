//go:build linux

package vhostuser

import (
	"runtime"
	"syscall"
	"time"
)

// Sleeping until the ring has work: re-enabling kicks, the last look at avail->idx,
// then the kick eventfd (through the runtime poller) or, with no kick fd, a polling
// back-off; and stopping a ring whose kick never goes quiet.

// Wait blocks until the ring may have work. Before sleeping it re-enables kicks
// (split: avail_event with EVENT_IDX, else clears NO_NOTIFY), issues a full barrier and
// looks at the ring again, so a chain made available meanwhile is not missed (QEMU
// virtio_queue_split_set_notification: smp_mb after enabling). It returns ErrStopped
// or ErrBroken when the worker should stop.
func (v *Vring) Wait() error { return v.waitAvail(true) }

// waitAvail sleeps until a chain is available beyond the ring's position as it is each
// time round (atLast, Wait), or beyond what the last pop saw (WaitMore). Each round
// arms the kicks for that point (layout.armKicks: the request, the full barrier and
// one more look) before sleeping on the kick.
func (v *Vring) waitAvail(atLast bool) error {
	for {
		if atLast {
			if found, err := v.watch(); found || err != nil {
				return err
			}
		}
		if err := v.lockForWait(); err != nil {
			return err
		}
		if v.ring.armKicks(!atLast) {
			v.unlockForWait()
			v.pollWait, v.idleKicks = 0, 0
			return nil
		}
		rc, poll := v.kickRC, v.kickNoFd
		v.waitWatch = atLast
		v.unlockForWait()
		v.parked.Store(true)
		err := v.sleep(rc, poll)
		v.parked.Store(false)
		if err != nil {
			return err
		}
		// After a kick, or the kick file closed by a stop or replaced, loop: the
		// state check at the top decides.
	}
}

// lockForWait takes mu for Wait or WaitMore, which touch the used ring under it, and
// reports a ring the worker should leave.
func (v *Vring) lockForWait() error {
	v.mu.Lock()
	if v.state != ringRunning || v.broken {
		err := ErrStopped
		if v.broken {
			err = ErrBroken
		}
		v.mu.Unlock()
		return err
	}
	v.waitLocked = true
	return nil
}

func (v *Vring) unlockForWait() {
	v.waitLocked = false
	v.unlock()
}

// Polling (SET_VRING_KICK with VHOST_USER_VRING_NOFD_MASK: no eventfd, vhost-user.rst
// SET_VRING_KICK) looks at the ring pollMin after it was last found busy, backing off
// by doubling to pollMax while it stays empty: a busy ring is looked at within 50 µs,
// an idle one 20 times a second. Each wake-up of an otherwise idle Go process costs this
// host far more than the look itself (timer, netpoll, futex hand-offs), so the ceiling
// is set by measurement (BenchmarkIdlePolledRing, the whole test process's CPU while
// idle, two runs each: a ring idle on its kick eventfd 0.22-0.24 % of a core; polled
// with a 10 ms ceiling 2.07-2.11 %, 25 ms 1.08-1.10 %, 50 ms 0.65-0.76 %). The price is
// up to 50 ms before the first chain after an idle spell is seen, on a ring whose
// front-end chose not to notify.
const (
	pollMin = 50 * time.Microsecond
	pollMax = 50 * time.Millisecond
)

// kickStorm is how many kicks in a row may find no work before the kick counts as
// broken. A driver kicks after it made chains available (virtio spec "Available
// Buffer Notifications"), so a spurious kick is rare and never many in a row; a
// semaphore eventfd with a huge count, or anything else that is always readable, would
// otherwise keep the worker spinning on a core.
const kickStorm = 1 << 16

// sleep waits for the next kick on rc (the kick eventfd's RawConn), or polls.
// ErrStopped: nothing to wait on (the ring has no kick: it is stopping). ErrBroken: the
// kick never goes quiet; the ring is stopped as the other violations stop it, counted
// (RejectKick) and logged.
//
// The kick's counter is never read. The runtime poller's epoll is edge-triggered, and
// every eventfd write wakes the eventfd's wait queue (fs/eventfd.c eventfd_write →
// wake_up_locked_poll), so each kick is an event whether or not the count was taken;
// Linux vhost does the same, waking on the eventfd's wait queue and never reading it
// (drivers/vhost/vhost.c vhost_poll_start, vhost_poll_wakeup). That saves two system
// calls per sleep (the read that takes the count and the one that finds it empty), and
// a kick fd that is always readable cannot make the worker spin: it is one edge. The
// 64-bit count cannot overflow: at one kick per nanosecond it would take 584 years.
func (v *Vring) sleep(rc syscall.RawConn, poll bool) error {
	if rc == nil {
		if !poll {
			return ErrStopped
		}
		v.pollWait = min(max(2*v.pollWait, pollMin), pollMax)
		time.Sleep(v.pollWait)
		return nil
	}
	v.kickWoke = false
	last := rc.Read(v.awaitKick)
	switch {
	case last == nil && !v.kickWoke:
		// Not parked: the ring had moved, Poke's window is open or the ring is changing
		// (awaitKickFd). waitAvail looks under the lock.
		return nil
	case last == nil && v.selfPokes.Swap(0) > 0:
		// Poke's write (perhaps merged with a kick): the caller watches the ring
		// next, so this is neither counted as a kick nor as one without work.
		return nil
	case last == nil:
		v.stats.Kicks.Add(1)
	}
	// An error from rc.Read is the kick file closed (a stop, or a new SET_VRING_KICK
	// replaced it), or a file the poller cannot wait on: the state check in waitAvail
	// decides what comes next. Counted like a kick without work all the same, so
	// nothing can make this loop spin.
	if v.idleKicks++; v.idleKicks < kickStorm {
		return nil
	}
	v.idleKicks = 0
	v.mu.Lock()
	if v.state != ringRunning || v.broken {
		v.mu.Unlock()
		return ErrStopped
	}
	v.failLocked(RejectKick)
	v.unlock()
	v.warn("vhost-user: kicks in a row found no work; ring stopped", "ring", v.index, "kicks", kickStorm, "last_wait", last)
	return ErrBroken
}

// awaitKickFd is sleep's RawConn callback. Its first call decides whether to park:
// RawConn.Read forgets the poller's readiness before that call (internal/poll
// prepareRead → runtime poll_runtime_pollReset), so a kick whose event came between
// waitAvail's last look and now would be lost; the driver moves avail->idx before it
// kicks (virtio spec "Available Buffer Notifications"), so looking at avail->idx once
// more finds it without a system call. Poke's window is looked at the same way, for Wait
// (WaitMore does not watch). Called again, after the poller saw the eventfd signalled,
// it ends the wait.
//
// It must not block on mu: closeKickLocked closes the kick with mu held, and that Close
// waits for this Read to return. A contended mu ends the wait instead, and waitAvail
// looks again under the lock.
func (v *Vring) awaitKickFd(uintptr) bool {
	if v.kickWoke {
		return true
	}
	v.kickWoke = true
	if v.waitWatch && v.pollUntil.Load() > monoNow() {
		v.kickWoke = false // not woken by the poller: neither a kick nor a poke
		return true
	}
	if !v.mu.TryLock() {
		v.kickWoke = false
		return true
	}
	// Guest memory under mu, as in waitAvail: a fault here reaches the worker's Guard,
	// which must know that mu is held.
	v.waitLocked = true
	ready := v.state != ringRunning || v.broken || v.ring.armed()
	v.waitLocked = false
	v.mu.Unlock()
	if ready {
		v.kickWoke = false
	}
	return ready
}

// WaitMore blocks until the driver makes a chain available beyond those the last Pop
// saw (returning at once if it already has):
// for a worker that found chains, but too few for what it must place (a device's
// receive reservation that came up short). Wait
// would return at once then (the ring is not empty), and with EVENT_IDX the driver
// would not kick again, since End asked for a kick at last_avail_idx, already passed.
// So WaitMore asks for a kick at that avail->idx (with EVENT_IDX, avail_event =
// avail->idx; without it NO_NOTIFY cleared), issues the full barrier, re-reads
// avail->idx and sleeps on the kick only if it has not moved (the protocol of Wait,
// QEMU virtio_queue_split_set_notification). Call it outside a batch. It returns
// ErrStopped or ErrBroken when the worker should stop.
func (v *Vring) WaitMore() error { return v.waitAvail(false) }

// The poll window (--vhost-poll; SetPollWindow). A worker that sleeps on its kick as
// soon as the ring is empty pays a thread wake-up for the next chain, and its driver a
// notification. When a chain is about to come — the answer to a frame just handed the
// guest — watching avail->idx for a bounded time instead catches it with neither; the
// kicks are turned off while the worker watches (virtio spec "Available Buffer
// Notification Suppression"). The model is Linux's busy polling (net/core/dev.c
// napi_busy_loop, bounded by busy_poll µs). A window opens only when Poke asks: vhostnet
// pokes a pair's TX ring each time its RX worker hands the guest frames, since a request
// delivered is when an answer is most likely to follow. It is bounded and only ever
// follows traffic, so an idle ring costs nothing; 0 (the default) turns it off.
//
// A window after every batch of the worker's own (DPDK's and OVS's sleep after an idle
// spell) was tried and dropped: with testpmd as the front-end it cost 143 against 94 µs
// of CPU per ping round trip for the same latency, and under TCG, where the guest's
// vCPU needs the host's cores, it doubled tapgro's CPU per GB and lengthened the guest's
// round trips (benchtool -guests -before, QEMU 10.0).

// monoBase anchors the window's monotonic clock (time.Since reads the monotonic one).
var monoBase = time.Now()

func monoNow() int64 { return int64(time.Since(monoBase)) }

// SetPollWindow sets the window (0: off). It may be called at any time.
func (v *Vring) SetPollWindow(d time.Duration) { v.pollWindow.Store(int64(max(d, 0))) }

// Poke opens the window now, from any goroutine: if the worker sleeps on its kick it is
// woken by a write to the kick eventfd, which its sleep tells from the driver's kicks
// (selfPokes), so it is not counted as one. With the window off it does nothing.
func (v *Vring) Poke() {
	w := v.pollWindow.Load()
	if w == 0 {
		return
	}
	v.pollUntil.Store(monoNow() + w)
	if !v.parked.Load() {
		return // the worker is working, or about to look at the ring anyway
	}
	if p := v.pokeFD.Load(); p != nil {
		// A write to the kick the front-end also holds: like a call, it may sleep
		// (signal.go), so it is an eventFD's. Failing, it is a kick closed by a stop, or
		// one in flight already: either wakes the worker.
		v.selfPokes.Add(1)
		p.signal()
	}
}

// watch watches avail->idx until Poke's deadline, if one is open, with kicks off, and
// reports whether the driver posted chains meanwhile. Each look takes mu, as
// waitAvail's do (the ring may be stopping); between looks the goroutine yields its P,
// so a worker that watches never holds up another on a busy machine.
func (v *Vring) watch() (bool, error) {
	until := v.pollUntil.Load()
	if until == 0 || monoNow() >= until {
		return false, nil
	}
	for first := true; ; first = false {
		if err := v.lockForWait(); err != nil {
			return false, err
		}
		if first {
			v.kicksOffLocked()
		}
		moved := v.ring.available()
		v.unlockForWait()
		if moved {
			v.stats.PollHits.Add(1)
			v.pollWait, v.idleKicks = 0, 0
			return true, nil
		}
		if now := monoNow(); now >= until {
			// Poke may have moved the deadline on while we watched.
			if until = v.pollUntil.Load(); now >= until {
				return false, nil
			}
		}
		runtime.Gosched()
	}
}

// kicksOffLocked turns the driver's kicks off for a watch. After work they are off
// already, but a worker Poke woke from its sleep had turned them on; waitAvail turns
// them on again, and looks once more, before any sleep.
func (v *Vring) kicksOffLocked() { v.ring.kicksOff() }
