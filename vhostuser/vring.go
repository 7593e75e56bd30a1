//go:build linux

package vhostuser

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"tapgro/vhostuser/vuproto"
)

const (
	// MaxRingSize is the spec's limit (Queue Size ≤ 32768). QEMU 7.2 uses ≤ 1024
	// (VIRTQUEUE_MAX_SIZE), but nothing here depends on that.
	MaxRingSize = 32768
)

// Reason names why a chain (or a ring) was rejected. Each is a counter in Stats.
type Reason int

const (
	RejectHeadRange   Reason = iota // avail ring entry ≥ num (QEMU virtqueue_get_head "Guest says index %u is available")
	RejectNextRange                 // next ≥ table size ("Desc next is %u")
	RejectLoop                      // more descriptors than the table holds ("Looped descriptor")
	RejectZeroLen                   // zero-length descriptor ("zero sized buffers are not allowed")
	RejectDirection                 // writable descriptor on a ring the device reads, or read-only on one it writes
	RejectAvailJump                 // more than num chains outstanding (QEMU "Guest moved used index", "Virtqueue size exceeded"), or avail->idx moved back
	RejectAddress                   // buffer outside every region
	RejectLenOverflow               // addr+len wraps, or chain longer than a used.len can say
	RejectShortChain                // chain shorter than the device's header (Config.HeaderLen)
	RejectIndirect                  // indirect not negotiated, bad size, nested, or with NEXT
	RejectIovFull                   // more segments than the caller's iovec slice holds
	RejectRingAddr                  // ring parts unmapped, not in one region, or misaligned
	RejectFault                     // guest memory faulted (its file shrank): the session ends (fault.go)
	RejectKick                      // the kick fd kept signalling with no work (Vring.sleep)
	NumReasons

	// popOK and popEmpty are a layout's pop results that are not violations.
	popOK    = NumReasons
	popEmpty = NumReasons + 1
)

var reasonNames = [NumReasons]string{"head_range", "next_range", "loop", "zero_len", "direction",
	"avail_jump", "address", "len_overflow", "short_chain", "indirect", "iov_full", "ring_addr", "fault", "kick"}

