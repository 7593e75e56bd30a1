//go:build linux

// Package vhostusertest is a vhost-user front-end double for tests: it plays QEMU 7.2's
// side of the socket (the message order of hw/virtio/vhost.c vhost_dev_init and
// vhost_dev_start, hw/net/vhost_net.c vhost_net_start) and the guest driver's side of
// the split rings (virtio spec "Split Virtqueues", driver side), in a memfd that stands
// for guest RAM, mapped as QEMU 7.2 maps a pc machine: two regions of one memfd, below
// and above the VGA hole.
//
// A test starts a Session against anything that serves a *net.UnixConn (a
// vhostuser.Backend's Serve), then fills TX chains (SendFrame, with arbitrary descriptor
// splits, optionally through an indirect table), posts RX buffers (PostRX, mergeable or
// not), kicks, and drains the used rings (Reap, ReapRX). Every buffer of a chain lives
// in the slot of its head descriptor, so chains recycle guest memory without an
// allocator and a benchmark can republish the same heads with no allocation.
//
// It takes a TB (testing.TB's reporting and cleanup) rather than a testing.TB, so that a
// benchmark program can drive it as a real front-end.
//
// The double imports vhostuser only for its exported constants and types; vhostuser's
// own (internal) tests keep their private copy, since importing this package from them
// would be an import cycle.
package vhostusertest

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser"
	"tapgro/virtio"
)

// TB is what the double needs from its caller: testing.TB's failure reporting and
// cleanup. *testing.T, *testing.B and testing.TB satisfy it; a program that is not a test
// (the benchmark front-end, integration/vhostrelay) supplies its own, so the double
// does not tie its users to package testing.
type TB interface {
	Helper()
	Error(args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Descriptor flags (linux include/uapi/linux/virtio_ring.h VRING_DESC_F_*).
const (
	DescFNext     = 1
	DescFWrite    = 2
	DescFIndirect = 4
)

// Message header flags (QEMU hw/virtio/vhost-user.c VHOST_USER_VERSION,
// VHOST_USER_REPLY_MASK, VHOST_USER_NEED_REPLY_MASK).
const (
	flagVersion   = 0x1
	flagNeedReply = 0x8
	replyFlags    = 0x5
	hdrSize       = 12
)

// Layout constants of the measured 256 MiB pc guest (QEMU 7.2 SET_MEM_TABLE): RAM below
// the VGA hole, then RAM again from 0xc0000, both from one memfd at their own offsets.
const (
	RegionAEnd  = 0xa0000
	RegionBBase = 0xc0000
)

func load32(b []byte, off int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[off : off+4][0])))
}

func store32(b []byte, off int, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[off : off+4][0])), v)
}

func load16(b []byte, off int) uint16 { return binary.LittleEndian.Uint16(b[off:]) }

// Guest is guest RAM as the front-end sees it: one memfd, mapped once, and a region table
// in which userspace_addr is the address of the front-end's own mapping.
type Guest struct {
	tb      TB
	FD      int
	Mem     []byte
	Regions []vhostuser.MemRegion
	size    uint64
	next    uint64 // bump allocator (GPA)
}

// MeasuredLayout is QEMU 7.2's two regions of one memfd of size bytes for a pc machine.
func MeasuredLayout(size uint64) []vhostuser.MemRegion {
	return []vhostuser.MemRegion{{GPA: 0, Size: RegionAEnd, MmapOffset: 0},
		{GPA: RegionBBase, Size: size - RegionBBase, MmapOffset: RegionBBase}}
}

// NewGuest creates size bytes of guest RAM (a sparse memfd) with layout (nil: the
// measured layout); MmapOffset says where each region starts in the memfd.
func NewGuest(tb TB, size uint64, layout []vhostuser.MemRegion) *Guest {
	tb.Helper()
	if layout == nil {
		layout = MeasuredLayout(size)
	}
	fd, err := unix.MemfdCreate("guest-ram", unix.MFD_CLOEXEC)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		tb.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		tb.Fatal(err)
	}
	g := &Guest{tb: tb, FD: fd, Mem: m, size: size, next: RegionBBase + 0x40000}
	base := uint64(uintptr(unsafe.Pointer(&m[0])))
	for _, r := range layout {
		r.UserAddr = base + r.MmapOffset
		g.Regions = append(g.Regions, r)
	}
	tb.Cleanup(func() { unix.Munmap(m); unix.Close(fd) })
	return g
}

// At is the front-end's view of guest-physical [a, a+n).
func (g *Guest) At(a uint64, n int) []byte {
	for _, r := range g.Regions {
		if a >= r.GPA && a+uint64(n) <= r.GPA+r.Size {
			o := r.MmapOffset + a - r.GPA
			return g.Mem[o : o+uint64(n)]
		}
	}
	g.tb.Fatalf("guest address %#x+%d unmapped", a, n)
	return nil
}

