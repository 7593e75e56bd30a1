//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Split-ring layout (virtio spec "Split Virtqueues"; linux include/uapi/linux/virtio_ring.h).
const (
	descSize = 16

	descFNext     = 1 // VRING_DESC_F_NEXT
	descFWrite    = 2 // VRING_DESC_F_WRITE: device-writable
	descFIndirect = 4 // VRING_DESC_F_INDIRECT

	availFNoInterrupt = 1 // VRING_AVAIL_F_NO_INTERRUPT
	usedFNoNotify     = 1 // VRING_USED_F_NO_NOTIFY

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
	RejectAvailJump                 // more than num chains outstanding (QEMU "Guest moved used index", "Virtqueue size exceeded")
	RejectAddress                   // buffer outside every region
	RejectLenOverflow               // addr+len wraps, or chain longer than a used.len can say
	RejectShortChain                // chain shorter than the device's header (Config.HeaderLen)
	RejectIndirect                  // indirect not negotiated, bad size, nested, or with NEXT
	RejectIovFull                   // more segments than the caller's iovec slice holds
	RejectRingAddr                  // ring parts unmapped, not in one region, or misaligned
	RejectFault                     // guest memory faulted (its file shrank): the session ends (fault.go)
	RejectKick                      // the kick fd kept signalling with no work (Vring.sleep)
	NumReasons
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
	// ErrEmpty: no available chain (or, for ReserveRX, not enough to hold the frame).
	ErrEmpty = errors.New("vhost-user: no available chain")
	// ErrBroken: the guest broke the ring protocol; the ring stays stopped until the
	// front-end restarts it. errors.Is(err, ErrBroken) holds for every RingError.
	ErrBroken = errors.New("vhost-user: ring broken by the guest")
)

// RingError is the error a violation returns; Reason says which check failed.
type RingError struct{ Reason Reason }

func (e *RingError) Error() string { return "vhost-user: ring broken: " + e.Reason.String() }
func (e *RingError) Unwrap() error { return ErrBroken }

// Preallocated so that a violation on the data path does not allocate either.
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
	addr      VringAddr
	addrSet   bool
	base      uint16
	kick      *os.File // nil: none yet, or polling when kickNoFd
	kickNoFd  bool
	hasKick   bool
	callFd    int
	errFd     int
	enableReq bool

	mem                   *guestMem
	eventIdx, indirectOK  bool
	hdrLen                int
	state                 ringState
	broken                bool
	announced             bool
	desc, avail, used     []byte
	mask                  uint16
	usedEventOff, availEv int

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
	logf      func(string, ...any) // the Backend's Config.Logf

	// Data-path state: meaningful while running, touched only under mu.
	lastAvail      uint16 // next avail index to consume
	availCache     uint16 // avail->idx last read
	usedIdx        uint16 // next used index to write (shadow)
	pubIdx         uint16 // used->idx as last published
	usedFlags      uint16
	pending        int // popped, neither pushed nor rewound
	signalled      uint16
	signalledValid bool
	inBatch        bool
	dry            bool // this batch found the avail ring empty

	// Call moderation (SetCallModeration), also under mu.
	modEvery     time.Duration // 0: a call whenever the driver asks for one
	lastCall     time.Time     // the last call sent (moderation on only)
	sinceCall    int           // bytes pushed since then
	callDeferred bool          // a call is owed and callTimer will send it
	callTimer    *time.Timer

	kickBuf [8]byte
	one     [8]byte
}

