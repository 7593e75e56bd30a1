//go:build linux

package vhostuser

import (
	"runtime/debug"
	"time"
)

// Telling the driver: publishing (the layout's store), asking the layout whether the
// driver wants a call (split: EVENT_IDX or VRING_AVAIL_F_NO_INTERRUPT), sending it, and
// moderating calls under load (SetCallModeration).

// publishLocked makes everything pushed since the last publish visible with one store
// (the layout's) and sends at most one call, or owes it to the moderation timer.
func (v *Vring) publishLocked() {
	if !v.ring.publish() {
		return
	}
	if v.call == nil {
		return
	}
	if !v.ring.needCall() {
		// The driver polls, or asked for an event further on: what it will see
		// without a call needs none, and a call owed is no longer (the driver moved
		// its event index past everything published, so it is processing).
		v.ring.signalled()
		if v.callDeferred {
			v.callDeferred = false
			v.callTimer.Stop()
		}
		return
	}
	if v.modEvery > 0 && v.sinceCall+int(v.otherLoad.Load()) >= moderateBytes && !v.ring.backlogged() {
		// Under load: at most one call per modEvery. The call is owed, not lost:
		// the timer sends it when the interval is up, unless by then the driver has
		// consumed everything without one (deferredCall asks again). Half a ring
		// published without a call goes at once whatever the interval: the driver
		// reclaims (TX) or refills (RX) only what it was told of, and a transmit
		// queue stops, or a receive ring runs dry, before the timer would tell it.
		if wait := v.modEvery - time.Since(v.lastCall); wait > 0 {
			if !v.callDeferred {
				v.callDeferred = true
				v.stats.CallsDeferred.Add(1)
				v.callTimer.Reset(wait)
			}
			return
		}
	}
	v.callLocked()
}

// callLocked decides the call for everything published; it goes out when mu is
// released (Vring.unlock).
func (v *Vring) callLocked() {
	if v.callDeferred {
		// This call carries the owed one: the timer's firing would find nothing to
		// do, and on an idle process it would still be a wake-up.
		v.callTimer.Stop()
	}
	v.ring.signalled()
	v.callDeferred, v.sinceCall = false, 0
	v.otherLoad.Store(0)
	if v.modEvery > 0 {
		v.lastCall = time.Now()
	}
	v.oweCallLocked()
}

// deferredCall is the moderation timer: it sends the owed call if the driver still
// wants it. It reads the avail ring on the timer's goroutine, so it recovers a fault
// there itself (fault.go).
func (v *Vring) deferredCall() {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	v.mu.Lock()
	v.deferredCallLocked()
	v.unlock()
}

func (v *Vring) deferredCallLocked() {
	defer v.recoverLocked()
	if !v.callDeferred {
		return
	}
	if v.state != ringRunning || v.broken || v.call == nil || !v.ring.mapped() {
		v.callDeferred = false
		return
	}
	if wait := v.modEvery - time.Since(v.lastCall); wait > 0 {
		v.callTimer.Reset(wait) // a Reset raced with an earlier expiry
		return
	}
	if v.ring.needCall() {
		v.callLocked()
		return
	}
	v.ring.signalled()
	v.callDeferred = false
}

// moderateBytes is what, pushed since the last call, counts as load for call
// moderation. Below it (a 1-byte request and its answer, a few ACKs) every call goes
// out at once: latency matters there and a call per frame costs the guest little. It
// is the split adaptive NIC interrupt moderation makes between low-latency and bulk
// traffic from bytes per interval (linux drivers/net/ethernet/intel/igb/igb_main.c
// igb_update_itr).
const moderateBytes = 16 << 10

// SetCallModeration bounds the calls this ring sends under load to one per d (0: a
// call whenever the driver asks, at most one per batch). Load is moderateBytes or more
// pushed since the last call, counting what NoteLoad reported; a call due sooner is owed to a timer, which drops it if
// the driver has meanwhile consumed everything published (EVENT_IDX: its used_event
// moved past; otherwise VRING_AVAIL_F_NO_INTERRUPT). The driver's own suppression
// always applies on top. Calls before the ring's workers start.
func (v *Vring) SetCallModeration(d time.Duration) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.modEvery = max(d, 0)
	if v.modEvery > 0 && v.callTimer == nil {
		v.callTimer = time.AfterFunc(time.Hour, v.deferredCall)
		v.callTimer.Stop()
	}
}

// NoteLoad adds n bytes that the device moved the other way (a network device's
// transmit ring, for its receive ring) to what counts as load for call moderation, from
// any goroutine. A bulk transfer's answers — TCP's ACKs to a guest that sends — are
// each far too small to count, so without it every one of them is a call, and an
// interrupt the guest takes, at the full rate of the transfer; counted, they are
// moderated as the transfer's own frames would be. A request and its answer (a 1-byte
// ping-pong) still move too little to count. NIC interrupt moderation counts both ways
// too: linux drivers/net/ethernet/intel/igb/igb_main.c igb_update_ring_itr sets one
// rate per interrupt vector from the bytes and packets of the receive and the
// transmit ring it serves.
func (v *Vring) NoteLoad(n int) {
	if n > 0 && v.otherLoad.Load() < moderateBytes {
		v.otherLoad.Add(int64(n))
	}
}

// Publish makes what was pushed so far visible to the driver in the middle of a batch,
// and decides its call as End would; the call itself goes out at End, since no write to
// the front-end's eventfd is made under the ring's lock (signal.go). Per-frame publishing
// is the baseline moderation is measured against; a device whose unit spans several
// chains calls it after the last of them, never between (the driver takes them as one).
func (v *Vring) Publish() {
	if v.inBatch && !v.broken {
		v.publishLocked()
	}
}
