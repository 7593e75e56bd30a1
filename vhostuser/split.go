//go:build linux

package vhostuser

import (
	"encoding/binary"
	"math"

	"tapgro/vhostuser/vuproto"
)

// Split-ring layout (virtio spec "Split Virtqueues"; linux include/uapi/linux/virtio_ring.h).
const (
	descSize = 16

	descFNext     = 1 // VRING_DESC_F_NEXT
	descFWrite    = 2 // VRING_DESC_F_WRITE: device-writable
	descFIndirect = 4 // VRING_DESC_F_INDIRECT

	availFNoInterrupt = 1 // VRING_AVAIL_F_NO_INTERRUPT
	usedFNoNotify     = 1 // VRING_USED_F_NO_NOTIFY
)

// splitRing is the split layout (virtio spec 1.x §2.7): a descriptor table, the
// driver's avail ring {flags, idx, ring[num], used_event} and the device's used ring
// {flags, idx, ring[num] of {id, len}, avail_event}. The device's position is
// last_avail_idx; what it writes is the used ring alone, so that is what areaLog marks.
type splitRing struct {
	lg       *areaLog // the Vring's
	writable bool     // the device writes this ring's chains (Config.Writable)

	mem                  *guestMem
	addr                 vuproto.VringAddr
	num                  uint32
	eventIdx, indirectOK bool
	hdrLen               int

	desc, avail, used     []byte
	mask                  uint16
	usedEventOff, availEv int

	lastAvail  uint16 // next avail index to consume
	availCache uint16 // avail->idx last read
	usedIdx    uint16 // next used index to write (shadow)
	pubIdx     uint16 // used->idx as last published
	base       uint16 // used->idx at the start
	usedFlags  uint16

	signalledAt    uint16 // pubIdx at the last call decision
	signalledValid bool
	waitAt         uint16 // the avail->idx armKicks asked a kick beyond
}

var _ layout = (*splitRing)(nil)

func (s *splitRing) start(mem *guestMem, addr vuproto.VringAddr, num uint32, f feats, base uint16) bool {
	s.mem, s.addr, s.num = mem, addr, num
	s.setFeats(f)
	s.lastAvail, s.availCache, s.usedIdx, s.pubIdx, s.base = base, base, base, base, base
	s.usedFlags = 0
	s.signalledValid = false // the first call after a (re)start is unconditional
	return s.translate()
}

func (s *splitRing) setFeats(f feats) {
	s.eventIdx, s.indirectOK, s.hdrLen = f.eventIdx, f.indirect, f.hdrLen
}

func (s *splitRing) remap(mem *guestMem) bool {
	s.mem = mem
	return s.translate()
}

// translate maps desc/avail/used for their full sizes, event words included
// (DPDK translate_ring_addresses checks full sizes; libvhost-user map_ring does not).
func (s *splitRing) translate() bool {
	s.unmap()
	n := uint64(s.num)
	if n == 0 || s.mem == nil {
		return false
	}
	d := s.mem.qva(s.addr.Desc, descSize*n)
	a := s.mem.qva(s.addr.Avail, 6+2*n)
	u := s.mem.qva(s.addr.Used, 6+8*n)
	// Alignment: desc 16 and used 4 are the spec's; avail is only 2-aligned in the
	// spec, but its {flags, idx} word is read with one 32-bit atomic, so require 4.
	if d == nil || a == nil || u == nil || !aligned(d, 16) || !aligned(a, 4) || !aligned(u, 4) {
		return false
	}
	s.desc, s.avail, s.used = d, a, u
	s.mask = uint16(s.num - 1)
	s.usedEventOff = 4 + 2*int(s.num) // avail->used_event (vring_used_event)
	s.availEv = 4 + 8*int(s.num)      // used->avail_event (vring_avail_event)
	return true
}

func (s *splitRing) unmap()           { s.desc, s.avail, s.used = nil, nil, nil }
func (s *splitRing) mapped() bool     { return s.used != nil }
func (s *splitRing) position() uint16 { return s.lastAvail }
func (s *splitRing) published() bool  { return s.pubIdx != s.base }

