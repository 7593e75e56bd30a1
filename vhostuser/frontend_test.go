//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

// This file is a front-end test double: it plays QEMU 7.2's side of the socket (message
// order of hw/virtio/vhost.c vhost_dev_init/vhost_dev_start and hw/net/vhost_net.c
// vhost_net_start) and the guest driver's side of the rings, in a memfd that stands for
// guest RAM.

const (
	memSize = 4 << 20
	// The measured 256 MiB pc layout, scaled: RAM below the VGA hole, then from 0xc0000.
	regAEnd  = 0xa0000
	regBBase = 0xc0000

	featsDefault = 1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf | 1<<0 | 1<<1 | 1<<11 | 1<<12 | 1<<13 |
		1<<7 | 1<<8 | 1<<9 | 1<<virtio.NetMTU | 1<<virtio.RingEventIdx | 1<<virtio.RingIndirectDesc
)

// guest is guest RAM as the front-end sees it: one memfd, mapped once, with a region
// table in which userspace_addr is the address of the front-end's own mapping.
type guest struct {
	t       testing.TB
	fd      int
	mem     []byte
	regions []vuproto.MemRegion
	next    uint64 // bump allocator (GPA)
}

func newGuest(t testing.TB, layout []vuproto.MemRegion) *guest {
	fd, err := unix.MemfdCreate("guest-ram", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fd, memSize); err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, memSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	g := &guest{t: t, fd: fd, mem: m, next: regBBase + 0x40000}
	base := uint64(addrOf(m))
	for _, r := range layout {
		r.UserAddr = base + r.MmapOffset
		g.regions = append(g.regions, r)
	}
	t.Cleanup(func() { unix.Munmap(m); unix.Close(fd) })
	return g
}

// measuredLayout is QEMU 7.2's two regions of one memfd for a pc machine.
func measuredLayout() []vuproto.MemRegion {
	return []vuproto.MemRegion{{GPA: 0, Size: regAEnd, MmapOffset: 0},
		{GPA: regBBase, Size: memSize - regBBase, MmapOffset: regBBase}}
}

// at returns the front-end's view of guest-physical [a, a+n).
func (g *guest) at(a uint64, n int) []byte {
	for _, r := range g.regions {
		if a >= r.GPA && a+uint64(n) <= r.GPA+r.Size {
			o := r.MmapOffset + a - r.GPA
			return g.mem[o : o+uint64(n)]
		}
	}
	g.t.Fatalf("guest address %#x+%d unmapped", a, n)
	return nil
}

func (g *guest) qva(a uint64) uint64 {
	for _, r := range g.regions {
		if a >= r.GPA && a < r.GPA+r.Size {
			return r.UserAddr + a - r.GPA
		}
	}
	g.t.Fatalf("no qva for %#x", a)
	return 0
}

func (g *guest) alloc(n int, align uint64) uint64 {
	g.next = (g.next + align - 1) &^ (align - 1)
	a := g.next
	g.next += uint64(n)
	if g.next > memSize {
		g.t.Fatal("guest RAM exhausted")
	}
	return a
}

// gring is a split ring as the guest driver keeps it.
type gring struct {
	g                    *guest
	idx, num             int
	descA, availA, usedA uint64
	desc, avail, used    []byte
	kick, call, errfd    int
	availIdx, usedSeen   uint16
	free                 []uint16
	chainDescs           map[uint16][]uint16
	eventIdx             bool
}

func newGring(g *guest, idx, num int) *gring {
	r := &gring{g: g, idx: idx, num: num, chainDescs: map[uint16][]uint16{}}
	r.descA = g.alloc(16*num, 4096)
	r.availA = g.alloc(6+2*num, 4)
	r.usedA = g.alloc(6+8*num, 4096)
	r.desc, r.avail, r.used = g.at(r.descA, 16*num), g.at(r.availA, 6+2*num), g.at(r.usedA, 6+8*num)
	for i := num - 1; i >= 0; i-- {
		r.free = append(r.free, uint16(i))
	}
	var err error
	// QEMU event_notifier_init(…, 1): the kick starts signalled, EFD_NONBLOCK.
	if r.kick, err = unix.Eventfd(1, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		g.t.Fatal(err)
	}
	if r.call, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		g.t.Fatal(err)
	}
	if r.errfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { unix.Close(r.kick); unix.Close(r.call); unix.Close(r.errfd) })
	return r
}

