//go:build linux

package vhostuser

import "time"

// Queue is a started virtqueue as a device's worker uses it, whatever the ring's memory
// layout. The device (vhostnet) sees only this: the session hands each started ring to
// the Handler as a Queue, so a second layout is a second implementation chosen by the
// session, and the device does not change.
//
// Vring implements it for every layout: the memory format is the layout interface
// under it (layout.go). The split layout (virtio spec 1.x §2.7, split.go) is the only
// one tapgro offers today: the device leaves VIRTIO_F_RING_PACKED (34) out of its offer
// (Config.Features). A packed ring (§2.8) is a second layout — descriptors that carry
// the avail/used state with wrap counters instead of the two index rings, event
// suppression in the two structures of §2.8.10 instead of NO_NOTIFY / EVENT_IDX's
// words — that Vring.startLocked picks when the driver acked RING_PACKED. What is not
// the layout's stays in Vring, shared: configuration and fds, guest memory and its
// fault handling (mem.go, fault.go), kick waiting with the poll backoff (wait.go), call
// moderation (notify.go) and the dirty log's chain records (log.go).
//
// The contract, for every layout: one worker uses a Queue, between Begin and End for
// everything that touches guest memory; Pop returns chains in the driver's order with
// every descriptor checked; Push reports them used in the order popped; nothing is
// visible to the driver before End or Publish; a guest that breaks the protocol gets a
// *RingError and the ring stops until the front-end resets it.
type Queue interface {
	// Index is the vhost-user ring index (SET_VRING_*'s index).
	Index() int
	// Writable reports whether the device writes this ring's chains (Config.Writable).
	Writable() bool
	// Enabled reports SET_VRING_ENABLE's state: a started, disabled ring is not served.
	Enabled() bool
	// HdrLen is the device's header length for this start's features; no chain shorter
	// is popped.
	HdrLen() int
	// Num is the ring size: no more chains than this are ever outstanding.
	Num() int

	// Begin starts a batch; ErrStopped or ErrBroken end the worker.
	Begin() error
	// End hands back what was popped and not pushed, publishes, and notifies the driver
	// at most once.
	End()
	// Pop takes the next available chain, filling iov[:cap(iov)] with views of guest
	// memory valid until End; ErrEmpty when there is none.
	Pop(iov [][]byte) (Chain, error)
	// Push records chain head as used, with n bytes written into it.
	Push(head uint16, n uint32)
	// Rewind hands the last n popped, unpushed chains back, to be popped again.
	Rewind(n int)
	// Publish makes what was pushed visible to the driver now, within the batch.
	Publish()
	// Wrote tells the dirty log (migration, log.go) that the first n bytes of chain
	// head were written although the chain is handed back unused; Push does the same
	// for the bytes of a used chain. Logging reports whether the ring is being logged.
	Wrote(head uint16, n int)
	Logging() bool

	// Wait sleeps until the driver makes a chain available (or the ring stops).
	Wait() error
	// WaitMore sleeps until a chain beyond those the last Pop saw is available: for a
	// worker whose reservation ran out part-way.
	WaitMore() error
	// SetCallModeration bounds the calls under load to one per d (0: none held back).
	// NoteLoad counts bytes moved the other way as load too.
	SetCallModeration(d time.Duration)
	NoteLoad(n int)
	// SetPollWindow sets how long Poke, from another goroutine, makes the worker watch
	// the ring before it sleeps on the kick (0: off).
	SetPollWindow(d time.Duration)
	Poke()
	// Guard, deferred by a worker that touches guest memory, turns a fault there into
	// the end of the session (fault.go) and sets *faulted.
	Guard(faulted *bool)
}

var _ Queue = (*Vring)(nil)
