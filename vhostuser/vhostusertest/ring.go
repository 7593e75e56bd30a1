//go:build linux

package vhostusertest

import (
	"encoding/binary"
	"time"

	"golang.org/x/sys/unix"
)

// The guest driver's side of a split ring: descriptors, avail and used, kicks and calls,
// and the frames it sends and receives.

// Seg is one descriptor: a guest-physical buffer, device-writable or not.
type Seg struct {
	GPA   uint64
	Len   int
	Write bool
}

// Used is one used-ring entry.
type Used struct {
	ID  uint16
	Len uint32
}

// Ring is a split ring as the guest driver keeps it.
type Ring struct {
	G                    *Guest
	Idx, Num             int
	DescA, AvailA, UsedA uint64
	Desc, Avail, Used    []byte
	Kick, Call, Err      int // eventfds
	SlotSize             int
	slots, indBase       uint64
	availIdx, usedSeen   uint16
	free                 []uint16
	chains               [][]uint16 // by head: the chain's descriptors; nil when not outstanding
	segScratch           []Seg
	ev                   [8]byte
	pfd                  [1]unix.PollFd
}

// NewRing lays out ring idx of num entries and, if slotSize > 0, num buffer slots of
// slotSize bytes, one per possible head.
func NewRing(g *Guest, idx, num, slotSize int) *Ring {
	r := &Ring{G: g, Idx: idx, Num: num, SlotSize: slotSize, chains: make([][]uint16, num)}
	r.DescA = g.Alloc(16*num, 4096)
	r.AvailA = g.Alloc(6+2*num, 4)
	r.UsedA = g.Alloc(6+8*num, 4096)
	r.Desc, r.Avail, r.Used = g.At(r.DescA, 16*num), g.At(r.AvailA, 6+2*num), g.At(r.UsedA, 6+8*num)
	if slotSize > 0 {
		r.slots = g.Alloc(num*slotSize, 4096)
	}
	for i := num - 1; i >= 0; i-- {
		r.free = append(r.free, uint16(i))
	}
	var err error
	// QEMU event_notifier_init(…, 1): the kick starts signalled, EFD_NONBLOCK.
	if r.Kick, err = unix.Eventfd(1, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		g.tb.Fatal(err)
	}
	if r.Call, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		g.tb.Fatal(err)
	}
	if r.Err, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		g.tb.Fatal(err)
	}
	g.tb.Cleanup(func() { unix.Close(r.Kick); unix.Close(r.Call); unix.Close(r.Err) })
	return r
}

// Slot is the guest-physical address of head's buffer slot.
func (r *Ring) Slot(head uint16) uint64 { return r.slots + uint64(head)*uint64(r.SlotSize) }

// Free is the number of free descriptors.
func (r *Ring) Free() int { return len(r.free) }

// Outstanding is the number of chains made available and not yet reaped.
func (r *Ring) Outstanding() int { return int(r.availIdx - r.usedSeen) }

// PutDesc writes one descriptor.
func PutDesc(d []byte, addr uint64, n uint32, flags, next uint16) {
	binary.LittleEndian.PutUint64(d, addr)
	binary.LittleEndian.PutUint32(d[8:], n)
	binary.LittleEndian.PutUint16(d[12:], flags)
	binary.LittleEndian.PutUint16(d[14:], next)
}

// nextHead is the descriptor AddChain/AddIndirect will use as the head.
func (r *Ring) nextHead() uint16 {
	if len(r.free) == 0 {
		r.G.tb.Fatalf("ring %d: no free descriptor", r.Idx)
	}
	return r.free[len(r.free)-1]
}

// AddChain writes segs as a chain of direct descriptors and returns its head (not yet
// available: Publish it).
func (r *Ring) AddChain(segs []Seg) uint16 {
	if len(segs) > len(r.free) {
		r.G.tb.Fatalf("ring %d: %d free descriptors, need %d", r.Idx, len(r.free), len(segs))
	}
	ids := make([]uint16, len(segs))
	for i := range segs {
		ids[i] = r.free[len(r.free)-1]
		r.free = r.free[:len(r.free)-1]
	}
	for i, s := range segs {
		var fl, next uint16
		if s.Write {
			fl |= DescFWrite
		}
		if i+1 < len(segs) {
			fl |= DescFNext
			next = ids[i+1]
		}
		PutDesc(r.Desc[16*int(ids[i]):], s.GPA, uint32(s.Len), fl, next)
	}
	r.chains[ids[0]] = ids
	return ids[0]
}