func (r Reason) String() string {
	if r >= 0 && r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

var (
	// ErrStopped: the ring is not running (never started, or stopped by GET_VRING_BASE
	// or the end of the session). The ring's worker should return.
	ErrStopped = errors.New("vhost-user: ring stopped")
	// ErrEmpty: no available chain.
	ErrEmpty = errors.New("vhost-user: no available chain")
	// ErrBroken: the guest broke the ring protocol; the ring stays stopped until the
	// front-end restarts it. errors.Is(err, ErrBroken) holds for every RingError.
	ErrBroken = errors.New("vhost-user: ring broken by the guest")
)

// RingError is the error a violation returns; Reason says which check failed.
type RingError struct{ Reason Reason }

func (e *RingError) Error() string { return "vhost-user: ring broken: " + e.Reason.String() }
func (e *RingError) Unwrap() error { return ErrBroken }

// ringErrs are the RingErrors by Reason, preallocated so that a violation on the data
// path does not allocate either.
var ringErrs = func() (a [NumReasons]*RingError) {
	for i := range a {
		a[i] = &RingError{Reason(i)}
	}
	return
}()

// Chain is one popped descriptor chain: Iov are views into guest memory (no copy),
// valid only until the Vring's End. Len is their total length.
type Chain struct {
	Head uint16
	Len  int
	Iov  [][]byte
}

type ringState uint8

const (
	ringStopped ringState = iota
	ringRunning
)

// Vring is one virtqueue (split layout). The session goroutine configures it; one data-path
// goroutine (the owner's worker, started from Handler.RingStarted) uses it between Begin
// and End. All access to guest memory happens under mu, which is how SET_MEM_TABLE and
// GET_VRING_BASE know nothing still reads a mapping or a ring they are changing.
type Vring struct {
	index    int
	writable bool // the device writes this ring's chains (Config.Writable)
	stats    *Stats

	enabled atomic.Bool

	mu sync.Mutex

	// Configuration from the front-end (SET_VRING_*), kept across stop/start.
	num       uint32
	addr      vuproto.VringAddr
	addrSet   bool
	base      uint16
	kick      *os.File        // nil: none yet, or polling when kickNoFd
	kickRC    syscall.RawConn // kick's, for reading it without the scheduler's bookkeeping
	kickNoFd  bool
	hasKick   bool
	call      *eventFD // nil: none
	errf      *eventFD // nil: none
	enableReq bool

	// Signals decided under mu and pinned (eventFD.acquire), which unlock writes once
	// mu is released (signal.go: never a write to the front-end's fd under a lock).
	pendCall, pendErr *eventFD
	// retired are eventfds closed with a write still in flight, kept until it ends so
	// that the session's watchdog and teardown can see and unjam them.
	retired []*eventFD

	mem       *guestMem
	hdrLen    int
	state     ringState
	broken    bool
	announced bool

	// ring is the layout (layout.go) of this start: split, the only one offered.
	ring  layout
	split splitRing
	// ulog is what ring marks of its own areas in the dirty log (log.go).
	ulog areaLog

	// onFault ends the ring's session after a guest memory fault (fault.go). The
	// session sets it before the ring can start; it is called with mu held.
	onFault func(error)
	// waitLocked: the worker holds mu inside Wait or WaitMore, touching the used ring
	// (Guard must release the lock if that access faults). Worker-only, like inBatch.
	waitLocked bool
	// pollWait is the polling worker's current sleep (kick with no fd): it backs off
	// while the ring stays empty. idleKicks counts the kicks since the worker last
	// found work. Both worker-only.
	pollWait  time.Duration
	idleKicks int
	warn      func(msg string, kv ...any) // the Backend's gated Config.Log warnings

	// Data-path state: meaningful while running, touched only under mu.
	pending int // popped, neither pushed nor rewound
	inBatch bool
	dry     bool // this batch found the avail ring empty

	// Call moderation (SetCallModeration), also under mu.
	modEvery     time.Duration // 0: a call whenever the driver asks for one
	lastCall     time.Time     // the last call sent (moderation on only)
	sinceCall    int           // bytes pushed since then
	callDeferred bool          // a call is owed and callTimer will send it
	callTimer    *time.Timer
	// otherLoad is what NoteLoad reported since the last call: bytes the device moved
	// the other way, from the other direction's worker (so atomic, not under mu).
	otherLoad atomic.Int64

	// Dirty logging (log.go), under mu: the session's log while it applies to this
	// ring (nil: not logging), logOn the same for readers without the lock, and the
	// guest-physical ranges of the receive chains popped in the current batch
	// (recorded only while logging).
	log       *dirtyLog
	logOn     atomic.Bool
	logPieces []piece
	logPops   []logPop

	// The poll window (wait.go, SetPollWindow), shared with the goroutine that calls
	// Poke: the window's length (ns, 0 off), the monotonic time until which Poke asked
	// the worker to watch, whether the worker sleeps on its kick, the kick's RawConn for
	// Poke's write, and how many of the kick's counts are Poke's own.
	pollWindow atomic.Int64
	pollUntil  atomic.Int64
	parked     atomic.Bool
	pokeFD     atomic.Pointer[eventFD] // a duplicate of the kick fd, for Poke's write
	selfPokes  atomic.Int32

	kickWoke  bool               // the poller ended sleep's wait (awaitKickFd)
	waitWatch bool               // sleep is Wait's, which watches when Poke opens a window
	awaitKick func(uintptr) bool // v.awaitKickFd, made once: the worker waits without allocating
}

func newVring(index int, writable bool, stats *Stats) *Vring {
	v := &Vring{index: index, writable: writable, stats: stats, warn: func(string, ...any) {}}
	v.split = splitRing{lg: &v.ulog, writable: writable}
	v.ring = &v.split
	v.awaitKick = v.awaitKickFd
	return v
}

// Index is the vhost-user ring index (SET_VRING_*'s index).
func (v *Vring) Index() int { return v.index }

// Writable reports whether the device writes this ring's chains (Config.Writable).
func (v *Vring) Writable() bool { return v.writable }

// Enabled reports SET_VRING_ENABLE's state for a started ring (vhost-user.rst "Ring
// states": a started but disabled ring must not be processed).
func (v *Vring) Enabled() bool { return v.enabled.Load() }

// HdrLen is the device's header length for this start's features (Config.HeaderLen).
func (v *Vring) HdrLen() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.hdrLen
}