func newVring(index int, writable bool, stats *Stats) *Vring {
	v := &Vring{index: index, writable: writable, stats: stats, callFd: -1, errFd: -1,
		logf: func(string, ...any) {}}
	binary.LittleEndian.PutUint64(v.one[:], 1)
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
	v.eventIdx, v.indirectOK, v.hdrLen = f.eventIdx, f.indirect, f.hdrLen
	v.mem = mem
	v.state = ringRunning
	v.broken = false
	v.lastAvail, v.availCache, v.usedIdx, v.pubIdx = v.base, v.base, v.base, v.base
	v.pending, v.usedFlags = 0, 0
	v.signalledValid = false // first call after a (re)start is unconditional
	v.sinceCall, v.callDeferred = 0, false
	v.enabled.Store(!f.protoAcked || v.enableReq)
	if !v.translateLocked() {
		v.failLocked(RejectRingAddr)
		return false
	}
	return true
}

// translateLocked maps desc/avail/used for their full sizes, event words included
// (DPDK translate_ring_addresses checks full sizes; libvhost-user map_ring does not).
func (v *Vring) translateLocked() bool {
	v.desc, v.avail, v.used = nil, nil, nil
	n := uint64(v.num)
	if !v.addrSet || n == 0 || v.mem == nil {
		return false
	}
	d := v.mem.qva(v.addr.Desc, descSize*n)
	a := v.mem.qva(v.addr.Avail, 6+2*n)
	u := v.mem.qva(v.addr.Used, 6+8*n)
	// Alignment: desc 16 and used 4 are the spec's; avail is only 2-aligned in the
	// spec, but its {flags, idx} word is read with one 32-bit atomic, so require 4.
	if d == nil || a == nil || u == nil || !aligned(d, 16) || !aligned(a, 4) || !aligned(u, 4) {
		return false
	}
	v.desc, v.avail, v.used = d, a, u
	v.mask = uint16(v.num - 1)
	v.usedEventOff = 4 + 2*int(v.num) // avail->used_event (vring_used_event)
	v.availEv = 4 + 8*int(v.num)      // used->avail_event (vring_avail_event)
	return true
}

// failLocked records a violation and stops the ring for the data path. Like QEMU's
// virtio_error it leaves the ring alone until the front-end resets it; the err eventfd
// tells QEMU, which logs "vhost vring error in virtqueue N" (hw/virtio/vhost.c
// vhost_virtqueue_error_notifier).
func (v *Vring) failLocked(r Reason) error {
	v.stats.Rejected[r].Add(1)
	v.broken = true
	if v.errFd >= 0 {
		v.signal(v.errFd)
	}
	return ringErrs[r]
}

// signal adds 1 to one of the front-end's eventfds (call or err). The session takes
// only eventfds for them and sets O_NONBLOCK (Session.vringFile), so a counter at its
// limit (2^64-2, eventfd(2)) answers EAGAIN instead of blocking: the count already in
// it wakes the front-end anyway, so the signal is counted and dropped. It is a plain
// write, not a rawsys one: a front-end can clear O_NONBLOCK on its own copy of the
// file later, and a write blocked then holds this goroutine, not the whole runtime
// (a raw system call never lets the garbage collector stop the world).
func (v *Vring) signal(fd int) bool {
	n, err := unix.Write(fd, v.one[:])
	return err == nil && n == len(v.one)
}

// stopLocked ends a running ring: it publishes what the data path pushed (End already
// did; this is for an abandoned batch), closes kick and call (DPDK and passt do so at
// GET_VRING_BASE; QEMU sends fresh ones at the next start) and returns last_avail_idx.
// A ring that never started answers the base SET_VRING_BASE gave, as libvhost-user,
// DPDK and rust-vmm do.
func (v *Vring) stopLocked() uint16 {
	if v.state == ringRunning && !v.broken && v.used != nil {
		v.flushOnStopLocked()
	}
	v.callDeferred = false
	if v.callTimer != nil {
		v.callTimer.Stop()
	}
	if v.state == ringRunning {
		v.base = v.lastAvail
	}
	v.state = ringStopped
	v.enabled.Store(false)
	v.closeKickLocked()
	v.closeFd(&v.callFd)
	v.desc, v.avail, v.used = nil, nil, nil
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
	if v.callDeferred && v.callFd >= 0 {
		v.callLocked() // owed: the front-end takes over the ring's state now
	}
}

