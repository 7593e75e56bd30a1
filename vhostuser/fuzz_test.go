//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime/debug"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/vhostuser/vuproto"
)

// FuzzDecode feeds arbitrary bytes to the header parser, the size/fd rules and the
// typed decoders. Invariants: no panic; whatever validate accepts decodes, and a
// decoded memory table has exactly as many regions as fds.
func FuzzDecode(f *testing.F) {
	seed := func(req, flags uint32, p []byte, nfds byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, req)
		b = binary.LittleEndian.AppendUint32(b, flags)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p)))
		return append(append(b, p...), nfds)
	}
	f.Add(seed(ReqGetFeatures, 1, nil, 0))
	f.Add(seed(ReqSetFeatures, 1, vhostusertest.U64(1<<32), 0))
	f.Add(seed(ReqSetVringKick, 1, vhostusertest.U64(1), 1))
	f.Add(seed(ReqSetVringCall, 1, vhostusertest.U64(0x100), 0))
	f.Add(seed(ReqSetVringAddr, 1, make([]byte, 40), 0))
	f.Add(seed(ReqSetMemTable, 9, vhostusertest.MemTablePayload(vhostusertest.MeasuredLayout(memSize)), 2))
	f.Add(seed(ReqGetVringBase, 1, vhostusertest.State(1, 0), 0))
	f.Add(seed(99, 9, []byte{1, 2, 3}, 3))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < vuproto.HeaderSize+1 {
			return
		}
		nfds := int(data[len(data)-1] % (maxFds + 1))
		req, flags, size, err := parseHeader(data[:vuproto.HeaderSize])
		if err != nil {
			return
		}
		if size > maxPayload || flags&vuproto.FlagReply != 0 {
			t.Fatalf("header accepted: size %d flags %#x", size, flags)
		}
		p := data[vuproto.HeaderSize : len(data)-1]
		if uint32(len(p)) < size {
			return
		}
		p = p[:size]
		if err := validate(req, p, nfds); err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("validate error %v is not ErrProtocol", err)
			}
			return
		}
		switch sizeRule(req) {
		case -1:
			mt, err := decodeMemTable(p)
			if err != nil || mt.N != nfds || mt.N < 1 || mt.N > vuproto.MaxRegions {
				t.Fatalf("memory table: %v n=%d fds=%d", err, mt.N, nfds)
			}
			if q := vhostusertest.MemTablePayload(mt.Regions[:mt.N]); string(q[8:]) != string(p[8:]) {
				t.Fatal("memory table does not round-trip")
			}
		case 40:
			a, err := decodeAddr(p)
			if err != nil || binary.LittleEndian.Uint64(p[16:]) != a.Used || binary.LittleEndian.Uint64(p[24:]) != a.Avail {
				t.Fatalf("vring addr: %v", err)
			}
		case 8:
			if _, err := decodeU64(p); err != nil {
				t.Fatal(err)
			}
			if _, err := decodeState(p); err != nil {
				t.Fatal(err)
			}
		case 0:
			if len(p) != 0 {
				t.Fatal("payload on a zero-size request")
			}
		}
	})
}

// fuzzEnv is guest memory shared by every FuzzChain execution: one memfd in QEMU's
// measured two-region layout, mapped by the back-end code under test (mapMemTable) and
// separately by the "guest".
type fuzzEnv struct {
	g     *vhostusertest.Guest
	mem   *guestMem
	stats Stats
	ring  *vhostusertest.Ring
	indA  uint64
}

var (
	fuzzOnce sync.Once
	fuzzE    *fuzzEnv
)

const fuzzMaxNum = 64

func getFuzzEnv(t testing.TB) *fuzzEnv {
	fuzzOnce.Do(func() {
		e := &fuzzEnv{}
		// Not t's cleanup: the environment outlives one execution (it would unmap it).
		e.g = vhostusertest.NewGuest(outlive{t}, memSize, nil)
		var mt vuproto.MemTable
		mt.N = len(e.g.Regions)
		copy(mt.Regions[:], e.g.Regions)
		fds := make([]int, mt.N)
		for i := range fds {
			fds[i], _ = unix.Dup(e.g.FD)
		}
		m, _, err := mapMemTable(&mt, fds, testMemPolicy, 0)
		if err != nil {
			t.Fatal(err)
		}
		e.mem = m
		// The ring's layout only: its eventfds go unused (the ring never runs a session).
		e.ring = vhostusertest.NewRing(e.g, 1, fuzzMaxNum, 0)
		e.indA = e.g.Alloc(4096, 4096)
		fuzzE = e
	})
	return fuzzE
}