// availIdx is avail->idx: one 32-bit seq-cst load of {flags, idx} (idx is the high half
// on LE), whose acquire orders the ring-entry and descriptor reads after it (QEMU
// virtqueue_num_heads: read idx, smp_rmb, then the ring).
func (s *splitRing) availIdx() uint16 { return uint16(load32(s.avail, 0) >> 16) }

func (s *splitRing) pop(iov [][]byte, pieces *[]piece) (Chain, Reason) {
	if s.lastAvail == s.availCache {
		idx := s.availIdx()
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
		if uint16(idx-s.pubIdx) > uint16(s.num) || uint16(idx-s.lastAvail) > uint16(idx-s.pubIdx) {
			return Chain{}, RejectAvailJump
		}
		if idx == s.lastAvail {
			return Chain{}, popEmpty
		}
		s.availCache = idx
	}
	slot := int(s.lastAvail & s.mask)
	head := binary.LittleEndian.Uint16(s.avail[4+2*slot:])
	k, total, r := s.walk(head, iov, pieces)
	if r != popOK {
		return Chain{}, r
	}
	s.lastAvail++
	return Chain{Head: head, Len: total, Iov: iov[:k:k]}, popOK
}

// walk follows a chain from head. Every index is checked before use, every address is
// translated through the region table, and the number of descriptors is bounded, so a
// hostile table can make it fail but not loop or touch unmapped memory.
//
// With pieces (dirty log, receive rings) each descriptor's guest-physical range is
// appended, as read here once: what the device writes and what it marks are the same
// ranges, whatever the guest does to its table meanwhile.
//
// It returns the number of iov entries filled and the chain's length, or the Reason it
// failed.
func (s *splitRing) walk(head uint16, iov [][]byte, pieces *[]piece) (int, int, Reason) {
	num := s.num
	if uint32(head) >= num {
		return 0, 0, RejectHeadRange
	}
	tbl := s.desc
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
			if !s.indirectOK || indirect || count != 0 || flags&descFNext != 0 ||
				ln == 0 || ln%descSize != 0 || ln/descSize > num {
				return 0, 0, RejectIndirect
			}
			if addr+uint64(ln) < addr {
				return 0, 0, RejectLenOverflow
			}
			t := s.mem.gpa(addr, uint64(ln))
			if t == nil {
				return 0, 0, RejectAddress
			}
			tbl, tblN, i, indirect = t, ln/descSize, 0, true
			continue
		}
		count++
		if count > tblN {
			return 0, 0, RejectLoop
		}
		if ln == 0 {
			return 0, 0, RejectZeroLen
		}
		if (flags&descFWrite != 0) != s.writable {
			return 0, 0, RejectDirection
		}
		if addr+uint64(ln) < addr {
			return 0, 0, RejectLenOverflow
		}
		total += uint64(ln)
		if total > math.MaxUint32 {
			return 0, 0, RejectLenOverflow
		}
		var r Reason
		var ok bool
		if k, r, ok = s.mem.gpaIov(addr, uint64(ln), iov, k); !ok {
			return 0, 0, r
		}
		if pieces != nil {
			*pieces = append(*pieces, piece{addr, uint64(ln)})
		}
		if flags&descFNext == 0 {
			break
		}
		if uint32(next) >= tblN {
			return 0, 0, RejectNextRange
		}
		i = uint32(next)
	}
	if total < uint64(s.hdrLen) {
		return 0, 0, RejectShortChain
	}
	return k, int(total), popOK
}

// push writes the used entry {head, n} in the slot after the last published one.
func (s *splitRing) push(head uint16, n uint32) {
	off := 4 + 8*int(s.usedIdx&s.mask)
	e := s.used[off:]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], n)
	s.lg.mark(off, 8)
	s.usedIdx++
}

func (s *splitRing) rewind(n int) { s.lastAvail -= uint16(n) }

