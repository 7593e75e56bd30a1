//go:build linux

package vhostuser

import "fmt"

// Guest memory can fault. The front-end owns the files behind the mappings and may
// truncate one after SET_MEM_TABLE was checked (mapMemTable); the next access to a page
// past the new end raises SIGBUS, which Go makes fatal to the whole process unless the
// faulting goroutine asked for a panic instead (runtime/debug.SetPanicOnFault). So
// every goroutine that touches guest memory does, and recovers the panic at a point
// that knows which locks it holds:
//
//   - a ring worker defers Vring.Guard at its top (after SetPanicOnFault); Guard
//     releases the ring's lock if the worker held it (inside a batch, or in Wait);
//   - the session's own accesses (publishing at GET_VRING_BASE) and the call
//     moderation timer recover inside the function that holds the lock.
//
// A fault breaks the ring, is counted (Stats.Rejected[RejectFault]) and ends the
// session with an error that names the region, so the owner logs it once; the next
// session starts from scratch. Faults in the kernel's own copies (readv/writev on the
// TAP from guest memory) come back as EFAULT, not as a signal, and are counted as TAP
// errors by the owner.

// faultOrPanic returns where r, a recovered panic value, faulted, if it is a memory
// fault that SetPanicOnFault turned into a panic (a runtime.Error with an Addr method)
// inside one of the ring's current mappings: guest RAM or the dirty log. Any other
// panic, and a fault anywhere else, is not the front-end's doing but tapgro's own bug,
// and goes on: a crash with a stack is the right answer to that.
func (v *Vring) faultOrPanic(r any) (addr uintptr, region int, inLog bool) {
	e, ok := r.(interface {
		error
		Addr() uintptr
	})
	if !ok {
		panic(r)
	}
	addr = e.Addr()
	region, inLog = v.mem.regionOf(addr), v.log.holds(addr)
	if region < 0 && !inLog {
		panic(r)
	}
	return addr, region, inLog
}

// FaultError is how a session ends after guest memory or the dirty log faulted.
type FaultError struct {
	Ring   int     // the ring whose access faulted
	Addr   uintptr // the faulting host address
	Region int     // the SET_MEM_TABLE region it lies in, -1 if in the log
	InLog  bool    // the fault was in the dirty log (SET_LOG_BASE)
}

func (e *FaultError) Error() string {
	if e.InLog {
		return fmt.Sprintf("vhost-user: dirty log fault on ring %d at %#x: "+
			"the front-end shrank or unmapped the file behind the log", e.Ring, e.Addr)
	}
	return fmt.Sprintf("vhost-user: guest memory fault on ring %d at %#x in region %d: "+
		"the front-end shrank or unmapped the file behind guest RAM", e.Ring, e.Addr, e.Region)
}

// Guard recovers a guest memory fault in a ring worker. Defer it at the top of the
// worker's goroutine, after debug.SetPanicOnFault(true), and let the worker return
// when it does: the ring is broken and its session is ending. *faulted is set, so that
// the worker can skip work that would trust state a fault interrupted (a half-built
// aggregate). Any other panic is not Guard's business and continues.
func (v *Vring) Guard(faulted *bool) {
	r := recover()
	if r == nil {
		return
	}
	if !v.inBatch && !v.waitLocked {
		v.mu.Lock()
	}
	v.inBatch, v.waitLocked = false, false
	v.faultLocked(v.faultOrPanic(r))
	v.unlock()
	if faulted != nil {
		*faulted = true
	}
}

// recoverLocked is Guard for code that holds v.mu itself and releases it by defer:
// deferred after the unlock, it runs first.
func (v *Vring) recoverLocked() {
	if r := recover(); r != nil {
		v.faultLocked(v.faultOrPanic(r))
	}
}

// faultLocked breaks the ring after a fault at addr and has its session end.
func (v *Vring) faultLocked(addr uintptr, region int, inLog bool) {
	v.failLocked(RejectFault)
	if v.onFault != nil {
		v.onFault(&FaultError{Ring: v.index, Addr: addr, Region: region, InLog: inLog})
	}
}