func (v *Vring) closeKickLocked() {
	if v.kick != nil {
		v.kick.Close() // wakes a Wait blocked on it (os.File is in the poller)
		v.kick = nil
	}
	v.hasKick, v.kickNoFd = false, false
}

func (v *Vring) closeFd(p *int) {
	if *p >= 0 {
		unix.Close(*p)
		*p = -1
	}
}

// Begin starts a batch: until End the caller may Pop, Push, Rewind, ReserveRX and
// CommitRX, and use the iovecs they return. Hold a batch only across non-blocking work
// (a readv/writev on a ready TAP): the control plane waits for End.
func (v *Vring) Begin() error {
	v.mu.Lock()
	if v.state != ringRunning {
		v.mu.Unlock()
		return ErrStopped
	}
	if v.broken {
		v.mu.Unlock()
		return ErrBroken
	}
	v.inBatch, v.dry = true, false
	return nil
}

// End finishes a batch: chains popped but neither pushed nor rewound are handed back,
// the used entries are published with one used->idx store, and the guest is notified
// at most once.
func (v *Vring) End() {
	if !v.inBatch {
		return // Begin failed: the lock is not held (inBatch is the worker's own)
	}
	if !v.broken {
		v.rewindLocked(v.pending)
		v.publishLocked()
		if v.dry && v.callDeferred {
			// The driver is out of buffers and posts more only after processing
			// what it has: a call owed is due now, or the ring idles until the timer.
			v.callLocked()
		}
		if v.eventIdx {
			// Ask for a kick at the next index we will look at (QEMU
			// virtqueue_split_pop → vring_set_avail_event(vq, last_avail_idx)).
			store16(v.used, v.availEv, v.lastAvail)
		}
	}
	v.inBatch = false
	v.mu.Unlock()
}

// Pop takes the next available chain and fills iov[:cap(iov)] with views of its
// buffers. ErrEmpty means there is none; a *RingError means the guest broke the
// protocol, the violation was counted, and the ring is stopped.
func (v *Vring) Pop(iov [][]byte) (Chain, error) {
	if !v.inBatch || v.broken {
		return Chain{}, ErrBroken
	}
	if v.lastAvail == v.availCache {
		// One 32-bit seq-cst load of {flags, idx} (idx is the high half on LE). Its
		// acquire orders the ring-entry and descriptor reads after it (QEMU
		// virtqueue_num_heads: read idx, smp_rmb, then the ring).
		idx := uint16(load32(v.avail, 0) >> 16)
		// An honest driver has at most num chains outstanding: a descriptor is
		// reused only after its chain shows in the used ring as published (pubIdx).
		// Counting from there, not from last_avail_idx as QEMU's virtqueue_num_heads
		// does, also bounds what tapgro holds popped or pushed-but-unpublished (QEMU's
		// second check, virtqueue_pop "Virtqueue size exceeded"), so used entries can
		// never be written over unpublished ones.
		if uint16(idx-v.pubIdx) > uint16(v.num) {
			return Chain{}, v.failLocked(RejectAvailJump)
		}
		d := idx - v.lastAvail
		if d == 0 {
			v.dry = true
			return Chain{}, ErrEmpty
		}
		v.availCache = idx
	}
	slot := int(v.lastAvail & v.mask)
	head := binary.LittleEndian.Uint16(v.avail[4+2*slot:])
	c, r, ok := v.walk(head, iov)
	if !ok {
		return Chain{}, v.failLocked(r)
	}
	v.lastAvail++
	v.pending++
	return c, nil
}

