//go:build linux

package vhostuser

import (
	"fmt"
	"math"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
)

// region is one mapped VhostUserMemoryRegion. mem = mapping[mmap_offset:][:size]: the
// bytes guest_phys_addr .. guest_phys_addr+size-1 (and userspace_addr .. in QEMU).
type region struct {
	vuproto.MemRegion
	mapping []byte // whole mmap, kept for munmap
	mem     []byte
}

// guestMem is one SET_MEM_TABLE's worth of mappings. It is immutable once built; rings
// hold a pointer to it and only touch it under their lock, which is how unmap is made
// safe (Session.setMemTable swaps it under every ring's lock, then unmaps the old one).
type guestMem struct {
	regions []region
}

// memPolicy is what a front-end's memory may be: at most maxBytes mapped per session
// (guest RAM and the dirty log together), from files on tmpfs or hugetlbfs unless
// anyFS. Config.MaxMapped and Config.AnyFSMemory set it.
type memPolicy struct {
	maxBytes uint64
	anyFS    bool
}

// DefaultMaxMapped is Config.MaxMapped's default, 32 TiB: a quarter of the 128 TiB
// user address space of x86-64 with 4-level page tables (linux
// arch/x86/include/asm/page_64_types.h TASK_SIZE_MAX), so that two tables mapped at once
// during a SET_MEM_TABLE swap still leave tapgro half of it, and larger than any guest
// a single host runs (the largest x86 servers hold 24 TiB). The cap is there because
// mmap with MAP_NORESERVE costs a front-end nothing: sparse files sized to the free
// address space exhaust it, and the next heap growth is a fatal "out of memory".
const DefaultMaxMapped = 32 << 40

// mapMemTable maps every region of t, taking ownership of fds (closed in all cases:
// the mapping keeps the memory alive, libvhost-user and DPDK close them the same way).
// unsealed lists, as text for the log ("[0 2]"; "" for none), the regions accepted but
// worth telling the operator of: memfds that can shrink (see below).
// Every region's mapping (mmap_offset+size bytes, since it maps from offset 0) counts
// toward pol.maxBytes, with extra (the dirty log already mapped).
//
// A region must lie inside its file as the file is now: a shared mapping past the end
// of a file is not an error for mmap(2) but a SIGBUS at the first access (mm/filemap.c
// filemap_fault returns VM_FAULT_SIGBUS past i_size), and in a Go program a SIGBUS in
// ordinary code is fatal to the whole process. So every fd is fstat'ed: it must be a
// regular file (a memfd, a tmpfs or hugetlbfs file: what QEMU's memory backends
// create), and mmap_offset+size must not pass its size. A file can still shrink after
// this check; the workers recover that fault (Vring.Guard), and a memfd sealed with
// F_SEAL_SHRINK (QEMU's memory-backend-memfd default, seal=on) cannot, so an unsealed
// memfd is reported once.
func mapMemTable(t *vuproto.MemTable, fds []int, pol memPolicy, extra uint64) (g *guestMem, unsealed string, err error) {
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	total := extra
	for i := 0; i < t.N; i++ {
		r := t.Regions[i]
		if err := checkRegion(r); err != nil {
			return nil, "", fmt.Errorf("region %d: %w", i, err)
		}
		total += r.MmapOffset + r.Size // no overflow: checkRegion bounds each by MaxInt
		if total > pol.maxBytes || total < r.Size {
			return nil, "", fmt.Errorf("the table maps %#x bytes or more, over the cap of %#x (--vhost-max-mapped)", total, pol.maxBytes)
		}
	}
	g = &guestMem{regions: make([]region, 0, t.N)}
	var idx []int
	for i := 0; i < t.N; i++ {
		r := t.Regions[i]
		sealed, err := checkRegionFile(fds[i], r, pol.anyFS)
		if err != nil {
			g.unmap()
			return nil, "", fmt.Errorf("region %d: %w", i, err)
		}
		if !sealed {
			idx = append(idx, i)
		}
		m, err := mmapRegion(fds[i], int(r.MmapOffset+r.Size))
		if err != nil {
			g.unmap()
			return nil, "", fmt.Errorf("region %d: mmap %d bytes: %w", i, r.MmapOffset+r.Size, err)
		}
		g.regions = append(g.regions, region{MemRegion: r, mapping: m, mem: m[r.MmapOffset:][:r.Size]})
	}
	if len(idx) > 0 {
		unsealed = fmt.Sprint(idx)
	}
	return g, unsealed, nil
}

// checkRegion rejects regions whose ends overflow in any of the three address spaces, so
// that later translation arithmetic (a - start < size) needs no overflow care.
func checkRegion(r vuproto.MemRegion) error {
	switch {
	case r.Size == 0:
		return fmt.Errorf("empty region")
	case r.GPA+r.Size < r.GPA, r.UserAddr+r.Size < r.UserAddr:
		return fmt.Errorf("region end overflows")
	case r.MmapOffset+r.Size < r.MmapOffset, r.MmapOffset+r.Size > math.MaxInt:
		return fmt.Errorf("mmap_offset %#x + size %#x too large", r.MmapOffset, r.Size)
	}
	return nil
}