// MaxIndirect is the most entries AddIndirect puts in one table.
const MaxIndirect = 64

// AddIndirect writes segs into an indirect table (one per head, so tables recycle with
// their chains) referenced by one head descriptor.
func (r *Ring) AddIndirect(segs []Seg) uint16 {
	if len(segs) > MaxIndirect {
		r.G.tb.Fatalf("ring %d: %d indirect entries, at most %d", r.Idx, len(segs), MaxIndirect)
	}
	if r.indBase == 0 {
		r.indBase = r.G.Alloc(r.Num*16*MaxIndirect, 16)
	}
	ta := r.indBase + uint64(r.nextHead())*16*MaxIndirect
	t := r.G.At(ta, 16*len(segs))
	for i, s := range segs {
		var fl uint16
		if s.Write {
			fl |= DescFWrite
		}
		next := uint16(0)
		if i+1 < len(segs) {
			fl |= DescFNext
			next = uint16(i + 1)
		}
		PutDesc(t[16*i:], s.GPA, uint32(s.Len), fl, next)
	}
	id := r.nextHead()
	r.free = r.free[:len(r.free)-1]
	PutDesc(r.Desc[16*int(id):], ta, uint32(16*len(segs)), DescFIndirect, 0)
	r.chains[id] = []uint16{id}
	return id
}

// Publish makes heads available: ring entries first, then avail->idx (virtio spec
// "Updating idx").
func (r *Ring) Publish(heads ...uint16) { r.Republish(heads) }

// Republish is Publish without the variadic slice: it allocates nothing, so a benchmark
// can put the same chains back again and again.
func (r *Ring) Republish(heads []uint16) {
	for _, h := range heads {
		binary.LittleEndian.PutUint16(r.Avail[4+2*(int(r.availIdx)%r.Num):], h)
		r.availIdx++
	}
	w := load32(r.Avail, 0)
	store32(r.Avail, 0, uint32(r.availIdx)<<16|w&0xffff)
}

// SetAvailFlags sets avail->flags (VRING_AVAIL_F_NO_INTERRUPT = 1).
func (r *Ring) SetAvailFlags(f uint16) {
	w := load32(r.Avail, 0)
	store32(r.Avail, 0, w&0xffff0000|uint32(f))
}

// SetUsedEvent writes avail->used_event (EVENT_IDX).
func (r *Ring) SetUsedEvent(v uint16) {
	binary.LittleEndian.PutUint16(r.Avail[4+2*r.Num:], v)
}

// AvailEvent reads used->avail_event (EVENT_IDX).
func (r *Ring) AvailEvent() uint16 { return load16(r.Used, 4+8*r.Num) }

// UsedIdx is used->idx as published by the device.
func (r *Ring) UsedIdx() uint16 { return uint16(load32(r.Used, 0) >> 16) }

// AvailIdx is avail->idx as the driver last published it.
func (r *Ring) AvailIdx() uint16 { return r.availIdx }

// UsedAt is the used-ring entry at index i (taken mod Num), read without reaping: for a
// driver that keeps its own used position and republishes the same heads (a benchmark
// front-end), where ReapFunc's per-chain bookkeeping is in the way. It allocates nothing.
func (r *Ring) UsedAt(i uint16) Used {
	e := r.Used[4+8*(int(i)%r.Num):]
	return Used{uint16(binary.LittleEndian.Uint32(e)), binary.LittleEndian.Uint32(e[4:])}
}

// NeedEvent is vring_need_event (linux include/uapi/linux/virtio_ring.h; virtio spec
// "Driver Requirements: Virtqueue Notification Suppression"): with EVENT_IDX, whether
// moving an index from old to new crosses event, i.e. whether the other side asked to be
// notified.
func NeedEvent(event, new, old uint16) bool { return new-event-1 < new-old }

