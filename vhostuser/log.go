//go:build linux

package vhostuser

import (
	"fmt"
	"math"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
)

// Dirty logging for live migration (QEMU docs/interop/vhost-user.rst "Migration"). While
// QEMU migrates the guest it copies guest memory to the destination in passes, and a
// page written after it was copied must be copied again. It sees the guest's own writes,
// but not the back-end's: so the back-end marks each 4 KiB guest-physical page it
// writes in a bitmap QEMU shares with it (SET_LOG_BASE with PROTOCOL_F_LOG_SHMFD, one
// fd and {mmap_size, mmap_offset}), and QEMU collects and clears the bits as it goes
// (hw/virtio/vhost.c vhost_log_sync). Logging is on while the acked features hold
// VHOST_F_LOG_ALL, for the rings whose SET_VRING_ADDR carries VHOST_VRING_F_LOG; QEMU
// sends both to running rings when migration starts and ends (vhost_dev_set_log).
//
// What this back-end writes, and marks, is: the bytes of each receive chain up to the
// length it used or wrote (Push, Wrote: the descriptors' guest-physical ranges, recorded
// at Pop while logging and kept for that batch only, as the kernel's vhost records them
// in vhost_get_vq_desc's log array and marks them in vhost_log_write), and the used ring — entries, the {flags,
// idx} word, avail_event — at the ring's log_guest_addr (linux drivers/vhost/vhost.c
// log_used). Nothing else is written: transmit chains are only read.
//
// The bitmap holds one bit per page, page p in byte p/8 at bit p%8 (QEMU reads it as
// unsigned longs, vhost_log_chunk_t; on a little-endian host that is the same bits).
// Bits are set with an atomic OR on the aligned 32-bit word holding them: QEMU clears
// words while we set them, and several rings share the map. A page past the end of the
// bitmap is not marked but counted (a front-end that sized its log too small).

// logPage is the unit of the dirty log (VHOST_LOG_PAGE, 4 KiB).
const logPageShift = 12

// dirtyLog is one SET_LOG_BASE mapping. Like guestMem it is immutable once built; rings
// point at it and touch it only under their lock, and a replacement is swapped in under
// every ring's lock before the old one is unmapped.
type dirtyLog struct {
	mapping []byte   // the whole mmap, for munmap
	words   []uint32 // the bitmap: mmap_offset .. mmap_offset+mmap_size
	pages   uint64   // pages it covers
	stats   *Stats
}

// mapLog maps the log QEMU sent: size bytes at offset in fd (taken: closed in all
// cases). The fd must be a regular file or memfd that holds the whole map (a mapping
// past a file's end faults at the first touch, as for guest memory, mem.go), the
// offset 8-aligned (the bitmap is read as unsigned longs) and the map non-empty.
func mapLog(fd int, size, offset uint64, st *Stats, pol memPolicy, extra uint64) (*dirtyLog, error) {
	defer unix.Close(fd)
	switch {
	case size == 0 || size%4 != 0:
		return nil, fmt.Errorf("log of %d bytes", size)
	case offset%8 != 0:
		return nil, fmt.Errorf("log offset %#x not 8-aligned", offset)
	case offset+size < offset || offset+size > math.MaxInt32:
		return nil, fmt.Errorf("log offset %#x + size %#x too large", offset, size)
	case extra+offset+size > pol.maxBytes:
		return nil, fmt.Errorf("log of %#x bytes with %#x of guest memory is over the cap of %#x (--vhost-max-mapped)",
			offset+size, extra, pol.maxBytes)
	}
	if _, err := checkRegionFile(fd, vuproto.MemRegion{Size: size, MmapOffset: offset}, pol.anyFS); err != nil {
		return nil, fmt.Errorf("log: %w", err)
	}
	m, err := mmapRegion(fd, int(offset+size))
	if err != nil {
		return nil, fmt.Errorf("log: mmap %d bytes: %w", offset+size, err)
	}
	return &dirtyLog{mapping: m, words: words32(m[offset:]), pages: size * 8, stats: st}, nil
}

// mark sets the bits of every page in guest-physical [gpa, gpa+n).
func (l *dirtyLog) mark(gpa, n uint64) {
	if n == 0 {
		return
	}
	last := (gpa + n - 1) >> logPageShift
	if gpa+n-1 < gpa {
		last = math.MaxUint64 >> logPageShift
	}
	for p := gpa >> logPageShift; p <= last; p++ {
		if p >= l.pages {
			l.stats.LogBeyond.Add(last - p + 1)
			return
		}
		bit := uint32(1) << (p & 31)
		if atomic.OrUint32(&l.words[p>>5], bit)&bit == 0 {
			l.stats.LogPages.Add(1)
		}
	}
}

