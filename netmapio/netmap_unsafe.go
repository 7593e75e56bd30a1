package netmapio

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// This file is the only place that touches netmap shared memory. Everything else sees
// an nmRing: a ring header whose constant fields were checked once, and accessors that
// bounds-check every index read from the region. The other side of the region is the
// kernel acting for another process (a VALE peer) and is not trusted: a bad value is
// reported to the caller, never used to index memory, and never a panic.

// Layout of the shared region on 64-bit Linux (struct netmap_if, netmap_ring and
// netmap_slot in netmap sys/net/netmap.h).
const (
	nmIfHdrSize   = 56  // struct netmap_if up to ring_ofs[]
	nmRingHdrSize = 256 // struct netmap_ring up to slot[]
	nmSlotSize    = 16  // struct netmap_slot

	nifTxRings     = 24
	nifRxRings     = 28
	nifHostTxRings = 36
	nifHostRxRings = 40
	nifRingOfs     = 56 // ssize_t ring_ofs[], relative to the netmap_if

	ringBufOfs   = 0  // int64, buffers at ring + buf_ofs + idx*nr_buf_size
	ringNumSlots = 8  // uint32
	ringBufSize  = 12 // uint32
	ringDir      = 18 // uint16: 0 tx, 1 rx
	ringHead     = 20 // uint32, written by us
	ringCur      = 24 // uint32, written by us
	ringTail     = 28 // uint32, written by the kernel

	slotBufIdx = 0 // uint32
	slotLen    = 4 // uint16
	slotFlags  = 6 // uint16
)

// Sanity bounds on what the kernel may report. netmap's own limits are lower (ring sizes
// up to 16384 slots, buffers of a few KiB); these only keep arithmetic and loops finite.
const (
	nmMaxSlots   = 1 << 16
	nmMinBufSize = 64
	nmMaxBufSize = 1 << 16 // slot.len is 16 bits: a larger buffer could never be filled
	nmMaxRings   = 1024
)

// nmRing is one mapped netmap_ring. Its constant fields are copied out and validated when
// it is created; head, cur and tail stay in shared memory and are accessed atomically,
// because the kernel reads head/cur and writes tail inside any netmap system call on the
// file, including a poll() run by the Go netpoller on another thread.
type nmRing struct {
	mem     []byte
	off     int    // offset of the ring header in mem
	n       uint32 // num_slots
	bufSize int    // nr_buf_size
	bufBase int    // offset of buffer index 0 in mem (may be negative: not every index is valid)
	nbufs   uint32 // indices [0, nbufs) lie inside mem

	head, cur, tail *uint32
}

// mapRings locates the rings of a netmap_if at nifOff: TX rings txFirst..txFirst+txN-1
// and RX rings rxFirst..rxFirst+rxN-1, numbered as netmap numbers them (NIC rings, then
// host rings). Every offset and size is checked against the region.
func mapRings(mem []byte, nifOff uint64, txFirst, txN, rxFirst, rxN int) (tx, rx []*nmRing, err error) {
	if nifOff > uint64(len(mem)) || uint64(len(mem))-nifOff < nmIfHdrSize {
		return nil, nil, fmt.Errorf("netmap: netmap_if at offset %d does not fit the %d-byte region", nifOff, len(mem))
	}
	nif := int(nifOff)
	u32 := func(o int) uint32 { return binary.NativeEndian.Uint32(mem[nif+o:]) }
	nicTx, nicRx := u32(nifTxRings), u32(nifRxRings)
	hostTx, hostRx := u32(nifHostTxRings), u32(nifHostRxRings)
	if nicTx > nmMaxRings || nicRx > nmMaxRings || hostTx > nmMaxRings || hostRx > nmMaxRings {
		return nil, nil, fmt.Errorf("netmap: netmap_if claims %d+%d TX and %d+%d RX rings, more than %d", nicTx, hostTx, nicRx, hostRx, nmMaxRings)
	}
	allTx := int(nicTx + hostTx)
	total := allTx + int(nicRx+hostRx)
	if uint64(len(mem))-nifOff-nifRingOfs < uint64(total)*8 {
		return nil, nil, fmt.Errorf("netmap: ring_ofs[%d] at offset %d runs past the %d-byte region", total, nifOff+nifRingOfs, len(mem))
	}
	if txFirst < 0 || txN < 0 || txFirst+txN > allTx || rxFirst < 0 || rxN < 0 || rxFirst+rxN > int(nicRx+hostRx) {
		return nil, nil, fmt.Errorf("netmap: rings TX %d+%d / RX %d+%d requested, the port has %d TX and %d RX", txFirst, txN, rxFirst, rxN, allTx, nicRx+hostRx)
	}
	ring := func(i int, dir uint16) (*nmRing, error) {
		rel := int64(binary.NativeEndian.Uint64(mem[nif+nifRingOfs+8*i:]))
		return newRing(mem, int64(nif)+rel, dir)
	}
	for i := txFirst; i < txFirst+txN; i++ {
		r, err := ring(i, 0)
		if err != nil {
			return nil, nil, fmt.Errorf("TX ring %d: %w", i, err)
		}
		tx = append(tx, r)
	}
	for i := rxFirst; i < rxFirst+rxN; i++ {
		r, err := ring(allTx+i, 1)
		if err != nil {
			return nil, nil, fmt.Errorf("RX ring %d: %w", i, err)
		}
		rx = append(rx, r)
	}
	return tx, rx, nil
}