// QVA is the front-end virtual address of guest-physical a.
func (g *Guest) QVA(a uint64) uint64 {
	for _, r := range g.Regions {
		if a >= r.GPA && a < r.GPA+r.Size {
			return r.UserAddr + a - r.GPA
		}
	}
	g.tb.Fatalf("no qva for %#x", a)
	return 0
}

// Alloc takes n bytes of guest-physical memory aligned to align.
func (g *Guest) Alloc(n int, align uint64) uint64 {
	g.next = (g.next + align - 1) &^ (align - 1)
	a := g.next
	g.next += uint64(n)
	if g.next > g.size {
		g.tb.Fatalf("guest RAM exhausted (%d bytes)", g.size)
	}
	return a
}

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

// Frontend is QEMU's end of the socket.
type Frontend struct {
	tb TB
	FD int
}

// Send sends one message with fds.
func (f *Frontend) Send(req, flags uint32, payload []byte, fds ...int) {
	b := make([]byte, hdrSize+len(payload))
	binary.LittleEndian.PutUint32(b, req)
	binary.LittleEndian.PutUint32(b[4:], flags)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	copy(b[hdrSize:], payload)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	err := unix.Sendmsg(f.FD, b, oob, nil, 0)
	for err == unix.EINTR {
		err = unix.Sendmsg(f.FD, b, oob, nil, 0)
	}
	if err != nil {
		f.tb.Fatalf("sendmsg %d: %v", req, err)
	}
}

// Reply reads one reply and checks it the way QEMU 7.2 does (vhost_user_read_header:
// flags exactly 0x5; vhost_user_read: same request, exact size).
func (f *Frontend) Reply(req uint32, size int) []byte {
	var h [hdrSize]byte
	f.readFull(h[:])
	if r := binary.LittleEndian.Uint32(h[:]); r != req {
		f.tb.Fatalf("reply to %d has request %d", req, r)
	}
	if fl := binary.LittleEndian.Uint32(h[4:]); fl != replyFlags {
		f.tb.Fatalf("reply flags %#x instead of %#x", fl, replyFlags)
	}
	if n := int(binary.LittleEndian.Uint32(h[8:])); n != size {
		f.tb.Fatalf("reply to %d size %d, want %d", req, n, size)
	}
	p := make([]byte, size)
	f.readFull(p)
	return p
}

func (f *Frontend) readFull(b []byte) {
	for got := 0; got < len(b); {
		n, err := unix.Read(f.FD, b[got:])
		if err == unix.EINTR {
			continue // Go's signals (preemption, the race detector's) interrupt it
		}
		if err != nil || n == 0 {
			f.tb.Fatalf("read reply: n=%d err=%v", n, err)
		}
		got += n
	}
}

// U64 encodes a u64 payload.
func U64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// State encodes a vhost_vring_state payload.
func State(i, n uint32) []byte {
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, i), n)
}

// Get sends a request whose reply is a u64.
func (f *Frontend) Get(req uint32) uint64 {
	f.Send(req, flagVersion, nil)
	return binary.LittleEndian.Uint64(f.Reply(req, 8))
}

// Ack sends with NEED_REPLY and returns the REPLY_ACK value.
func (f *Frontend) Ack(req uint32, payload []byte, fds ...int) uint64 {
	f.Send(req, flagVersion|flagNeedReply, payload, fds...)
	return binary.LittleEndian.Uint64(f.Reply(req, 8))
}

// MemTablePayload encodes SET_MEM_TABLE.
func MemTablePayload(regs []vhostuser.MemRegion) []byte {
	p := binary.LittleEndian.AppendUint32(nil, uint32(len(regs)))
	p = binary.LittleEndian.AppendUint32(p, 0)
	for _, r := range regs {
		for _, v := range []uint64{r.GPA, r.Size, r.UserAddr, r.MmapOffset} {
			p = binary.LittleEndian.AppendUint64(p, v)
		}
	}
	return p
}

// AddrPayload encodes SET_VRING_ADDR for r (QEMU VAs; log address = GPA of used).
func AddrPayload(r *Ring) []byte {
	p := binary.LittleEndian.AppendUint32(nil, uint32(r.Idx))
	p = binary.LittleEndian.AppendUint32(p, 0)
	for _, v := range []uint64{r.G.QVA(r.DescA), r.G.QVA(r.UsedA), r.G.QVA(r.AvailA), r.UsedA} {
		p = binary.LittleEndian.AppendUint64(p, v)
	}
	return p
}