// walk follows a chain from head. Every index is checked before use, every address is
// translated through the region table, and the number of descriptors is bounded, so a
// hostile table can make it fail but not loop or touch unmapped memory.
func (v *Vring) walk(head uint16, iov [][]byte) (Chain, Reason, bool) {
	num := v.num
	if uint32(head) >= num {
		return Chain{}, RejectHeadRange, false
	}
	tbl := v.desc
	tblN := num
	i := uint32(head)
	count := uint32(0)
	indirect := false
	k := 0
	var total uint64
	for {
		d := tbl[descSize*i : descSize*i+descSize]
		addr := binary.LittleEndian.Uint64(d[0:])
		ln := binary.LittleEndian.Uint32(d[8:])
		flags := binary.LittleEndian.Uint16(d[12:])
		next := binary.LittleEndian.Uint16(d[14:])
		if flags&descFIndirect != 0 {
			// virtio spec "Indirect Descriptors": the driver MUST NOT set INDIRECT
			// and NEXT together, nor INDIRECT inside an indirect table; QEMU
			// (virtqueue_split_pop) and DPDK (fill_vec_buf_split) accept it only on
			// the chain head. len/16 ≤ num is DPDK's bound.
			if !v.indirectOK || indirect || count != 0 || flags&descFNext != 0 ||
				ln == 0 || ln%descSize != 0 || ln/descSize > num {
				return Chain{}, RejectIndirect, false
			}
			if addr+uint64(ln) < addr {
				return Chain{}, RejectLenOverflow, false
			}
			t := v.mem.gpa(addr, uint64(ln))
			if t == nil {
				return Chain{}, RejectAddress, false
			}
			tbl, tblN, i, indirect = t, ln/descSize, 0, true
			continue
		}
		count++
		if count > tblN {
			return Chain{}, RejectLoop, false
		}
		if ln == 0 {
			return Chain{}, RejectZeroLen, false
		}
		if (flags&descFWrite != 0) != v.writable {
			return Chain{}, RejectDirection, false
		}
		if addr+uint64(ln) < addr {
			return Chain{}, RejectLenOverflow, false
		}
		total += uint64(ln)
		if total > math.MaxUint32 {
			return Chain{}, RejectLenOverflow, false
		}
		var r Reason
		var ok bool
		if k, r, ok = v.mem.gpaIov(addr, uint64(ln), iov, k); !ok {
			return Chain{}, r, false
		}
		if flags&descFNext == 0 {
			break
		}
		if uint32(next) >= tblN {
			return Chain{}, RejectNextRange, false
		}
		i = uint32(next)
	}
	if total < uint64(v.hdrLen) {
		return Chain{}, RejectShortChain, false
	}
	return Chain{Head: head, Len: int(total), Iov: iov[:k:k]}, 0, true
}

// Push records a used entry {head, n bytes written} in the used ring slot after the
// last published one. The driver cannot see it before End stores used->idx. Push chains
// in the order they were popped, so that used->idx is an exact restart point.
func (v *Vring) Push(head uint16, n uint32) {
	if !v.inBatch || v.broken || v.pending == 0 {
		return
	}
	e := v.used[4+8*int(v.usedIdx&v.mask):]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], n)
	v.usedIdx++
	v.pending--
	v.sinceCall += int(n)
}

// Rewind hands the last n popped (and not pushed) chains back: they will be popped
// again (passt virtio.c vu_queue_rewind).
func (v *Vring) Rewind(n int) {
	if v.inBatch && !v.broken {
		v.rewindLocked(n)
	}
}

func (v *Vring) rewindLocked(n int) {
	n = min(n, v.pending)
	if n <= 0 {
		return
	}
	v.lastAvail -= uint16(n)
	v.pending -= n
}