// Num is the ring size.
func (v *Vring) Num() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return int(v.num)
}

// feats is what the session passes a ring at start.
type feats struct {
	eventIdx, indirect, protoAcked bool
	hdrLen                         int
}

// startLocked translates the ring and resets the data-path state from SET_VRING_BASE.
// It reports whether the ring is usable; a translation failure counts RejectRingAddr
// and leaves the ring broken (stopped for the data path until restarted).
func (v *Vring) startLocked(mem *guestMem, f feats) bool {
	v.hdrLen = f.hdrLen
	v.mem = mem
	v.state = ringRunning
	v.broken = false
	v.pending = 0
	v.sinceCall, v.callDeferred = 0, false
	v.otherLoad.Store(0)
	v.enabled.Store(!f.protoAcked || v.enableReq)
	if !v.addrSet || !v.ring.start(mem, v.addr, v.num, f, v.base) {
		v.ring.unmap()
		v.failLocked(RejectRingAddr)
		return false
	}
	return true
}

// failLocked records a violation and stops the ring for the data path. Like QEMU's
// virtio_error it leaves the ring alone until the front-end resets it; the err eventfd
// tells QEMU, which logs "vhost vring error in virtqueue N" (hw/virtio/vhost.c
// vhost_virtqueue_error_notifier).
func (v *Vring) failLocked(r Reason) error {
	v.stats.Rejected[r].Add(1)
	v.broken = true
	if v.pendErr == nil && v.errf.acquire() {
		v.pendErr = v.errf // written by unlock
	}
	return ringErrs[r]
}

// unlock releases mu, then writes the signals decided under it (signal.go says why
// never before). Every path of a worker (or the moderation timer) that holds mu and
// may have decided a call or an error signal releases it here: a write that sleeps
// then parks that goroutine, which the session's watchdog sees.
func (v *Vring) unlock() {
	call, errf := v.takeSignalsLocked()
	v.mu.Unlock()
	v.send(call, errf)
}