type seg struct {
	gpa   uint64
	n     int
	write bool
}

func putDesc(d []byte, addr uint64, n uint32, flags, next uint16) {
	binary.LittleEndian.PutUint64(d, addr)
	binary.LittleEndian.PutUint32(d[8:], n)
	binary.LittleEndian.PutUint16(d[12:], flags)
	binary.LittleEndian.PutUint16(d[14:], next)
}

// addChain writes segs as a chain of direct descriptors and returns its head (not yet
// made available).
func (r *gring) addChain(segs []seg) uint16 {
	if len(segs) > len(r.free) {
		r.g.t.Fatalf("ring %d: %d free descriptors, need %d", r.idx, len(r.free), len(segs))
	}
	ids := make([]uint16, len(segs))
	for i := range segs {
		ids[i] = r.free[len(r.free)-1]
		r.free = r.free[:len(r.free)-1]
	}
	for i, s := range segs {
		var fl, next uint16
		if s.write {
			fl |= descFWrite
		}
		if i+1 < len(segs) {
			fl |= descFNext
			next = ids[i+1]
		}
		putDesc(r.desc[16*int(ids[i]):], s.gpa, uint32(s.n), fl, next)
	}
	r.chainDescs[ids[0]] = ids
	return ids[0]
}

// addIndirect writes segs into an indirect table referenced by one head descriptor.
func (r *gring) addIndirect(segs []seg) uint16 {
	ta := r.g.alloc(16*len(segs), 16)
	t := r.g.at(ta, 16*len(segs))
	for i, s := range segs {
		var fl uint16
		if s.write {
			fl |= descFWrite
		}
		next := uint16(0)
		if i+1 < len(segs) {
			fl |= descFNext
			next = uint16(i + 1)
		}
		putDesc(t[16*i:], s.gpa, uint32(s.n), fl, next)
	}
	id := r.free[len(r.free)-1]
	r.free = r.free[:len(r.free)-1]
	putDesc(r.desc[16*int(id):], ta, uint32(16*len(segs)), descFIndirect, 0)
	r.chainDescs[id] = []uint16{id}
	return id
}

// publish makes heads available: ring entries first, then avail->idx (virtio spec
// "Updating idx": the driver writes the ring, a barrier, then idx).
func (r *gring) publish(heads ...uint16) {
	for _, h := range heads {
		binary.LittleEndian.PutUint16(r.avail[4+2*(int(r.availIdx)%r.num):], h)
		r.availIdx++
	}
	w := load32(r.avail, 0)
	store32(r.avail, 0, uint32(r.availIdx)<<16|w&0xffff)
}

func (r *gring) setAvailFlags(f uint16) {
	w := load32(r.avail, 0)
	store32(r.avail, 0, w&0xffff0000|uint32(f))
}

func (r *gring) setUsedEvent(v uint16) { store16(r.avail, 4+2*r.num, v) }

func (r *gring) availEvent() uint16 { return load16(r.used, 4+8*r.num) }

type usedElem struct {
	id  uint16
	len uint32
}

// reap returns the used entries published since the last reap and frees their
// descriptors.
func (r *gring) reap() []usedElem {
	idx := uint16(load32(r.used, 0) >> 16)
	var out []usedElem
	for ; r.usedSeen != idx; r.usedSeen++ {
		e := r.used[4+8*(int(r.usedSeen)%r.num):]
		u := usedElem{uint16(binary.LittleEndian.Uint32(e)), binary.LittleEndian.Uint32(e[4:])}
		out = append(out, u)
		ids, ok := r.chainDescs[u.id]
		if !ok {
			r.g.t.Fatalf("ring %d: used id %d is not an outstanding head", r.idx, u.id)
		}
		delete(r.chainDescs, u.id)
		r.free = append(r.free, ids...)
	}
	return out
}

// calls reads and clears the call eventfd; it reports whether it was signalled.
func readEventfd(fd int) bool {
	var b [8]byte
	n, err := unix.Read(fd, b[:])
	return err == nil && n == 8
}

func kickEventfd(fd int) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], 1)
	unix.Write(fd, b[:])
}

// frontend plays QEMU's side of the socket.
type frontend struct {
	t  testing.TB
	fd int
}