// outlive is a TB whose cleanups never run, for what outlives the execution that made
// it.
type outlive struct{ testing.TB }

func (outlive) Cleanup(func()) {}

// FuzzChain builds random descriptor tables, avail rings and indirect tables in guest
// memory and pops everything. Invariants: no panic; a popped chain's Len is the sum of
// its iovecs and at least the header; every error is ErrEmpty or a counted RingError
// that leaves the ring broken; nothing popped lies outside the mapped regions (the
// iovecs are sub-slices of the back-end's mappings, checked explicitly).
//
// Input: [0] flags (bit 0 EVENT_IDX, 1 INDIRECT, 2 RX ring, 3 raw addresses,
// 4 MRG_RXBUF), [1] log2 num, [2:4] avail idx, [4:6] base, then the descriptor table,
// the avail ring, and an indirect area at a fixed guest address.
func FuzzChain(f *testing.F) {
	mk := func(fl byte, lognum byte, idx, base uint16, descs [][4]uint64, ring []uint16, ind []byte) []byte {
		b := []byte{fl, lognum}
		b = binary.LittleEndian.AppendUint16(b, idx)
		b = binary.LittleEndian.AppendUint16(b, base)
		num := 1 << (lognum % 7)
		d := make([]byte, 16*num)
		for i, x := range descs {
			vhostusertest.PutDesc(d[16*i:], x[0], uint32(x[1]), uint16(x[2]), uint16(x[3]))
		}
		b = append(b, d...)
		r := make([]byte, 2*num)
		for i, h := range ring {
			binary.LittleEndian.PutUint16(r[2*i:], h)
		}
		return append(append(b, r...), ind...)
	}
	f.Add(mk(0, 3, 1, 0, [][4]uint64{{0x100000, 100, 0, 0}}, []uint16{0}, nil))
	f.Add(mk(2, 3, 2, 0, [][4]uint64{{0x100000, 12, 1, 1}, {0x100100, 1000, 0, 0}, {0x200000, 32, 4, 0}}, []uint16{0, 2}, nil))
	f.Add(mk(4|16, 4, 3, 0, [][4]uint64{{0x100000, 1536, 2, 0}, {0x101000, 1536, 2, 0}, {0x102000, 12, 3, 3}, {0x103000, 100, 2, 0}}, []uint16{0, 1, 2}, nil))
	f.Add(mk(1, 2, 0xffff, 0xfffe, [][4]uint64{{0x9ff00, 0x200, 0, 0}}, []uint16{0, 0}, nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 6 {
			return
		}
		e := getFuzzEnv(t)
		fl := data[0]
		num := 1 << (data[1] % 7)
		r := e.ring
		desc := r.G.At(r.DescA, 16*fuzzMaxNum)
		avail := r.G.At(r.AvailA, 6+2*fuzzMaxNum)
		used := r.G.At(r.UsedA, 6+8*fuzzMaxNum)
		ind := r.G.At(e.indA, 4096)
		clear(desc)
		clear(avail)
		clear(used)
		clear(ind)
		rest := data[6:]
		rest = rest[copy(desc[:16*num], rest):]
		rest = rest[copy(avail[4:4+2*num], rest):]
		copy(ind, rest)
		if fl&8 == 0 {
			// Keep addresses near guest RAM (8 MiB: both regions, the hole, and
			// beyond) so the walk gets past translation often.
			for i := 0; i < num; i++ {
				a := binary.LittleEndian.Uint64(desc[16*i:]) & 0x7fffff
				binary.LittleEndian.PutUint64(desc[16*i:], a)
			}
			for i := 0; i < 256; i++ {
				a := binary.LittleEndian.Uint64(ind[16*i:]) & 0x7fffff
				binary.LittleEndian.PutUint64(ind[16*i:], a)
			}
		}
		base := binary.LittleEndian.Uint16(data[4:])
		store32(avail, 0, uint32(binary.LittleEndian.Uint16(data[2:]))<<16)

		idx := 1
		if fl&4 != 0 {
			idx = 0
		}
		v := newVring(idx, idx == 0, &e.stats)
		v.num = uint32(num)
		v.addr = vuproto.VringAddr{Index: uint32(idx), Desc: r.G.QVA(r.DescA), Used: r.G.QVA(r.UsedA), Avail: r.G.QVA(r.AvailA)}
		v.addrSet = true
		v.base = base
		v.mu.Lock()
		ok := v.startLocked(e.mem, feats{eventIdx: fl&1 != 0, indirect: fl&2 != 0, hdrLen: 12})
		v.mu.Unlock()
		if !ok {
			t.Fatal("ring did not translate")
		}
		var iovArr [128][]byte
		iov := iovArr[:0]
		if err := v.Begin(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2*num+2; i++ {
			var c Chain
			var err error
			if fl&16 != 0 && i%3 == 2 {
				// Hand the last chain back and take it again (a device's reservation
				// that came up short).
				v.Rewind(1)
				err = nil
			} else {
				c, err = v.Pop(iov)
				if err == nil {
					sum := 0
					for _, s := range c.Iov {
						sum += len(s)
						if !inMapping(e.mem, s) {
							t.Fatal("iovec outside the mapped regions")
						}
					}
					if sum != c.Len || c.Len < 12 || int(c.Head) >= num {
						t.Fatalf("chain head %d len %d sum %d", c.Head, c.Len, sum)
					}
					v.Push(c.Head, uint32(c.Len))
				}
			}
			if err == ErrEmpty {
				break
			}
			if err != nil {
				var re *RingError
				if !errors.As(err, &re) || !v.broken {
					t.Fatalf("error %v, broken %v", err, v.broken)
				}
				break
			}
		}
		v.End()
		v.mu.Lock()
		v.stopLocked()
		v.mu.Unlock()
	})
}

// inMapping reports whether s lies inside one region's slice.
func inMapping(g *guestMem, s []byte) bool {
	p := addrOf(s)
	for _, r := range g.regions {
		b := addrOf(r.mem)
		if p >= b && p+uintptr(len(s)) <= b+uintptr(len(r.mem)) {
			return true
		}
	}
	return false
}

// memFuzzFiles are the files FuzzMemTable's regions may name: memfds of several sizes
// (one sealed against shrinking), a regular file, and a pipe, opened once.
var (
	memFuzzOnce  sync.Once
	memFuzzFiles []memFuzzFile
)

type memFuzzFile struct {
	fd     int
	size   uint64
	sealed bool // mapMemTable must not warn about it
}

func getMemFuzzFiles(t testing.TB) []memFuzzFile {
	memFuzzOnce.Do(func() {
		for i, size := range []uint64{0, 4096, 65536, 1 << 20, 1<<20 + 123, 1 << 20} {
			fd, err := unix.MemfdCreate("fuzz-table", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
			if err != nil {
				t.Fatal(err)
			}
			unix.Ftruncate(fd, int64(size))
			sealed := i == 5
			if sealed {
				unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
			}
			memFuzzFiles = append(memFuzzFiles, memFuzzFile{fd, size, sealed})
		}
		f, err := os.CreateTemp("", "fuzz-table")
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(f.Name())
		f.Truncate(128 << 10)
		fd, _ := unix.Dup(int(f.Fd()))
		f.Close()
		memFuzzFiles = append(memFuzzFiles, memFuzzFile{fd, 128 << 10, true})
		var p [2]int
		unix.Pipe2(p[:], unix.O_CLOEXEC)
		memFuzzFiles = append(memFuzzFiles, memFuzzFile{p[0], 0, true})
	})
	return memFuzzFiles
}

// FuzzMemTable feeds SET_MEM_TABLE regions of arbitrary addresses, sizes and offsets
// over files of several kinds and sizes to mapMemTable, then translates arbitrary
// addresses through the table. Invariants: no panic; a table is accepted only if every
// region lies inside a regular file; the warning names unsealed memfds exactly; every
// translation lies inside a mapping and inside the file (its first and last bytes read
// without a fault); every fd handed over is closed.
//
// Input: [0] regions (1..8), then per region GPA, size, userspace_addr, mmap_offset (8
// bytes each, sizes and offsets kept within 2 MiB unless bit 7 of the file byte is set)
// and a file byte; the rest are probes of 17 bytes: kind, address, length.
func FuzzMemTable(f *testing.F) {
	region := func(gpa, size, ua, off uint64, file byte) []byte {
		b := binary.LittleEndian.AppendUint64(nil, gpa)
		b = binary.LittleEndian.AppendUint64(b, size)
		b = binary.LittleEndian.AppendUint64(b, ua)
		b = binary.LittleEndian.AppendUint64(b, off)
		return append(b, file)
	}
	probe := func(kind byte, a, n uint64) []byte {
		return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64([]byte{kind}, a), n)
	}
	seed := [][]byte{
		append(append([]byte{1}, region(0, 65536, 1<<30, 0, 3)...), probe(0, 100, 200)...),
		append(append(append([]byte{2}, region(0, 0xa0000, 1<<30, 0, 3)...), region(0xc0000, 0x40000, 1<<30+0xc0000, 0xc0000, 3)...), probe(2, 0x9ff00, 0x300)...),
		append([]byte{1}, region(0, 4096, 1<<30, 4096, 1)...),
		append([]byte{1}, region(0, 1<<20, 1<<30, 123, 4)...),
		append([]byte{1}, region(0, 4096, 1<<30, 0, 7)...),
	}
	for _, s := range seed {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		files := getMemFuzzFiles(t)
		if len(data) < 1 {
			return
		}
		var mt vuproto.MemTable
		mt.N = int(data[0]%vuproto.MaxRegions) + 1
		data = data[1:]
		if len(data) < 33*mt.N {
			return
		}
		fds := make([]int, mt.N)
		use := make([]memFuzzFile, mt.N)
		for i := 0; i < mt.N; i++ {
			p := data[33*i:]
			r := vuproto.MemRegion{GPA: binary.LittleEndian.Uint64(p), Size: binary.LittleEndian.Uint64(p[8:]),
				UserAddr: binary.LittleEndian.Uint64(p[16:]), MmapOffset: binary.LittleEndian.Uint64(p[24:])}
			fb := p[32]
			if fb&0x80 == 0 {
				r.Size &= 1<<21 - 1
				r.MmapOffset &= 1<<21 - 1
			}
			mt.Regions[i] = r
			use[i] = files[int(fb&0x7f)%len(files)]
			fds[i], _ = unix.Dup(use[i].fd)
		}
		probes := data[33*mt.N:]
		fdsBefore := append([]int(nil), fds...)
		g, warn, err := mapMemTable(&mt, fds, testMemPolicy, 0)
		for _, fd := range fdsBefore {
			if _, e := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); e == nil {
				t.Fatalf("fd %d left open", fd)
			}
		}
		if err != nil {
			return
		}
		defer g.unmap()
		anyUnsealed := false
		for i := 0; i < mt.N; i++ {
			r := mt.Regions[i]
			if r.MmapOffset+r.Size > use[i].size {
				t.Fatalf("region %d (%+v) accepted over a %d-byte file", i, r, use[i].size)
			}
			anyUnsealed = anyUnsealed || !use[i].sealed
		}
		if (warn != "") != anyUnsealed {
			t.Fatalf("warning %q with unsealed memfds %v", warn, anyUnsealed)
		}
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("translation faulted: %v", r)
			}
		}()
		touch := func(s []byte) {
			if len(s) == 0 {
				return // a zero-length range: nothing to lie outside
			}
			if !inMapping(g, s) {
				t.Fatal("translation outside the mapped regions")
			}
			_ = s[0] + s[len(s)-1]
		}
		var iov [16][]byte
		for ; len(probes) >= 17; probes = probes[17:] {
			a, n := binary.LittleEndian.Uint64(probes[1:]), binary.LittleEndian.Uint64(probes[9:])&(1<<22-1)
			switch probes[0] % 3 {
			case 0:
				if s := g.qva(a, n); s != nil {
					if uint64(len(s)) != n {
						t.Fatalf("qva length %d for %d", len(s), n)
					}
					touch(s)
				}
			case 1:
				if s := g.gpa(a, n); s != nil {
					touch(s)
				}
			case 2:
				if a+n < a {
					continue
				}
				k, _, ok := g.gpaIov(a, n, iov[:0:len(iov)], 0)
				total := 0
				for _, s := range iov[:k] {
					touch(s)
					total += len(s)
				}
				if ok && uint64(total) != n {
					t.Fatalf("gpaIov covers %d of %d bytes", total, n)
				}
			}
		}
	})
}