// publishLocked stores used->idx once for everything pushed since the last publish and
// sends at most one call, or owes it to the moderation timer.
func (v *Vring) publishLocked() {
	if v.usedIdx == v.pubIdx {
		return
	}
	// The used entries (plain stores) precede this seq-cst store, which is the write
	// barrier before used->idx (QEMU virtqueue_split_flush: smp_wmb, then idx).
	store32(v.used, 0, uint32(v.usedIdx)<<16|uint32(v.usedFlags))
	v.pubIdx = v.usedIdx
	if v.callFd < 0 {
		return
	}
	if !v.needCallLocked() {
		// The driver polls, or asked for an event further on: what it will see
		// without a call needs none, and a call owed is no longer (the driver moved
		// its event index past everything published, so it is processing).
		v.signalled, v.signalledValid = v.pubIdx, true
		v.callDeferred = false
		return
	}
	if v.modEvery > 0 && v.sinceCall >= moderateBytes {
		// Under load: at most one call per modEvery. The call is owed, not lost:
		// the timer sends it when the interval is up, unless by then the driver has
		// consumed everything without one (deferredCall asks again).
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

// needCallLocked reports whether the driver asked to be told about the used entries
// published up to pubIdx since the last call or decision (v.signalled).
func (v *Vring) needCallLocked() bool {
	// This seq-cst load after the used->idx store is the full barrier before reading
	// the driver's suppression hints (QEMU virtio_split_should_notify: smp_mb).
	aw := load32(v.avail, 0)
	if !v.eventIdx {
		return uint16(aw)&availFNoInterrupt == 0
	}
	// QEMU virtio_split_should_notify / DPDK vhost_vring_call_split: the first call
	// after a start is unconditional, then vring_need_event decides from the used idx
	// at the previous decision (QEMU's signalled_used). A deferred call keeps that
	// index, so the question covers every entry published since.
	return !v.signalledValid || vringNeedEvent(load16(v.avail, v.usedEventOff), v.pubIdx, v.signalled)
}

// callLocked signals the call eventfd for everything published.
func (v *Vring) callLocked() {
	v.signalled, v.signalledValid = v.pubIdx, true
	v.callDeferred, v.sinceCall = false, 0
	if v.modEvery > 0 {
		v.lastCall = time.Now()
	}
	if v.signal(v.callFd) {
		v.stats.Calls.Add(1)
	} else {
		v.stats.CallsDropped.Add(1)
	}
}

// deferredCall is the moderation timer: it sends the owed call if the driver still
// wants it. It reads the avail ring on the timer's goroutine, so it recovers a fault
// there itself (fault.go).
func (v *Vring) deferredCall() {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	v.mu.Lock()
	defer v.mu.Unlock()
	defer v.recoverLocked()
	if !v.callDeferred {
		return
	}
	if v.state != ringRunning || v.broken || v.callFd < 0 || v.used == nil {
		v.callDeferred = false
		return
	}
	if wait := v.modEvery - time.Since(v.lastCall); wait > 0 {
		v.callTimer.Reset(wait) // a Reset raced with an earlier expiry
		return
	}
	if v.needCallLocked() {
		v.callLocked()
		return
	}
	v.signalled, v.callDeferred = v.pubIdx, false
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
// pushed since the last call; a call due sooner is owed to a timer, which drops it if
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

// Publish makes what was pushed so far visible to the driver and signals it, as End
// would, in the middle of a batch. Per-frame publishing is the baseline moderation is
// measured against; with MRG_RXBUF call it after CommitRX, never between the chains
// of one frame (the driver reads num_buffers chains at once).
func (v *Vring) Publish() {
	if v.inBatch && !v.broken {
		v.publishLocked()
	}
}

// vringNeedEvent is vring_need_event from linux include/uapi/linux/virtio_ring.h: should
// moving the index from old to newIdx notify a peer waiting for event_idx?
func vringNeedEvent(eventIdx, newIdx, old uint16) bool {
	return newIdx-eventIdx-1 < newIdx-old
}

// Wait blocks until the ring may have work. Before sleeping it re-enables kicks
// (avail_event with EVENT_IDX, else clears NO_NOTIFY), issues a full barrier and
// re-reads avail->idx, so a chain made available meanwhile is not missed (QEMU
// virtio_queue_split_set_notification: smp_mb after enabling). It returns ErrStopped
// or ErrBroken when the worker should stop.
func (v *Vring) Wait() error {
	for {
		if err := v.lockForWait(); err != nil {
			return err
		}
		if v.eventIdx {
			store16(v.used, v.availEv, v.lastAvail)
		} else {
			v.usedFlags = 0
		}
		// Seq-cst store then seq-cst load: the full barrier between enabling kicks
		// and the final check of avail->idx.
		store32(v.used, 0, uint32(v.pubIdx)<<16|uint32(v.usedFlags))
		if uint16(load32(v.avail, 0)>>16) != v.lastAvail {
			if !v.eventIdx {
				// Kicks are not needed while we poll (virtio spec "Used Buffer
				// Notification Suppression", VIRTQ_USED_F_NO_NOTIFY).
				v.usedFlags = usedFNoNotify
				store32(v.used, 0, uint32(v.pubIdx)<<16|uint32(v.usedFlags))
			}
			v.unlockForWait()
			v.pollWait, v.idleKicks = 0, 0
			return nil
		}
		f, poll := v.kick, v.kickNoFd
		v.unlockForWait()
		if err := v.sleep(f, poll); err != nil {
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
	v.mu.Unlock()
}

// Polling (SET_VRING_KICK with VHOST_USER_VRING_NOFD_MASK: no eventfd, vhost-user.rst
// SET_VRING_KICK) looks at the ring pollMin after it was last found busy, backing off
// by doubling to pollMax while it stays empty: an idle polled ring wakes 100 times a
// second, and a busy one is looked at within 50 µs. Each wake-up costs this host tens
// of µs of the runtime's time (BenchmarkIdlePolledRing: 4 ms cost 1.5 % of a core
// against 0.13 % for a ring idle on its kick eventfd; 10 ms about 1 %).
const (
	pollMin = 50 * time.Microsecond
	pollMax = 10 * time.Millisecond
)

// kickStorm is how many kicks in a row may find no work before the kick counts as
// broken. A driver kicks after it made chains available (virtio spec "Available
// Buffer Notifications"), so a spurious kick is rare and never many in a row; a
// semaphore eventfd with a huge count, or anything else that is always readable, would
// otherwise keep the worker spinning on a core.
const kickStorm = 1 << 16

// sleep waits for the next kick on f, or polls. ErrStopped: nothing to wait on (the
// ring has no kick: it is stopping). ErrBroken: the kick never goes quiet; the ring is
// stopped as the other violations stop it, counted (RejectKick) and logged.
func (v *Vring) sleep(f *os.File, poll bool) error {
	if f == nil {
		if !poll {
			return ErrStopped
		}
		v.pollWait = min(max(2*v.pollWait, pollMin), pollMax)
		time.Sleep(v.pollWait)
		return nil
	}
	_, err := f.Read(v.kickBuf[:])
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	if err == nil {
		v.stats.Kicks.Add(1)
	}
	if v.idleKicks++; v.idleKicks < kickStorm {
		return nil
	}
	v.idleKicks = 0
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state != ringRunning || v.broken {
		return ErrStopped
	}
	v.failLocked(RejectKick)
	v.logf("vhost-user: ring %d: %d kicks in a row found no work (last read: %v); ring stopped", v.index, kickStorm, err)
	return ErrBroken
}

// CopyFrom copies the concatenation of iov, skipping the first skip bytes, into dst and
// returns the bytes copied. A helper for reading a header split over descriptors.
func CopyFrom(dst []byte, iov [][]byte, skip int) int {
	n := 0
	for _, s := range iov {
		if skip >= len(s) {
			skip -= len(s)
			continue
		}
		c := copy(dst[n:], s[skip:])
		n += c
		skip = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// CopyTo copies src into the concatenation of iov from its start and returns the bytes
// copied.
func CopyTo(iov [][]byte, src []byte) int {
	n := 0
	for _, s := range iov {
		if n == len(src) {
			break
		}
		n += copy(s, src[n:])
	}
	return n
}