func (f *frontend) send(req, flags uint32, payload []byte, fds ...int) {
	b := make([]byte, vuproto.HeaderSize+len(payload))
	binary.LittleEndian.PutUint32(b, req)
	binary.LittleEndian.PutUint32(b[4:], flags)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	copy(b[vuproto.HeaderSize:], payload)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(f.fd, b, oob, nil, 0); err != nil {
		f.t.Fatalf("sendmsg %d: %v", req, err)
	}
}

// reply reads one reply and checks it the way QEMU 7.2 does (vhost_user_read_header:
// flags exactly 0x5; vhost_user_read: same request, exact size).
func (f *frontend) reply(req uint32, size int) []byte {
	var h [vuproto.HeaderSize]byte
	f.readFull(h[:])
	if r := binary.LittleEndian.Uint32(h[:]); r != req {
		f.t.Fatalf("reply to %d has request %d", req, r)
	}
	if fl := binary.LittleEndian.Uint32(h[4:]); fl != vuproto.ReplyFlags {
		f.t.Fatalf("reply flags %#x instead of %#x", fl, vuproto.ReplyFlags)
	}
	n := int(binary.LittleEndian.Uint32(h[8:]))
	if n != size {
		f.t.Fatalf("reply to %d size %d, want %d", req, n, size)
	}
	p := make([]byte, n)
	f.readFull(p)
	return p
}

func (f *frontend) readFull(b []byte) {
	for got := 0; got < len(b); {
		n, err := unix.Read(f.fd, b[got:])
		if err != nil || n == 0 {
			f.t.Fatalf("read reply: n=%d err=%v", n, err)
		}
		got += n
	}
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func state(i, n uint32) []byte {
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, i), n)
}

func (f *frontend) get(req uint32) uint64 {
	f.send(req, vuproto.FlagVersion, nil)
	return binary.LittleEndian.Uint64(f.reply(req, 8))
}

// ack sends with NEED_REPLY and returns the REPLY_ACK value.
func (f *frontend) ack(req uint32, payload []byte, fds ...int) uint64 {
	f.send(req, vuproto.FlagVersion|vuproto.FlagNeedReply, payload, fds...)
	return binary.LittleEndian.Uint64(f.reply(req, 8))
}

func memTablePayload(regs []vuproto.MemRegion) []byte {
	p := binary.LittleEndian.AppendUint32(nil, uint32(len(regs)))
	p = binary.LittleEndian.AppendUint32(p, 0)
	for _, r := range regs {
		for _, v := range []uint64{r.GPA, r.Size, r.UserAddr, r.MmapOffset} {
			p = binary.LittleEndian.AppendUint64(p, v)
		}
	}
	return p
}

func addrPayload(r *gring) []byte {
	p := binary.LittleEndian.AppendUint32(nil, uint32(r.idx))
	p = binary.LittleEndian.AppendUint32(p, 0)
	for _, v := range []uint64{r.g.qva(r.descA), r.g.qva(r.usedA), r.g.qva(r.availA), r.usedA} {
		p = binary.LittleEndian.AppendUint64(p, v)
	}
	return p
}

// recorder is a Handler that logs what the session reports.
type recorder struct {
	mu      sync.Mutex
	feats   []Features
	started chan *Vring
	stopped []int
	unknown []uint32
	enables []vuproto.VringState // SET_VRING_ENABLE as reported: ring index, 0 or 1
	mtu     int
	ended   chan error
	onStop  func(*Vring)
	onStart func(*Vring)
}

func newRecorder() *recorder {
	return &recorder{started: make(chan *Vring, 64), ended: make(chan error, 1)}
}

func (r *recorder) FeaturesAcked(f Features) {
	r.mu.Lock()
	r.feats = append(r.feats, f)
	r.mu.Unlock()
}
func (r *recorder) RingStarted(v *Vring) {
	if r.onStart != nil {
		r.onStart(v)
	}
	r.started <- v
}
func (r *recorder) RingStopped(v *Vring) {
	if r.onStop != nil {
		r.onStop(v)
	}
	r.mu.Lock()
	r.stopped = append(r.stopped, v.Index())
	r.mu.Unlock()
}
func (r *recorder) VringEnabled(v *Vring, on bool) {
	r.mu.Lock()
	r.enables = append(r.enables, vuproto.VringState{Index: uint32(v.Index()), Num: map[bool]uint32{true: 1}[on]})
	r.mu.Unlock()
}
func (r *recorder) SetMTU(m int) error { r.mu.Lock(); r.mtu = m; r.mu.Unlock(); return nil }
func (r *recorder) Unknown(req uint32, _ int) {
	r.mu.Lock()
	r.unknown = append(r.unknown, req)
	r.mu.Unlock()
}
func (r *recorder) SessionEnded(err error) { r.ended <- err }