// ReapFunc calls fn for each used entry published since the last reap (fn may be nil)
// and frees its descriptors; it returns how many there were. It allocates nothing.
func (r *Ring) ReapFunc(fn func(Used)) int {
	idx := r.UsedIdx()
	n := 0
	for ; r.usedSeen != idx; r.usedSeen++ {
		e := r.Used[4+8*(int(r.usedSeen)%r.Num):]
		u := Used{uint16(binary.LittleEndian.Uint32(e)), binary.LittleEndian.Uint32(e[4:])}
		if int(u.ID) >= r.Num || r.chains[u.ID] == nil {
			r.G.tb.Fatalf("ring %d: used id %d is not an outstanding head", r.Idx, u.ID)
		}
		if fn != nil {
			fn(u)
		}
		r.free = append(r.free, r.chains[u.ID]...)
		r.chains[u.ID] = nil
		n++
	}
	return n
}

// Reap returns the used entries published since the last reap and frees their chains.
func (r *Ring) Reap() []Used {
	var out []Used
	r.ReapFunc(func(u Used) { out = append(out, u) })
	return out
}

// Reaped is the used index up to which the driver has consumed entries (Reap, ReapFunc,
// DrainUsed): what a driver that re-enables calls after processing writes to used_event.
func (r *Ring) Reaped() uint16 { return r.usedSeen }

// DrainUsed advances past the published used entries without freeing their chains, so
// their heads can be republished as they are (benchmarks). It allocates nothing.
func (r *Ring) DrainUsed() int {
	idx := r.UsedIdx()
	n := int(idx - r.usedSeen)
	r.usedSeen = idx
	return n
}

// KickNow signals the kick eventfd. It allocates nothing.
func (r *Ring) KickNow() {
	binary.LittleEndian.PutUint64(r.ev[:], 1)
	unix.Write(r.Kick, r.ev[:])
}

// Called reads and clears the call eventfd; it reports whether it was signalled.
func (r *Ring) Called() bool {
	n, err := unix.Read(r.Call, r.ev[:])
	return err == nil && n == 8
}

// Errored reads and clears the err eventfd; it reports whether the device signalled an
// error on the ring (a broken ring writes it).
func (r *Ring) Errored() bool {
	n, err := unix.Read(r.Err, r.ev[:])
	return err == nil && n == 8
}

// WaitCall waits up to d for the call eventfd and clears it. It allocates nothing.
func (r *Ring) WaitCall(d time.Duration) bool {
	r.pfd[0] = unix.PollFd{Fd: int32(r.Call), Events: unix.POLLIN}
	n, err := unix.Poll(r.pfd[:], int(d/time.Millisecond))
	if err == unix.EINTR {
		n, err = unix.Poll(r.pfd[:], 0)
	}
	if err != nil || n == 0 {
		return false
	}
	return r.Called()
}

// WaitUsed waits up to d until used->idx reaches idx, asking for a call at it
// (used_event, EVENT_IDX) and sleeping on the call eventfd. It allocates nothing.
func (r *Ring) WaitUsed(idx uint16, d time.Duration) bool {
	deadline := time.Now().Add(d)
	r.SetUsedEvent(idx - 1)
	for r.UsedIdx() != idx {
		if time.Now().After(deadline) {
			return false
		}
		r.WaitCall(time.Millisecond)
	}
	return true
}

// gap separates the pieces of a chain in its slot, so that nothing can pass for
// contiguous what the descriptors do not make contiguous.
const gap = 64

// SendFrame writes data (virtio-net header + Ethernet frame) into the slot of a new TX
// chain, cut into descriptors of the lengths in split (the remainder, if any, is one
// more descriptor), and makes the chain available. A split may cut the header, and a
// descriptor may hold the end of the header and the start of the frame. With indirect
// the chain is one INDIRECT descriptor. It returns the head.
func (r *Ring) SendFrame(data []byte, split []int, indirect bool) uint16 {
	head := r.PrepareFrame(data, split, indirect)
	r.Publish(head)
	return head
}

