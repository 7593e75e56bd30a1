//go:build linux

package vhostuser

// A worker's batch (Begin … End): taking chains with every descriptor checked (Pop),
// reporting them used (Push) or handing them back (Rewind), through the ring's layout
// (layout.go). Publishing and the guest's notification are notify.go's; sleeping for
// work is wait.go's.

// Begin starts a batch: until End the caller may Pop, Push, Rewind and Publish, and use
// the iovecs Pop returns. Hold a batch only across non-blocking work
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
	v.logPieces, v.logPops = v.logPieces[:0], v.logPops[:0]
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
		if v.dry && v.writable && v.callDeferred {
			// The driver is out of buffers and posts more only after processing
			// what it has: a call owed is due now, or the ring idles until the timer.
			// (A ring the device reads is empty whenever the device has caught up:
			// that asks nothing of the driver.)
			v.callLocked()
		}
		// Kicks stay as they are: disabled while the worker runs (avail_event left
		// behind, or NO_NOTIFY) until it is about to sleep, when Wait or WaitMore
		// enables them and looks at avail->idx once more (wait.go). QEMU instead moves
		// avail_event at every pop (virtqueue_split_pop → vring_set_avail_event), which
		// lets the driver kick a worker that is awake and about to look anyway (Linux
		// vhost's handle_tx keeps them off until the ring is empty: vhost_enable_notify).
	}
	v.inBatch = false
	v.unlock()
}

// Pop takes the next available chain and fills iov[:cap(iov)] with views of its
// buffers. ErrEmpty means there is none; a *RingError means the guest broke the
// protocol, the violation was counted, and the ring is stopped.
func (v *Vring) Pop(iov [][]byte) (Chain, error) {
	if !v.inBatch || v.broken {
		return Chain{}, ErrBroken
	}
	// Logging: keep the chain's guest-physical ranges for Push and Wrote.
	var pieces *[]piece
	from := len(v.logPieces)
	if v.log != nil && v.writable {
		pieces = &v.logPieces
	}
	c, r := v.ring.pop(iov, pieces)
	if r != popOK {
		if r == popEmpty {
			v.dry = true
			return Chain{}, ErrEmpty
		}
		v.logPieces = v.logPieces[:from]
		return Chain{}, v.failLocked(r)
	}
	if pieces != nil {
		v.recordPopLocked(c.Head, from)
	}
	v.pending++
	return c, nil
}

// Push records a used entry {head, n bytes written} after the last published one. The
// driver cannot see it before End (or Publish). Push chains in the order they were
// popped, so that the ring's position is an exact restart point.
func (v *Vring) Push(head uint16, n uint32) {
	if !v.inBatch || v.broken || v.pending == 0 {
		return
	}
	if v.log != nil && v.writable {
		v.logWrittenLocked(head, uint64(n), false)
	}
	v.ring.push(head, n)
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
	v.ring.rewind(n)
	v.pending -= n
	v.rewindLogLocked(n)
}