// harness is one session: a Backend serving one end of a socketpair.
type harness struct {
	t     testing.TB
	b     *Backend
	fe    *frontend
	rec   *recorder
	g     *guest
	rings []*gring
	vr    []*Vring
	done  chan error
}

type opts struct {
	features uint64 // offered; 0 = featsDefault
	ack      uint64 // guest-acked virtio bits; 0 = everything offered
	pairs    int
	num      int
	layout   []vuproto.MemRegion
	stats    *Stats
	guest    *guest
	noEnable bool
	skipKick bool
	rec      *recorder // nil: a new one
	logf     func(string, ...any)
}

func startSession(t testing.TB, o opts) *harness {
	if o.features == 0 {
		o.features = featsDefault
	}
	if o.pairs == 0 {
		o.pairs = 1
	}
	if o.num == 0 {
		o.num = 256
	}
	if o.layout == nil {
		o.layout = measuredLayout()
	}
	rec := o.rec
	if rec == nil {
		rec = newRecorder()
	}
	b, err := NewBackend(netConfig(Config{Features: o.features, NetMTU: true, Handler: rec, Stats: o.stats, Logf: o.logf}, o.pairs))
	if err != nil {
		t.Fatal(err)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	tv := unix.Timeval{Sec: 20}
	unix.SetsockoptTimeval(sp[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	file := os.NewFile(uintptr(sp[1]), "backend")
	c, err := net.FileConn(file)
	file.Close()
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, b: b, fe: &frontend{t, sp[0]}, rec: rec, done: make(chan error, 1)}
	go func() { h.done <- b.Serve(c.(*net.UnixConn)) }()
	t.Cleanup(func() {
		unix.Close(sp[0])
		select {
		case <-h.done:
		case <-time.After(10 * time.Second):
			t.Error("session did not end")
		}
	})
	h.g = o.guest
	if h.g == nil {
		h.g = newGuest(t, o.layout)
	}
	fe := h.fe
	nrings := 2 * o.pairs
	for i := 0; i < nrings; i++ {
		h.rings = append(h.rings, newGring(h.g, i, o.num))
	}

	// Step 1, connect (vhost_user_backend_init, vhost_dev_init). Each pair repeats its
	// feature queries; one-time requests come from pair 0 only.
	offered := fe.get(ReqGetFeatures)
	if offered&(1<<virtio.VhostUserProtocolFeatures) == 0 {
		t.Fatalf("GET_FEATURES %#x lacks bit 30", offered)
	}
	for pair := 0; pair < o.pairs; pair++ {
		if pair > 0 {
			fe.get(ReqGetFeatures)
		}
		proto := fe.get(ReqGetProtocolFeatures)
		// QEMU 7.2 keeps offered ∩ bits 0–16, minus F_CONFIG for net.
		fe.send(ReqSetProtocolFeatures, vuproto.FlagVersion, u64(proto&0x1ffff&^(1<<9)))
		if pair == 0 {
			if proto&(1<<vuproto.ProtoMQ) != 0 {
				if q := fe.get(ReqGetQueueNum); q != uint64(o.pairs) {
					t.Fatalf("GET_QUEUE_NUM %d, want %d", q, o.pairs)
				}
			}
			fe.send(ReqSetOwner, vuproto.FlagVersion, nil)
		}
		fe.get(ReqGetFeatures)
		for _, i := range []int{2 * pair, 2*pair + 1} {
			// QEMU's masked notifier, not the guest's: a throwaway eventfd.
			efd, _ := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
			fe.send(ReqSetVringCall, vuproto.FlagVersion, u64(uint64(i)), efd)
			unix.Close(efd)
			fe.send(ReqSetVringErr, vuproto.FlagVersion, u64(uint64(i)), h.rings[i].errfd)
		}
	}
	// Step 2, device reset and feature writes: enable repeated.
	if !o.noEnable {
		for rep := 0; rep < 2; rep++ {
			for i := 0; i < nrings; i++ {
				fe.send(ReqSetVringEnable, vuproto.FlagVersion, state(uint32(i), 1))
			}
		}
	}
	// Step 3, DRIVER_OK (vhost_net_start).
	ack := o.ack
	if ack == 0 {
		ack = offered &^ (1 << virtio.VhostUserProtocolFeatures)
	}
	ack &= offered
	if ack&(1<<virtio.NetMTU) != 0 {
		if r := fe.ack(ReqNetSetMTU, u64(1500)); r != 0 {
			t.Fatalf("NET_SET_MTU ack %d", r)
		}
	}
	if !o.noEnable {
		for i := 0; i < nrings; i++ {
			fe.send(ReqSetVringEnable, vuproto.FlagVersion, state(uint32(i), 1))
		}
	}
	fe.send(ReqSetFeatures, vuproto.FlagVersion, u64(ack|1<<virtio.VhostUserProtocolFeatures))
	// SET_MEM_TABLE: flags 0x9 always in 7.2, one fd per region (the same memfd).
	fds := make([]int, len(h.g.regions))
	for i := range fds {
		fds[i] = h.g.fd
	}
	if r := fe.ack(ReqSetMemTable, memTablePayload(h.g.regions), fds...); r != 0 {
		t.Fatalf("SET_MEM_TABLE ack %d", r)
	}
	for i, r := range h.rings {
		fe.send(ReqSetVringNum, vuproto.FlagVersion, state(uint32(i), uint32(o.num)))
		fe.send(ReqSetVringBase, vuproto.FlagVersion, state(uint32(i), 0))
		fe.send(ReqSetVringAddr, vuproto.FlagVersion, addrPayload(r))
		if o.skipKick {
			continue
		}
		fe.send(ReqSetVringKick, vuproto.FlagVersion, u64(uint64(i)), r.kick)
		fe.send(ReqSetVringCall, vuproto.FlagVersion, u64(uint64(i)), r.call)
	}
	// A GET_FEATURES round trip is QEMU's own sync barrier; after it every ring that
	// is going to start has started.
	fe.get(ReqGetFeatures)
	if !o.skipKick {
		h.vr = make([]*Vring, nrings)
		for range h.rings {
			select {
			case v := <-rec.started:
				h.vr[v.Index()] = v
			case <-time.After(5 * time.Second):
				t.Fatal("ring did not start")
			}
		}
	}
	return h
}

// stop is step 4: GET_VRING_BASE per ring; it returns the bases.
func (h *harness) stop() []uint32 {
	var out []uint32
	for i := range h.rings {
		h.fe.send(ReqGetVringBase, vuproto.FlagVersion, state(uint32(i), 0))
		p := h.fe.reply(ReqGetVringBase, 8)
		if binary.LittleEndian.Uint32(p) != uint32(i) {
			h.t.Fatalf("GET_VRING_BASE reply index %d", binary.LittleEndian.Uint32(p))
		}
		out = append(out, binary.LittleEndian.Uint32(p[4:]))
	}
	return out
}

// close ends the session from the front-end's side and returns Serve's result.
func (h *harness) close() error {
	unix.Shutdown(h.fe.fd, unix.SHUT_RDWR)
	select {
	case err := <-h.done:
		h.done <- err
		return err
	case <-time.After(10 * time.Second):
		h.t.Fatal("session did not end")
	}
	return nil
}

// batch runs fn inside Begin/End on v.
func batch(t testing.TB, v *Vring, fn func()) {
	if err := v.Begin(); err != nil {
		t.Fatalf("Begin: %v", err)
	}
	fn()
	v.End()
}

var errAny = errors.New("any")

// Accessors: the session goroutine writes the recorder; the socket ordering between
// them is invisible to the race detector, so reads take the lock too.
func (r *recorder) getFeats() []Features {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Features(nil), r.feats...)
}

func (r *recorder) getStopped() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.stopped...)
}

func (r *recorder) getUnknown() []uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint32(nil), r.unknown...)
}

func (r *recorder) getMTU() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mtu
}

// netConfig completes c as vhostnet configures its Backend for pairs queue pairs: two
// rings a pair, the even ones (RX) written by the device, the 10- or 12-byte virtio-net
// header on every chain, and MQ offered with more than one pair.
func netConfig(c Config, pairs int) Config {
	c.Rings, c.QueueNum = 2*pairs, pairs
	c.Writable = func(i int) bool { return i%2 == 0 }
	c.HeaderLen = func(acked uint64) int {
		if acked&(1<<virtio.Version1|1<<virtio.NetMrgRxbuf) != 0 {
			return 12
		}
		return 10
	}
	if pairs > 1 {
		c.Features |= 1 << virtio.NetMQ
	}
	return c
}
