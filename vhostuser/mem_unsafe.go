//go:build linux && (amd64 || arm64 || riscv64 || loong64 || ppc64le)

package vhostuser

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file holds every use of package unsafe and every mmap/munmap in the package.
// Everything else sees guest memory as []byte slices into a mapping, so ordinary bounds
// checks apply; what needs an address (atomic word access, alignment) is here.
//
// The build constraint lists little-endian 64-bit targets: the split ring is
// little-endian with VIRTIO_F_VERSION_1 (virtio spec "Basic Facilities of a Virtio
// Device", little-endian fields), and the 32-bit word {flags, idx} below is split
// assuming the host is little-endian too (legacy guests use guest order, which on
// these hosts is also little-endian).

// mmapRegion maps length bytes of fd from offset 0, shared and without swap
// reservation, as libvhost-user vu_set_mem_table_exec does: mmap offsets must be page
// aligned and mmap_offset need not be, so the region starts mmap_offset bytes in.
// The mapping is left out of core dumps (MADV_DONTDUMP, as DPDK's vhost library does
// for guest memory, lib/vhost/vhost_user.c mem_set_dump): a crash of tapgro must not
// write a guest's RAM to disk, and gigabytes of it would make the dump useless anyway.
func mmapRegion(fd int, length int) ([]byte, error) {
	m, err := unix.Mmap(fd, 0, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	unix.Madvise(m, unix.MADV_DONTDUMP) // advice only: a kernel that refuses it still maps
	return m, nil
}

func munmapRegion(b []byte) error { return unix.Munmap(b) }

// aligned reports whether b starts at a multiple of a (a power of two).
func aligned(b []byte, a uintptr) bool {
	return len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))&(a-1) == 0
}

// load32/store32 access the 4-byte word at b[off:], which must be 4-aligned (checked
// when the ring is translated). sync/atomic operations are sequentially consistent
// (Go memory model), which gives the barriers the split ring needs; see vring.go.
func load32(b []byte, off int) uint32 {
	_ = b[off+3]
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[off])))
}

func store32(b []byte, off int, v uint32) {
	_ = b[off+3]
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[off])), v)
}

// load16/store16 are single 16-bit accesses for used_event and avail_event. Go has no
// 16-bit atomics; an aligned 16-bit MOV is single-copy atomic on the targets above, and
// the ordering around these comes from the adjacent 32-bit atomics, as QEMU orders its
// plain vring_avail_event/vring_get_used_event accesses with smp_mb (hw/virtio/virtio.c
// virtio_split_should_notify, virtio_queue_split_set_notification).
func load16(b []byte, off int) uint16 {
	_ = b[off+1]
	return *(*uint16)(unsafe.Pointer(&b[off]))
}

func store16(b []byte, off int, v uint16) {
	_ = b[off+1]
	*(*uint16)(unsafe.Pointer(&b[off])) = v
}

// addrOf is the address of b's first byte (the test front-end uses it as QEMU's
// userspace_addr for its own mapping).
func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// words32 views b, which must start 4-aligned (a page-aligned mapping at an 8-aligned
// offset: mapLog), as 32-bit words for the dirty log's atomic ORs.
func words32(b []byte) []uint32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), len(b)/4)
}