// unlockAsync is unlock for the session goroutine: the signals go out on a goroutine of
// their own, since the session must go on reading the socket whatever a write to the
// front-end's eventfd does (it is what notices a write that sleeps, and what ends the
// session when the front-end goes away). It waits up to sessionSignalWait for them, so
// that in the ordinary case they still precede the session's next reply: the call a
// ring stop owes must reach the front-end before the GET_VRING_BASE reply hands it the
// ring (QEMU reads what its call notifier holds as it takes over: hw/virtio/virtio.c
// virtio_queue_set_guest_notifier_fd_handler).
func (v *Vring) unlockAsync() {
	call, errf := v.takeSignalsLocked()
	v.mu.Unlock()
	if call == nil && errf == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.send(call, errf)
	}()
	t := time.NewTimer(sessionSignalWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// sessionSignalWait bounds how long the session waits for a signal it sent (an eventfd
// write takes microseconds unless the front-end blocked it).
const sessionSignalWait = 100 * time.Millisecond

func (v *Vring) takeSignalsLocked() (call, errf *eventFD) {
	call, errf = v.pendCall, v.pendErr
	v.pendCall, v.pendErr = nil, nil
	return call, errf
}

func (v *Vring) send(call, errf *eventFD) {
	if call != nil {
		if call.write() {
			v.stats.Calls.Add(1)
		} else {
			v.stats.CallsDropped.Add(1)
		}
	}
	if errf != nil {
		errf.write()
	}
}

// owe decides a call to the driver: pinned now, written when mu is released (unlock).
// A call already pending covers this one; one that cannot be pinned because a write to
// the fd is in flight is owed by that write's thread (eventFD.acquire).
func (v *Vring) oweCallLocked() {
	if v.pendCall == nil && v.call.acquire() {
		v.pendCall = v.call
	}
}

// setFDLocked replaces *slot with e, closing the old eventfd; one with a write still in
// flight is retired until that write ends (busyFDs).
func (v *Vring) setFDLocked(slot **eventFD, e *eventFD) {
	if old := *slot; old != nil && old.close() {
		v.retired = append(v.retired, old)
	}
	*slot = e
}

// busyFDsLocked reports whether any of the ring's eventfds has a write in flight, after
// unjamming each (signal.go), and forgets the retired ones that are done.
func (v *Vring) busyFDsLocked() bool {
	busy := false
	kept := v.retired[:0]
	for _, e := range v.retired {
		if e.busy() {
			kept = append(kept, e)
			busy = true
		}
	}
	clear(v.retired[len(kept):])
	v.retired = kept
	for _, e := range []*eventFD{v.call, v.errf, v.pokeFD.Load()} {
		if e != nil && e.busy() {
			busy = true
		}
	}
	return busy
}

// jammedLocked reports whether a write to one of the ring's eventfds has slept since
// before cutoff (monoNow): the front-end blocked it (signal.go).
func (v *Vring) jammedLocked(cutoff int64) bool {
	for _, e := range v.retired {
		if e.jammed(cutoff) {
			return true
		}
	}
	return v.call.jammed(cutoff) || v.errf.jammed(cutoff) || v.pokeFD.Load().jammed(cutoff)
}

// stopLocked ends a running ring: it publishes what the data path pushed (End already
// did; this is for an abandoned batch), closes kick and call (DPDK and passt do so at
// GET_VRING_BASE; QEMU sends fresh ones at the next start) and returns last_avail_idx.
// A ring that never started answers the base SET_VRING_BASE gave, as libvhost-user,
// DPDK and rust-vmm do.
func (v *Vring) stopLocked() uint16 {
	if v.state == ringRunning && !v.broken && v.ring.mapped() {
		v.flushOnStopLocked()
	}
	v.callDeferred = false
	if v.callTimer != nil {
		v.callTimer.Stop()
	}
	if v.state == ringRunning {
		v.base = v.ring.position()
	}
	v.state = ringStopped
	v.enabled.Store(false)
	v.closeKickLocked()
	v.setFDLocked(&v.call, nil)
	v.ring.unmap()
	return v.base
}

// flushOnStopLocked publishes what an abandoned batch pushed and sends a call owed,
// before the front-end takes the ring over. It runs on the session goroutine, which
// can meet a fault in guest memory here like any worker (fault.go).
func (v *Vring) flushOnStopLocked() {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer v.recoverLocked()
	v.rewindLocked(v.pending)
	v.publishLocked()
	if v.callDeferred && v.call != nil {
		v.callLocked() // owed: the front-end takes over the ring's state now
	}
}

func (v *Vring) closeKickLocked() {
	if p := v.pokeFD.Swap(nil); p != nil && p.close() {
		v.retired = append(v.retired, p)
	}
	if v.kick != nil {
		v.kick.Close() // wakes a Wait blocked on it (os.File is in the poller)
		v.kick, v.kickRC = nil, nil
	}
	v.hasKick, v.kickNoFd = false, false
}