// newRing validates the ring header at off and returns its accessor.
func newRing(mem []byte, off int64, dir uint16) (*nmRing, error) {
	if off < 0 || off%8 != 0 || off > int64(len(mem))-nmRingHdrSize {
		return nil, fmt.Errorf("netmap: ring header at offset %d is outside the %d-byte region or misaligned", off, len(mem))
	}
	o := int(off)
	h := mem[o : o+nmRingHdrSize]
	n := binary.NativeEndian.Uint32(h[ringNumSlots:])
	bs := binary.NativeEndian.Uint32(h[ringBufSize:])
	bofs := int64(binary.NativeEndian.Uint64(h[ringBufOfs:]))
	if d := binary.NativeEndian.Uint16(h[ringDir:]); d != dir {
		return nil, fmt.Errorf("netmap: ring at offset %d has dir %d, want %d", off, d, dir)
	}
	if n < 2 || n > nmMaxSlots {
		return nil, fmt.Errorf("netmap: ring at offset %d has %d slots, want 2..%d", off, n, nmMaxSlots)
	}
	if int64(len(mem))-off-nmRingHdrSize < int64(n)*nmSlotSize {
		return nil, fmt.Errorf("netmap: %d slots of the ring at offset %d run past the %d-byte region", n, off, len(mem))
	}
	if bs < nmMinBufSize || bs > nmMaxBufSize {
		return nil, fmt.Errorf("netmap: ring at offset %d has %d-byte buffers, want %d..%d", off, bs, nmMinBufSize, nmMaxBufSize)
	}
	// buf_ofs may point anywhere (even before the ring: only the indices actually used
	// must land inside the region), but the arithmetic must not overflow.
	if bofs < -int64(len(mem)) || bofs > int64(len(mem)) {
		return nil, fmt.Errorf("netmap: ring at offset %d has buf_ofs %d, outside the %d-byte region", off, bofs, len(mem))
	}
	base := off + bofs
	r := &nmRing{mem: mem, off: o, n: n, bufSize: int(bs), bufBase: int(base)}
	if base < int64(len(mem)) {
		first := int64(0)
		if base < 0 { // indices below -base/bs start before the region
			first = (-base + int64(bs) - 1) / int64(bs)
		}
		if last := (int64(len(mem)) - base) / int64(bs); last > first {
			r.nbufs = uint32(min(last, int64(^uint32(0))))
		}
	}
	if r.nbufs == 0 {
		return nil, fmt.Errorf("netmap: ring at offset %d: no %d-byte buffer at buf_ofs %d fits the %d-byte region", off, bs, bofs, len(mem))
	}
	for _, f := range []int{ringHead, ringCur, ringTail} {
		if uintptr(unsafe.Pointer(&mem[o+f]))%4 != 0 {
			return nil, fmt.Errorf("netmap: ring at offset %d: head/cur/tail are not 4-byte aligned", off)
		}
	}
	r.head = (*uint32)(unsafe.Pointer(&mem[o+ringHead]))
	r.cur = (*uint32)(unsafe.Pointer(&mem[o+ringCur]))
	r.tail = (*uint32)(unsafe.Pointer(&mem[o+ringTail]))
	return r, nil
}

func (r *nmRing) loadHead() uint32 { return atomic.LoadUint32(r.head) }
func (r *nmRing) loadCur() uint32  { return atomic.LoadUint32(r.cur) }
func (r *nmRing) loadTail() uint32 { return atomic.LoadUint32(r.tail) }

// storeTail is the kernel's move; only the model in the tests makes it.
func (r *nmRing) storeTail(v uint32) { atomic.StoreUint32(r.tail, v) }

// publish hands slots back to the kernel. cur is stored first: the kernel checks
// head <= cur <= tail and reads head before cur, and since both only move forward, every
// pair it can observe in between is valid, so it never resets the ring under us.
func (r *nmRing) publish(head, cur uint32) {
	atomic.StoreUint32(r.cur, cur)
	atomic.StoreUint32(r.head, head)
}

// slot reads slot i; i < r.n is the caller's invariant (our own index, never the peer's).
func (r *nmRing) slot(i uint32) (idx uint32, l, flags uint16) {
	s := r.mem[r.off+nmRingHdrSize+int(i)*nmSlotSize:][:nmSlotSize]
	return binary.NativeEndian.Uint32(s[slotBufIdx:]), binary.NativeEndian.Uint16(s[slotLen:]), binary.NativeEndian.Uint16(s[slotFlags:])
}

// setSlot writes len and flags of slot i (i < r.n); buf_idx is left as the kernel put it.
func (r *nmRing) setSlot(i uint32, l, flags uint16) {
	s := r.mem[r.off+nmRingHdrSize+int(i)*nmSlotSize:][:nmSlotSize]
	binary.NativeEndian.PutUint16(s[slotLen:], l)
	binary.NativeEndian.PutUint16(s[slotFlags:], flags)
}

// setSlotBuf writes all of slot i; only the model (the kernel's part) assigns buffers.
func (r *nmRing) setSlotBuf(i, idx uint32, l, flags uint16) {
	s := r.mem[r.off+nmRingHdrSize+int(i)*nmSlotSize:][:nmSlotSize]
	binary.NativeEndian.PutUint32(s[slotBufIdx:], idx)
	binary.NativeEndian.PutUint16(s[slotLen:], l)
	binary.NativeEndian.PutUint16(s[slotFlags:], flags)
}

// buf returns buffer idx, or nil when idx (read from shared memory) points outside the
// region.
func (r *nmRing) buf(idx uint32) []byte {
	if idx >= r.nbufs {
		return nil
	}
	o := r.bufBase + int(idx)*r.bufSize
	if o < 0 || o > len(r.mem)-r.bufSize {
		return nil
	}
	return r.mem[o : o+r.bufSize : o+r.bufSize]
}
