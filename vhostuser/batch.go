//go:build linux

package vhostuser

import (
	"encoding/binary"
	"math"
)

// The data path of a split virtqueue (virtio spec "Split Virtqueues"): a worker's batch
// (Begin … End), taking chains off the avail ring with every descriptor checked (Pop,
// walk), and writing used entries (Push) or handing chains back (Rewind). Publishing
// and the guest's notification are notify.go's; sleeping for work is wait.go's.

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
		//
		// And avail->idx never moves back: an index behind the last one seen
		// (lastAvail, here equal to availCache) would make idx-lastAvail wrap to
		// nearly 65536 chains, popped from stale slots over used entries not yet
		// published. pubIdx ≤ lastAvail ≤ idx, in the ring's modular order, is the
		// whole condition (QEMU virtqueue_num_heads checks only the first half).
		if uint16(idx-v.pubIdx) > uint16(v.num) || uint16(idx-v.lastAvail) > uint16(idx-v.pubIdx) {
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
	// Logging: keep the chain's guest-physical ranges for Push and Wrote.
	logging := v.log != nil && v.writable
	from := len(v.logPieces)
	c, r, ok := v.walk(head, iov, logging)
	if !ok {
		return Chain{}, v.failLocked(r)
	}
	if logging {
		v.recordPopLocked(head, from)
	}
	v.lastAvail++
	v.pending++
	return c, nil
}

// walk follows a chain from head. Every index is checked before use, every address is
// translated through the region table, and the number of descriptors is bounded, so a
// hostile table can make it fail but not loop or touch unmapped memory.
//
// With logging (dirty log, receive rings) each descriptor's guest-physical range is
// appended to logPieces, as read here once: what the device writes and what it marks
// are the same ranges, whatever the guest does to its table meanwhile.
func (v *Vring) walk(head uint16, iov [][]byte, logging bool) (Chain, Reason, bool) {
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
		if logging {
			v.logPieces = append(v.logPieces, piece{addr, uint64(ln)})
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
	off := 4 + 8*int(v.usedIdx&v.mask)
	e := v.used[off:]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], n)
	if v.log != nil {
		if v.writable {
			v.logWrittenLocked(head, uint64(n), false)
		}
		v.logUsedLocked(off, 8)
	}
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
	v.rewindLogLocked(n)
}