// PrepareFrame is SendFrame without publishing.
func (r *Ring) PrepareFrame(data []byte, split []int, indirect bool) uint16 {
	if r.SlotSize == 0 {
		r.G.tb.Fatalf("ring %d has no buffer slots", r.Idx)
	}
	head := r.nextHead()
	segs := r.segScratch[:0]
	a := r.Slot(head)
	end := a + uint64(r.SlotSize)
	rest := data
	for i := 0; len(rest) > 0; i++ {
		n := len(rest)
		if i < len(split) && split[i] > 0 && split[i] < n {
			n = split[i]
		}
		if a+uint64(n) > end {
			r.G.tb.Fatalf("ring %d: %d bytes in %d pieces do not fit a %d-byte slot", r.Idx, len(data), len(split)+1, r.SlotSize)
		}
		copy(r.G.At(a, n), rest[:n])
		segs = append(segs, Seg{GPA: a, Len: n})
		rest = rest[n:]
		a += uint64(n) + gap
	}
	r.segScratch = segs
	if indirect {
		return r.AddIndirect(segs)
	}
	return r.AddChain(segs)
}

// PostRX makes count receive chains available, each bufLen bytes in its head's slot, cut
// into pieces descriptors of equal size (the last takes the rest). It returns the heads.
func (r *Ring) PostRX(count, bufLen, pieces int) []uint16 {
	if bufLen > r.SlotSize || pieces < 1 {
		r.G.tb.Fatalf("ring %d: %d-byte buffers in %d pieces, slots of %d", r.Idx, bufLen, pieces, r.SlotSize)
	}
	heads := make([]uint16, 0, count)
	for range count {
		head := r.nextHead()
		segs := make([]Seg, 0, pieces)
		a := r.Slot(head)
		per := bufLen / pieces
		for p := 0; p < pieces; p++ {
			n := per
			if p == pieces-1 {
				n = bufLen - per*(pieces-1)
			}
			segs = append(segs, Seg{GPA: a, Len: n, Write: true})
			a += uint64(n) // contiguous: the device may not assume it anyway
		}
		heads = append(heads, r.AddChain(segs))
	}
	r.Publish(heads...)
	return heads
}

// chainBytes appends the first n bytes written into the chain at head.
func (r *Ring) chainBytes(dst []byte, head uint16, n int) []byte {
	for _, id := range r.chains[head] {
		d := r.Desc[16*int(id):]
		a, l := binary.LittleEndian.Uint64(d), int(binary.LittleEndian.Uint32(d[8:]))
		c := min(l, n)
		dst = append(dst, r.G.At(a, c)...)
		n -= c
		if n == 0 {
			break
		}
	}
	return dst
}

// RXFrame is one received frame: the virtio-net header and the Ethernet frame.
type RXFrame struct {
	Hdr        []byte
	Frame      []byte
	NumBuffers int // chains it took (from num_buffers with a 12-byte header, else 1)
}

// ReapRX drains the RX used ring into frames, following num_buffers (mergeable
// buffers, virtio spec "Processing of Incoming Packets") when hdrLen is 12 and mrg.
func (r *Ring) ReapRX(hdrLen int, mrg bool) []RXFrame {
	var out []RXFrame
	var cur []byte
	left := 0
	nb := 0
	r.ReapFunc(func(u Used) {
		b := r.chainBytes(nil, u.ID, int(u.Len))
		if left == 0 {
			if len(b) < hdrLen {
				r.G.tb.Fatalf("ring %d: used len %d shorter than the header", r.Idx, u.Len)
			}
			nb = 1
			if hdrLen >= 12 {
				nb = int(binary.LittleEndian.Uint16(b[10:]))
			}
			if !mrg && nb != 1 {
				r.G.tb.Fatalf("ring %d: num_buffers %d without MRG_RXBUF", r.Idx, nb)
			}
			if nb < 1 {
				r.G.tb.Fatalf("ring %d: num_buffers 0", r.Idx)
			}
			left = nb
			cur = b
		} else {
			cur = append(cur, b...)
		}
		left--
		if left == 0 {
			out = append(out, RXFrame{Hdr: cur[:hdrLen:hdrLen], Frame: cur[hdrLen:], NumBuffers: nb})
		}
	})
	if left != 0 {
		r.G.tb.Fatalf("ring %d: frame with %d of %d buffers published", r.Idx, nb-left, nb)
	}
	return out
}