// publish stores used->idx once for everything pushed since the last publish. The used
// entries (plain stores) precede this seq-cst store, which is the write barrier before
// used->idx (QEMU virtqueue_split_flush: smp_wmb, then idx).
func (s *splitRing) publish() bool {
	if s.usedIdx == s.pubIdx {
		return false
	}
	s.storeUsedWord(s.usedIdx)
	s.pubIdx = s.usedIdx
	return true
}

// storeUsedWord stores used->{flags, idx} with one seq-cst 32-bit store.
func (s *splitRing) storeUsedWord(idx uint16) {
	store32(s.used, 0, uint32(idx)<<16|uint32(s.usedFlags))
	s.lg.mark(0, 4)
}

func (s *splitRing) needCall() bool {
	// This seq-cst load after the used->idx store is the full barrier before reading
	// the driver's suppression hints (QEMU virtio_split_should_notify: smp_mb).
	aw := load32(s.avail, 0)
	if !s.eventIdx {
		return uint16(aw)&availFNoInterrupt == 0
	}
	// QEMU virtio_split_should_notify / DPDK vhost_vring_call_split: the first call
	// after a start is unconditional, then vring_need_event decides from the used idx
	// at the previous decision (QEMU's signalled_used). A deferred call keeps that
	// index, so the question covers every entry published since.
	return !s.signalledValid || vringNeedEvent(load16(s.avail, s.usedEventOff), s.pubIdx, s.signalledAt)
}

func (s *splitRing) signalled() { s.signalledAt, s.signalledValid = s.pubIdx, true }

func (s *splitRing) backlogged() bool {
	return s.signalledValid && s.pubIdx-s.signalledAt >= uint16(s.num/2)
}

// armKicks: with EVENT_IDX, avail_event = the index to be kicked past; without it,
// NO_NOTIFY cleared. The seq-cst store of used's {flags, idx} word then the seq-cst load
// of avail->idx are the full barrier between enabling kicks and the final check (QEMU
// virtio_queue_split_set_notification: smp_mb after enabling).
func (s *splitRing) armKicks(more bool) bool {
	at := s.lastAvail
	if more {
		// After a reservation that ran out, every chain up to the avail->idx the
		// last pop saw was looked at; chains the driver added since count as more.
		at = s.availCache
	}
	s.waitAt = at
	if s.eventIdx {
		store16(s.used, s.availEv, at)
		s.lg.mark(s.availEv, 2)
	} else {
		s.usedFlags = 0
	}
	s.storeUsedWord(s.pubIdx)
	if s.availIdx() == at {
		return false
	}
	if !more && !s.eventIdx {
		// Kicks are not needed while the worker takes what is there (virtio spec
		// "Used Buffer Notification Suppression", VIRTQ_USED_F_NO_NOTIFY).
		s.usedFlags = usedFNoNotify
		store32(s.used, 0, uint32(s.pubIdx)<<16|uint32(s.usedFlags)) // marked above: same word
	}
	return true
}

func (s *splitRing) armed() bool     { return s.availIdx() != s.waitAt }
func (s *splitRing) available() bool { return s.availIdx() != s.lastAvail }

// kicksOff: with EVENT_IDX, avail_event = last_avail_idx-1 is behind every index the
// driver can move from, so vring_need_event is false for all of them; otherwise
// NO_NOTIFY.
func (s *splitRing) kicksOff() {
	if s.eventIdx {
		store16(s.used, s.availEv, s.lastAvail-1)
		s.lg.mark(s.availEv, 2)
		return
	}
	if s.usedFlags != usedFNoNotify {
		s.usedFlags = usedFNoNotify
		s.storeUsedWord(s.pubIdx)
	}
}

// vringNeedEvent is vring_need_event from linux include/uapi/linux/virtio_ring.h: should
// moving the index from old to newIdx notify a peer waiting for event_idx?
func vringNeedEvent(eventIdx, newIdx, old uint16) bool {
	return newIdx-eventIdx-1 < newIdx-old
}
