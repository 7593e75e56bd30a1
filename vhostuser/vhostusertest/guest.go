//go:build linux

package vhostusertest

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
)

// Guest RAM as the front-end double lays it out.

// Guest is guest RAM as the front-end sees it: one memfd, mapped once, and a region table
// in which userspace_addr is the address of the front-end's own mapping.
type Guest struct {
	tb      TB
	FD      int
	Mem     []byte
	Regions []vuproto.MemRegion
	size    uint64
	next    uint64 // bump allocator (GPA)
}

// MeasuredLayout is QEMU 7.2's two regions of one memfd of size bytes for a pc machine.
func MeasuredLayout(size uint64) []vuproto.MemRegion {
	return []vuproto.MemRegion{{GPA: 0, Size: RegionAEnd, MmapOffset: 0},
		{GPA: RegionBBase, Size: size - RegionBBase, MmapOffset: RegionBBase}}
}

// NewGuest creates size bytes of guest RAM (a sparse memfd) with layout (nil: the
// measured layout); MmapOffset says where each region starts in the memfd.
func NewGuest(tb TB, size uint64, layout []vuproto.MemRegion) *Guest {
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
