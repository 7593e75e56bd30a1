//go:build linux

package vhostuser

import "tapgro/vhostuser/vuproto"

// The ring has two seams, as rust-vmm's vhost-user-backend has them (VringT over
// QueueT). Vring is the per-ring state a layout does not decide: the front-end's
// configuration and eventfds, the worker's batch and lock discipline, call moderation,
// the poll window, kick waiting, the dirty log's chain records, fault recovery. Under
// it, layout is how the driver's and the device's areas sit in guest memory and how
// each side tells the other what it did: the split layout (virtio spec 1.x §2.7,
// split.go) is the one tapgro offers. A packed one (§2.8: descriptors that carry the
// avail and used state with wrap counters, event suppression in two structures of
// §2.8.10) is one more implementation that Vring.startLocked picks when the driver
// acked VIRTIO_F_RING_PACKED; nothing above the layout changes.

// layout is one virtqueue's memory format, device side. Every method is called with
// the Vring's mu held, between a start and the next stop, by the ring's one worker
// (or the session, or the moderation timer, each under mu); any access to guest memory
// may fault, which the caller's recovery handles (fault.go).
type layout interface {
	// start maps the ring's areas at addr for num entries through mem (full sizes,
	// alignment checked) and sets the device's position from SET_VRING_BASE's base.
	// false: the ring is unusable (RejectRingAddr).
	start(mem *guestMem, addr vuproto.VringAddr, num uint32, f feats, base uint16) bool
	// remap maps the same areas again through a new mem (SET_MEM_TABLE), keeping
	// the position; false as for start.
	remap(mem *guestMem) bool
	// setFeats takes a running ring's new acks (SET_FEATURES).
	setFeats(f feats)
	// unmap drops every view of guest memory; mapped reports whether there are any.
	unmap()
	mapped() bool
	// position is what GET_VRING_BASE answers: where the device will pop next.
	position() uint16
	// published reports whether the device published anything since the start.
	published() bool

	// pop takes the next available chain, every descriptor checked, into
	// iov[:cap(iov)]; with pieces non-nil (a logged receive ring) it appends each
	// descriptor's guest-physical range. popEmpty: none; another Reason: the driver
	// broke the protocol (the caller counts it and stops the ring). Plain results, no
	// error values: this is the one call per chain, and what it returns is copied once.
	pop(iov [][]byte, pieces *[]piece) (Chain, Reason)
	// push records chain head used with n bytes written, invisible to the driver
	// until publish; rewind hands the last n popped, unpushed chains back.
	push(head uint16, n uint32)
	rewind(n int)
	// publish makes every push so far visible to the driver, reporting whether there
	// was any.
	publish() bool

	// needCall reports whether the driver asked to be told about what is published
	// since the last call decision; signalled records such a decision (a call made,
	// or one the driver did not want); backlogged reports half a ring or more
	// published since the last one (moderation must not hold a call back then).
	needCall() bool
	signalled()
	backlogged() bool

	// armKicks asks the driver for a kick when it makes a chain available beyond
	// the position (more: beyond what the last pop saw), issues the full barrier and
	// reports whether one is available already; then the kicks are left as a worker
	// taking chains wants them. armed reports whether the driver has since moved
	// past that point; available whether any chain is available beyond the position.
	// kicksOff stops the driver's kicks while the worker watches the ring.
	armKicks(more bool) bool
	armed() bool
	available() bool
	kicksOff()
}

// areaLog marks what a layout writes in the ring's own areas in the dirty log, at the
// ring's log_guest_addr (SET_VRING_ADDR; linux drivers/vhost/vhost.c log_used). The
// Vring keeps it current (setLogLocked); log nil: the ring is not logged.
type areaLog struct {
	log *dirtyLog
	gpa uint64
}

// mark records bytes [off, off+n) of the ring's logged area as written.
func (a *areaLog) mark(off, n int) {
	if a.log != nil {
		a.log.mark(a.gpa+uint64(off), uint64(n))
	}
}