// checkRegionFile checks that fd is a regular file on tmpfs or hugetlbfs (unless
// anyFS) holding all of r (checkRegion has ruled out overflow). sealed is false only for
// a memfd without F_SEAL_SHRINK; a file that takes no seals at all (F_GET_SEALS fails:
// not a memfd) counts as sealed, since nothing can be done about it here and the fault
// recovery covers it.
//
// The filesystem matters because a page fault in the mapping is taken by whichever
// goroutine touches it, and on a FUSE or network filesystem it can sleep in the
// kernel for as long as the server behind the file likes (no SIGBUS comes), holding
// that goroutine's P as any memory access does: the whole process stops at the next
// stop-the-world. tmpfs and hugetlbfs pages are in memory or swap, whatever the
// front-end does. Every QEMU memory backend a vhost-user guest can use is one of them:
// memory-backend-memfd (a memfd is a file on the kernel's internal tmpfs or hugetlbfs
// mount, mm/memfd.c), memory-backend-file on /dev/shm or hugetlbfs. A DAX or pmem file
// on ext4 or xfs is the exception an operator can allow (anyFS).
func checkRegionFile(fd int, r vuproto.MemRegion, anyFS bool) (sealed bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return false, fmt.Errorf("fd is not a regular file or memfd (mode %#o): its size cannot be checked", st.Mode)
	}
	if !anyFS {
		var fs unix.Statfs_t
		if err := unix.Fstatfs(fd, &fs); err != nil {
			return false, fmt.Errorf("fstatfs: %w", err)
		}
		if fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.HUGETLBFS_MAGIC {
			return false, fmt.Errorf("the file is on a filesystem of type %#x, not tmpfs or hugetlbfs: "+
				"a page fault there may never finish (FUSE, NFS); use a memfd or /dev/shm, or allow it "+
				"with --vhost-any-fs-memory (DAX, pmem)", fs.Type)
		}
	}
	if end := r.MmapOffset + r.Size; st.Size < 0 || end > uint64(st.Size) {
		return false, fmt.Errorf("mmap_offset %#x + size %#x = %#x passes the end of its file (%#x bytes)",
			r.MmapOffset, r.Size, end, st.Size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return true, nil
	}
	return seals&unix.F_SEAL_SHRINK != 0, nil
}

// mapped is the bytes g has mapped (nil: none).
func (g *guestMem) mapped() uint64 {
	if g == nil {
		return 0
	}
	var n uint64
	for i := range g.regions {
		n += uint64(len(g.regions[i].mapping))
	}
	return n
}

func (g *guestMem) unmap() {
	if g == nil {
		return
	}
	for i := range g.regions {
		munmapRegion(g.regions[i].mapping)
		g.regions[i].mapping, g.regions[i].mem = nil, nil
	}
	g.regions = nil
}

// regionOf names the region whose mapping holds host address a (a fault's address),
// for the error that ends the session: -1 if none does.
func (g *guestMem) regionOf(a uintptr) int {
	if g == nil {
		return -1
	}
	for i := range g.regions {
		m := g.regions[i].mapping
		if len(m) > 0 && a >= addrOf(m) && a-addrOf(m) < uintptr(len(m)) {
			return i
		}
	}
	return -1
}

// qva translates a front-end virtual address range (SET_VRING_ADDR) to one slice. Ring
// parts must lie inside one region (DPDK translate_ring_addresses checks the full size;
// QEMU allocates each ring inside one RAM block).
func (g *guestMem) qva(a, n uint64) []byte {
	if g == nil {
		return nil
	}
	for i := range g.regions {
		r := &g.regions[i]
		if off := a - r.UserAddr; a >= r.UserAddr && off < r.Size && n <= r.Size-off {
			return r.mem[off : off+n : off+n]
		}
	}
	return nil
}

// gpa translates a guest-physical range that must be contiguous in one region (an
// indirect descriptor table).
func (g *guestMem) gpa(a, n uint64) []byte {
	for i := range g.regions {
		r := &g.regions[i]
		if off := a - r.GPA; a >= r.GPA && off < r.Size && n <= r.Size-off {
			return r.mem[off : off+n : off+n]
		}
	}
	return nil
}

// gpaIov appends the host slices covering guest-physical [a, a+n) to iov[:k] within
// cap(iov), splitting at region borders (QEMU virtqueue_map_desc, DPDK map_one_desc).
// The caller has checked that a+n does not overflow.
func (g *guestMem) gpaIov(a, n uint64, iov [][]byte, k int) (int, Reason, bool) {
	for n > 0 {
		var seg []byte
		for i := range g.regions {
			r := &g.regions[i]
			if off := a - r.GPA; a >= r.GPA && off < r.Size {
				take := min(n, r.Size-off)
				seg = r.mem[off : off+take : off+take]
				break
			}
		}
		if seg == nil {
			return k, RejectAddress, false
		}
		if k == cap(iov) {
			return k, RejectIovFull, false
		}
		iov = iov[:k+1]
		iov[k] = seg
		k++
		a += uint64(len(seg))
		n -= uint64(len(seg))
	}
	return k, 0, true
}