// holds reports whether host address a is inside l's mapping (nil: no).
func (l *dirtyLog) holds(a uintptr) bool {
	return l != nil && len(l.mapping) > 0 && a >= addrOf(l.mapping) && a-addrOf(l.mapping) < uintptr(len(l.mapping))
}

// mapped is the bytes l has mapped (nil: none).
func (l *dirtyLog) mapped() uint64 {
	if l == nil {
		return 0
	}
	return uint64(len(l.mapping))
}

func (l *dirtyLog) unmap() {
	if l != nil && l.mapping != nil {
		munmapRegion(l.mapping)
		l.mapping, l.words = nil, nil
	}
}

// piece is one writable descriptor's guest-physical range, recorded at Pop while
// logging.
type piece struct{ gpa, n uint64 }

// logPop is one receive chain popped in the current batch while logging: its pieces are
// logPieces[from:to]. Records live for one batch only (Begin clears them; End rewinds
// whatever was not pushed), in pop order, so a head the guest posted twice has two.
type logPop struct {
	head     uint16
	from, to int32
	done     bool // pushed: its bytes are marked
}

// maxLogPieces bounds the pieces a ring keeps for one batch (16 bytes each: 1 MiB). A
// chain that would pass it has all its pieces marked at once instead, as if written
// whole: more pages for QEMU to copy again, never fewer, and no guest can make a batch
// hold more than this.
const maxLogPieces = 1 << 16

// recordPopLocked keeps the pieces walk appended for the chain at head, from index
// from on, or marks them all now if keeping them would pass maxLogPieces.
func (v *Vring) recordPopLocked(head uint16, from int) {
	if len(v.logPieces) > maxLogPieces {
		if !unloggedRX {
			for _, p := range v.logPieces[from:] {
				v.log.mark(p.gpa, p.n)
			}
		}
		v.logPieces = v.logPieces[:from]
	}
	v.logPops = append(v.logPops, logPop{head: head, from: int32(from), to: int32(len(v.logPieces))})
}

// logWrittenLocked marks the first n bytes written into a chain popped in this batch at
// head: the first record not yet pushed (Push goes in pop order) or, for a chain handed
// back (last), the latest.
func (v *Vring) logWrittenLocked(head uint16, n uint64, last bool) {
	rec := v.findPopLocked(head, last)
	if rec == nil {
		return
	}
	rec.done = !last
	if unloggedRX {
		return
	}
	for _, p := range v.logPieces[rec.from:rec.to] {
		if n == 0 {
			return
		}
		k := min(n, p.n)
		v.log.mark(p.gpa, k)
		n -= k
	}
}

func (v *Vring) findPopLocked(head uint16, last bool) *logPop {
	if last {
		for i := len(v.logPops) - 1; i >= 0; i-- {
			if r := &v.logPops[i]; r.head == head && !r.done {
				return r
			}
		}
		return nil
	}
	for i := range v.logPops {
		if r := &v.logPops[i]; r.head == head && !r.done {
			return r
		}
	}
	return nil
}

// rewindLogLocked forgets the records of the last n chains popped (handed back).
func (v *Vring) rewindLogLocked(n int) {
	k := len(v.logPops) - n
	if n <= 0 || k < 0 {
		return
	}
	v.logPieces = v.logPieces[:v.logPops[k].from]
	v.logPops = v.logPops[:k]
}

// Wrote marks the first n bytes of the chain at head as written without using it: a
// device that wrote into chains and hands them back (Rewind) tells the log, since the
// guest memory changed all the same. A no-op while not logging.
func (v *Vring) Wrote(head uint16, n int) {
	if v.inBatch && v.log != nil && v.writable && n > 0 {
		v.logWrittenLocked(head, uint64(n), true)
	}
}

// Logging reports whether this ring's writes are being logged (a migration is running).
func (v *Vring) Logging() bool { return v.logOn.Load() }

// setLogLocked points the ring at the session's log while logging applies to it: LOG_ALL
// acked, a log mapped, and its SET_VRING_ADDR flagged VHOST_VRING_F_LOG.
func (v *Vring) setLogLocked(l *dirtyLog, logAll bool) {
	v.log = nil
	if logAll && l != nil && v.addr.Flags&vringFLog != 0 {
		v.log = l
	}
	v.ulog = areaLog{log: v.log, gpa: v.addr.Log}
	v.logOn.Store(v.log != nil)
}

// unloggedRX is set only in builds with the tapgro_unlogged_rx tag (unlogged_rx.go),
// the migration tests' control.
var unloggedRX = false

// UnloggedRXBuild reports whether this is the migration tests' control build, whose
// dirty log leaves out receive buffers (a migrated guest gets stale ones).
func UnloggedRXBuild() bool { return unloggedRX }

// vringFLog is VHOST_VRING_F_LOG, bit 0 of SET_VRING_ADDR's flags (linux
// include/uapi/linux/vhost_types.h): log_guest_addr is valid and used-ring writes go to
// the log.
const vringFLog = 1