// Options shape a Session. Zero values are QEMU 7.2's defaults.
type Options struct {
	Ack      uint64 // guest-acked virtio bits; 0 = everything offered (minus bit 30)
	AckMask  uint64 // bits removed from Ack (applied after the default)
	Pairs    int    // queue pairs, 1
	Num      int    // ring size, 256
	MemSize  uint64 // guest RAM, 64 MiB
	Layout   []vhostuser.MemRegion
	Guest    *Guest // reuse guest RAM (a reconnect)
	TXSlot   int    // bytes per TX chain slot, 64 KiB + 4 KiB
	RXSlot   int    // bytes per RX chain slot, 64 KiB + 4 KiB
	MTU      uint64 // NET_SET_MTU if the backend offers it and F_MTU is acked; 1500
	NoEnable bool   // no SET_VRING_ENABLE
	SkipKick bool   // stop before SET_VRING_KICK
	// ConnectWait is how long Dial retries a socket that is not listening yet: a
	// back-end's socket file exists from bind(2) on, and a connect before its listen(2)
	// is refused. 0: one attempt.
	ConnectWait time.Duration
}

// Session is one connection from the front-end double.
type Session struct {
	tb      TB
	FE      *Frontend
	G       *Guest
	Rings   []*Ring
	Offered uint64 // GET_FEATURES
	Acked   uint64 // SET_FEATURES, bit 30 included
	done    chan error
	closed  bool
}

// Start connects a socketpair to serve (run in its own goroutine, typically a
// vhostuser.Backend's Serve) and runs QEMU 7.2's sequence up to running rings: connect,
// device reset, DRIVER_OK. It ends with a GET_FEATURES round trip (QEMU's own sync), so
// once it returns every Handler.RingStarted has returned.
func Start(tb TB, serve func(*net.UnixConn) error, o Options) *Session {
	tb.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	file := os.NewFile(uintptr(sp[1]), "backend")
	c, err := net.FileConn(file)
	file.Close()
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve(c.(*net.UnixConn)) }()
	return run(tb, sp[0], done, o)
}

// Dial connects to a back-end listening on the UNIX socket path (QEMU as the client,
// -chardev socket,path=…) and runs Start's sequence. Close then reports nil.
func Dial(tb TB, path string, o Options) *Session {
	tb.Helper()
	var fd int
	for deadline := time.Now().Add(o.ConnectWait); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			tb.Fatal(err)
		}
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		if err == nil {
			break
		}
		unix.Close(fd)
		if (err != unix.ECONNREFUSED && err != unix.ENOENT) || time.Now().After(deadline) {
			tb.Fatalf("connect %s: %v", path, err)
		}
	}
	done := make(chan error, 1)
	done <- nil
	return run(tb, fd, done, o)
}

func run(tb TB, fd int, done chan error, o Options) *Session {
	if o.Pairs == 0 {
		o.Pairs = 1
	}
	if o.Num == 0 {
		o.Num = 256
	}
	if o.MemSize == 0 {
		o.MemSize = 64 << 20
	}
	if o.TXSlot == 0 {
		o.TXSlot = 68 << 10
	}
	if o.RXSlot == 0 {
		o.RXSlot = 68 << 10
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	tv := unix.Timeval{Sec: 20}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	s := &Session{tb: tb, FE: &Frontend{tb, fd}, done: done}
	tb.Cleanup(func() {
		if !s.closed {
			s.Close()
		}
	})
	s.G = o.Guest
	if s.G == nil {
		s.G = NewGuest(tb, o.MemSize, o.Layout)
	}
	fe := s.FE
	nrings := 2 * o.Pairs
	for i := 0; i < nrings; i++ {
		slot := o.TXSlot
		if i%2 == 0 {
			slot = o.RXSlot
		}
		s.Rings = append(s.Rings, NewRing(s.G, i, o.Num, slot))
	}

	// Step 1, connect (vhost_user_backend_init, vhost_dev_init).
	offered := fe.Get(vhostuser.ReqGetFeatures)
	s.Offered = offered
	if offered&(1<<virtio.VhostUserProtocolFeatures) == 0 {
		tb.Fatalf("GET_FEATURES %#x lacks bit 30", offered)
	}
	var proto uint64
	for pair := 0; pair < o.Pairs; pair++ {
		if pair > 0 {
			fe.Get(vhostuser.ReqGetFeatures)
		}
		proto = fe.Get(vhostuser.ReqGetProtocolFeatures)
		// QEMU 7.2 keeps offered ∩ bits 0–16, minus F_CONFIG for net.
		fe.Send(vhostuser.ReqSetProtocolFeatures, flagVersion, U64(proto&0x1ffff&^(1<<9)))
		if pair == 0 {
			if proto&(1<<vhostuser.ProtoMQ) != 0 {
				if q := fe.Get(vhostuser.ReqGetQueueNum); q < uint64(o.Pairs) {
					tb.Fatalf("GET_QUEUE_NUM %d, want ≥ %d", q, o.Pairs)
				}
			}
			fe.Send(vhostuser.ReqSetOwner, flagVersion, nil)
		}
		fe.Get(vhostuser.ReqGetFeatures)
		for _, i := range []int{2 * pair, 2*pair + 1} {
			// QEMU's masked notifier, not the guest's: a throwaway eventfd.
			efd, _ := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
			fe.Send(vhostuser.ReqSetVringCall, flagVersion, U64(uint64(i)), efd)
			unix.Close(efd)
			fe.Send(vhostuser.ReqSetVringErr, flagVersion, U64(uint64(i)), s.Rings[i].Err)
		}
	}
	// Step 2, device reset and feature writes: enable, repeated.
	if !o.NoEnable {
		for rep := 0; rep < 2; rep++ {
			for i := 0; i < nrings; i++ {
				fe.Send(vhostuser.ReqSetVringEnable, flagVersion, State(uint32(i), 1))
			}
		}
	}
	// Step 3, DRIVER_OK (vhost_net_start).
	ack := o.Ack
	if ack == 0 {
		ack = offered &^ (1 << virtio.VhostUserProtocolFeatures)
	}
	ack &= offered &^ o.AckMask
	if ack&(1<<virtio.NetMTU) != 0 && proto&(1<<vhostuser.ProtoNetMTU) != 0 {
		if r := fe.Ack(vhostuser.ReqNetSetMTU, U64(o.MTU)); r != 0 {
			tb.Fatalf("NET_SET_MTU ack %d", r)
		}
	}
	if !o.NoEnable {
		for i := 0; i < nrings; i++ {
			fe.Send(vhostuser.ReqSetVringEnable, flagVersion, State(uint32(i), 1))
		}
	}
	s.Acked = ack | 1<<virtio.VhostUserProtocolFeatures
	fe.Send(vhostuser.ReqSetFeatures, flagVersion, U64(s.Acked))
	// SET_MEM_TABLE: flags 0x9 always in 7.2, one fd per region (the same memfd).
	fds := make([]int, len(s.G.Regions))
	for i := range fds {
		fds[i] = s.G.FD
	}
	if r := fe.Ack(vhostuser.ReqSetMemTable, MemTablePayload(s.G.Regions), fds...); r != 0 {
		tb.Fatalf("SET_MEM_TABLE ack %d", r)
	}
	for i, r := range s.Rings {
		fe.Send(vhostuser.ReqSetVringNum, flagVersion, State(uint32(i), uint32(o.Num)))
		fe.Send(vhostuser.ReqSetVringBase, flagVersion, State(uint32(i), 0))
		fe.Send(vhostuser.ReqSetVringAddr, flagVersion, AddrPayload(r))
		if o.SkipKick {
			continue
		}
		fe.Send(vhostuser.ReqSetVringKick, flagVersion, U64(uint64(i)), r.Kick)
		fe.Send(vhostuser.ReqSetVringCall, flagVersion, U64(uint64(i)), r.Call)
	}
	fe.Get(vhostuser.ReqGetFeatures)
	return s
}

// RX is the receive ring of pair p; TX its transmit ring.
func (s *Session) RX(p int) *Ring { return s.Rings[2*p] }

// TX is the transmit ring of pair p.
func (s *Session) TX(p int) *Ring { return s.Rings[2*p+1] }

// Has reports whether virtio bit b was acked.
func (s *Session) Has(b uint) bool { return s.Acked&(1<<b) != 0 }

// HdrLen is the virtio-net header length the acked features imply.
func (s *Session) HdrLen() int {
	if s.Has(virtio.Version1) || s.Has(virtio.NetMrgRxbuf) {
		return 12
	}
	return 10
}

// Stop is step 4: GET_VRING_BASE per ring; it returns the bases.
func (s *Session) Stop() []uint32 {
	var out []uint32
	for i := range s.Rings {
		s.FE.Send(vhostuser.ReqGetVringBase, flagVersion, State(uint32(i), 0))
		p := s.FE.Reply(vhostuser.ReqGetVringBase, 8)
		if binary.LittleEndian.Uint32(p) != uint32(i) {
			s.tb.Fatalf("GET_VRING_BASE reply index %d", binary.LittleEndian.Uint32(p))
		}
		out = append(out, binary.LittleEndian.Uint32(p[4:]))
	}
	return out
}

// Close ends the session from the front-end's side (QEMU exiting) and returns what the
// serving function returned.
func (s *Session) Close() error {
	if s.closed {
		return fmt.Errorf("vhostusertest: closed twice")
	}
	s.closed = true
	unix.Shutdown(s.FE.FD, unix.SHUT_RDWR)
	defer unix.Close(s.FE.FD)
	select {
	case err := <-s.done:
		return err
	case <-time.After(10 * time.Second):
		s.tb.Error("vhostusertest: session did not end")
		return fmt.Errorf("vhostusertest: session did not end")
	}
}
