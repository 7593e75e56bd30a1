package netmapio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"tapgro/port"
	"tapgro/port/porttest"
	"testing"
)

// The in-process netmap model. A region is laid out byte for byte as netmap's memory
// allocator lays out one port (netmap sys/net/netmap.h, sys/dev/netmap/netmap_mem2.c): a
// netmap_if with ring_ofs[] relative to itself (NIC TX, host TX, NIC RX, host RX), 256-byte
// ring headers followed by 16-byte slots, and a pool of buffers addressed as
// ring + buf_ofs + idx*nr_buf_size, with buffers 0 and 1 reserved as netmap reserves them.
// The model then plays the kernel's part of txsync and rxsync, with the checks netmap's
// prologues make on head and cur. The port's ring code (nmCore, NetmapPort) runs against it
// unchanged: only the sync (and, for the port, the poll wake-up) is replaced.

type modelConfig struct {
	slots     int // per ring
	bufSize   int
	hostRings bool // lay out host rings too (the port uses the NIC rings)
	holdTX    bool // transmitted slots are freed only by releaseTX (a slow NIC), not at once (VALE)
	rxChunk   int  // at most this many slots delivered per rxsync (0: no limit), so chains can be cut
	loopback  bool // transmitted slots go straight into this port's own RX ring (no allocation)
}

type modelSlot struct {
	data  []byte
	flags uint16
}

type nmModel struct {
	t   testing.TB
	cfg modelConfig
	mu  *sync.Mutex // shared by linked models: one "switch lock"

	mem    []byte
	nifOff int
	tx, rx *nmRing

	txHwcur  uint32 // next TX slot to transmit
	rxHwcur  uint32 // first RX slot still owned by the user
	rxHwtail uint32

	inq  []modelSlot // slots waiting to enter the RX ring
	peer *nmModel    // VALE: transmitted packets go to peer.inq; otherwise to out

	frag   []byte // packet being gathered from TX slots
	nfrag  int
	out    [][]byte // packets transmitted (no peer)
	txLens [][]int  // per transmitted packet: its slot lengths
	txFlag [][]uint16

	kick func() // wakes the port's poll (eventfd in the port tests); nil in core tests

	// corrupt, when set, runs at the end of every sync: the tests' way of making the
	// other side misbehave.
	corrupt func(m *nmModel, dir int)

	violations       []string
	txSyncs, rxSyncs int
}

func align(n, a int) int { return (n + a - 1) / a * a }

func newModel(t testing.TB, cfg modelConfig) *nmModel {
	if cfg.slots == 0 {
		cfg.slots = 64
	}
	if cfg.bufSize == 0 {
		cfg.bufSize = 2048
	}
	m := &nmModel{t: t, cfg: cfg, mu: new(sync.Mutex)}
	n := cfg.slots
	nRings := 2
	if cfg.hostRings {
		nRings = 4
	}
	m.nifOff = 0x40 // not at 0: nr_offset is honoured
	ringSize := align(nmRingHdrSize+nmSlotSize*n, 4096)
	ring0 := align(m.nifOff+nmIfHdrSize+8*nRings, 4096)
	bufOff := ring0 + nRings*ringSize
	nbufs := 2 + nRings*n // 0 and 1 reserved
	m.mem = make([]byte, bufOff+nbufs*cfg.bufSize)
	le := binary.NativeEndian
	nif := m.mem[m.nifOff:]
	copy(nif, "model0")
	le.PutUint32(nif[16:], 14) // ni_version
	le.PutUint32(nif[nifTxRings:], 1)
	le.PutUint32(nif[nifRxRings:], 1)
	if cfg.hostRings {
		le.PutUint32(nif[nifHostTxRings:], 1)
		le.PutUint32(nif[nifHostRxRings:], 1)
	}
	next := 2
	for i := 0; i < nRings; i++ {
		off := ring0 + i*ringSize
		le.PutUint64(nif[nifRingOfs+8*i:], uint64(off-m.nifOff))
		h := m.mem[off:]
		le.PutUint64(h[ringBufOfs:], uint64(bufOff-off))
		le.PutUint32(h[ringNumSlots:], uint32(n))
		le.PutUint32(h[ringBufSize:], uint32(cfg.bufSize))
		dir := uint16(0)
		if i >= nRings/2 {
			dir = 1
		}
		le.PutUint16(h[16:], uint16(i%(nRings/2))) // ringid
		le.PutUint16(h[ringDir:], dir)
		for s := 0; s < n; s++ {
			le.PutUint32(h[nmRingHdrSize+nmSlotSize*s:], uint32(next))
			next++
		}
		if dir == 0 {
			le.PutUint32(h[ringTail:], uint32(n-1)) // every TX slot but one is free
		}
	}
	var err error
	txs, rxs, err := mapRings(m.mem, uint64(m.nifOff), 0, 1, 0, 1)
	if err != nil {
		t.Fatalf("model layout: %v", err)
	}
	m.tx, m.rx = txs[0], rxs[0]
	return m
}

// link makes a and b two ports of one VALE switch: each one's transmissions arrive at
// the other.
func link(a, b *nmModel) {
	b.mu = a.mu
	a.peer, b.peer = b, a
}

func (m *nmModel) violate(format string, args ...any) {
	m.violations = append(m.violations, fmt.Sprintf(format, args...))
}

func (m *nmModel) checkClean(t testing.TB) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, v := range m.violations {
		t.Errorf("kernel-side check failed: %s", v)
	}
}

// txsync is netmap's txsync: check head/cur like nm_txsync_prologue, transmit
// [hwcur, head), and (unless holdTX) free every transmitted slot at once as VALE does.
func (m *nmModel) txsync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.txSyncs++
	r := m.tx
	n := r.n
	head, cur, tail := r.loadHead(), r.loadCur(), r.loadTail()
	if head >= n || dist(m.txHwcur, head, n) > dist(m.txHwcur, tail, n) {
		m.violate("TX head %d outside [hwcur %d, tail %d]", head, m.txHwcur, tail)
		return errors.New("model: EINVAL")
	}
	if cur >= n || dist(head, cur, n) > dist(head, tail, n) {
		m.violate("TX cur %d outside [head %d, tail %d]", cur, head, tail)
		return errors.New("model: EINVAL")
	}
	var woke *nmModel
	for i := m.txHwcur; i != head; i = next(i, n) {
		idx, l, fl := r.slot(i)
		b := r.buf(idx)
		if b == nil || int(l) > len(b) {
			m.violate("TX slot %d: buf %d len %d", i, idx, l)
			continue
		}
		if m.cfg.loopback {
			if next(m.rxHwtail, n) == m.rxHwcur {
				m.violate("loopback: RX ring full")
				continue
			}
			ridx, _, _ := m.rx.slot(m.rxHwtail)
			copy(m.rx.buf(ridx), b[:l])
			m.rx.setSlot(m.rxHwtail, l, fl&nsMoreFrag)
			m.rxHwtail = next(m.rxHwtail, n)
			continue
		}
		if m.nfrag == 0 {
			m.txLens = append(m.txLens, nil)
			m.txFlag = append(m.txFlag, nil)
		}
		k := len(m.txLens) - 1
		m.txLens[k] = append(m.txLens[k], int(l))
		m.txFlag[k] = append(m.txFlag[k], fl)
		m.nfrag++
		if m.peer != nil {
			m.peer.inq = append(m.peer.inq, modelSlot{append([]byte(nil), b[:l]...), fl & nsMoreFrag})
			woke = m.peer
		}
		m.frag = append(m.frag, b[:l]...)
		if fl&nsMoreFrag == 0 {
			if m.peer == nil {
				m.out = append(m.out, m.frag)
			}
			m.frag, m.nfrag = nil, 0
		}
	}
	m.txHwcur = head
	if !m.cfg.holdTX {
		r.storeTail((head + n - 1) % n)
	}
	if m.corrupt != nil {
		m.corrupt(m, 0)
	}
	if woke != nil && woke.kick != nil {
		woke.kick()
	}
	return nil
}

// releaseTX completes k transmitted slots (holdTX mode): tail moves forward.
func (m *nmModel) releaseTX(k int) {
	m.mu.Lock()
	r := m.tx
	t := r.loadTail()
	for ; k > 0 && next(t, r.n) != m.txHwcur; k-- {
		t = next(t, r.n)
	}
	r.storeTail(t)
	kick := m.kick
	m.mu.Unlock()
	if kick != nil {
		kick()
	}
}

// rxsync is netmap's rxsync: check head/cur like nm_rxsync_prologue, take back
// [hwcur, head), then fill free slots from the input queue (one slot is always left
// empty, so the ring never looks empty when full).
func (m *nmModel) rxsync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rxSyncs++
	r := m.rx
	n := r.n
	head, cur := r.loadHead(), r.loadCur()
	if head >= n || dist(m.rxHwcur, head, n) > dist(m.rxHwcur, m.rxHwtail, n) {
		m.violate("RX head %d outside [hwcur %d, hwtail %d]", head, m.rxHwcur, m.rxHwtail)
		return errors.New("model: EINVAL")
	}
	if cur >= n || dist(head, cur, n) > dist(head, m.rxHwtail, n) {
		m.violate("RX cur %d outside [head %d, hwtail %d]", cur, head, m.rxHwtail)
		return errors.New("model: EINVAL")
	}
	m.rxHwcur = head
	moved := 0
	for len(m.inq) > 0 && next(m.rxHwtail, n) != m.rxHwcur && (m.cfg.rxChunk == 0 || moved < m.cfg.rxChunk) {
		s := m.inq[0]
		m.inq = m.inq[1:]
		idx, _, _ := r.slot(m.rxHwtail)
		b := r.buf(idx)
		copy(b, s.data)
		r.setSlot(m.rxHwtail, uint16(len(s.data)), s.flags)
		m.rxHwtail = next(m.rxHwtail, n)
		moved++
	}
	r.storeTail(m.rxHwtail)
	if m.corrupt != nil {
		m.corrupt(m, 1)
	}
	return nil
}

// inject queues a packet for the port to receive, split at the buffer size as VALE does.
func (m *nmModel) inject(frame []byte) {
	m.mu.Lock()
	for len(frame) > m.cfg.bufSize {
		m.inq = append(m.inq, modelSlot{frame[:m.cfg.bufSize], nsMoreFrag})
		frame = frame[m.cfg.bufSize:]
	}
	m.inq = append(m.inq, modelSlot{frame, 0})
	kick := m.kick
	m.mu.Unlock()
	if kick != nil {
		kick()
	}
}

// injectSlots queues raw slots (for chains the tests build by hand).
func (m *nmModel) injectSlots(s ...modelSlot) {
	m.mu.Lock()
	m.inq = append(m.inq, s...)
	kick := m.kick
	m.mu.Unlock()
	if kick != nil {
		kick()
	}
}

// modelSync adapts a model to nmSyncer.
type modelSync struct{ m *nmModel }

func (s modelSync) txsync() error { return s.m.txsync() }
func (s modelSync) rxsync() error { return s.m.rxsync() }

func (m *nmModel) core(t testing.TB, hdrLen int) (*nmCore, *port.Stats, *NetmapStats) {
	t.Helper()
	st, nst := new(port.Stats), new(NetmapStats)
	c, err := newCore([]*nmRing{m.tx}, []*nmRing{m.rx}, hdrLen, modelSync{m}, st, nst)
	if err != nil {
		t.Fatal(err)
	}
	return c, st, nst
}

// ---- helpers ----

// gsoFrame is a frame of n bytes with a recognisable vnet header of hdrLen bytes in front
// (the port does not interpret it; the test checks it arrives intact and in the first slot).
func gsoFrame(hdrLen, n int, tag byte) []byte {
	f := porttest.Frame(hdrLen+n, tag)
	for i := 0; i < hdrLen; i++ {
		f[i] = 0xA0 + byte(i)
	}
	return f
}

func readAll(t testing.TB, c *nmCore, want int) [][]byte {
	t.Helper()
	bufs, sizes := porttest.Buffers(16, port.MaxFrame+12)
	var got [][]byte
	for tries := 0; len(got) < want; tries++ {
		if tries > 10*want+10 {
			t.Fatalf("read %d of %d frames, then nothing more", len(got), want)
		}
		n, err := c.read(bufs, sizes)
		if err != nil {
			t.Fatalf("read after %d frames: %v", len(got), err)
		}
		for i := 0; i < n; i++ {
			got = append(got, append([]byte(nil), bufs[i][:sizes[i]]...))
		}
	}
	return got
}

func writeAll(t testing.TB, c *nmCore, frames [][]byte) {
	t.Helper()
	done := 0
	for tries := 0; done < len(frames); tries++ {
		if tries > 10*len(frames)+10 {
			t.Fatalf("wrote %d of %d frames, then no progress", done, len(frames))
		}
		n, err := c.write(frames[done:])
		done += n
		if err != nil && err != errNoRoom {
			t.Fatalf("write after %d frames: %v", done, err)
		}
	}
}

func sameFrames(t testing.TB, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d frames, want %d", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d: got %d bytes, want %d (content differs)", i, len(got[i]), len(want[i]))
		}
	}
}

// ---- tests ----

func TestNetmapModelLayout(t *testing.T) {
	m := newModel(t, modelConfig{slots: 32, hostRings: true})
	// With host rings laid out, NIC RX ring 0 is ring_ofs[2] and host TX ring is
	// ring_ofs[1]: check mapRings picks the right headers by their dir and position.
	tx, rx, err := mapRings(m.mem, uint64(m.nifOff), 0, 2, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(tx) != 2 || len(rx) != 2 || tx[0].off != m.tx.off || rx[0].off != m.rx.off {
		t.Fatalf("rings at %d/%d, want NIC TX %d RX %d", tx[0].off, rx[0].off, m.tx.off, m.rx.off)
	}
	if rx[1].off <= rx[0].off || tx[1].off <= tx[0].off || rx[0].off <= tx[1].off {
		t.Fatalf("ring order TX %d,%d RX %d,%d is not NIC TX, host TX, NIC RX, host RX", tx[0].off, tx[1].off, rx[0].off, rx[1].off)
	}
	if m.rx.n != 32 || m.rx.bufSize != 2048 {
		t.Fatalf("RX ring: %d slots of %d bytes", m.rx.n, m.rx.bufSize)
	}
	// Buffers 2.. are the model's; every slot's buffer must resolve inside the region.
	for i := uint32(0); i < m.rx.n; i++ {
		idx, _, _ := m.rx.slot(i)
		if m.rx.buf(idx) == nil {
			t.Fatalf("RX slot %d: buffer %d not resolvable", i, idx)
		}
	}
}

// TestNetmapBogusLayout applies each case's f to a fresh model region and checks
// mapRings refuses it.
func TestNetmapBogusLayout(t *testing.T) {
	le := binary.NativeEndian
	cases := []struct {
		name   string
		nifOff uint64
		f      func(m *nmModel)
	}{
		{"nif past region", 1 << 40, nil},
		{"ring_ofs outside", 0, func(m *nmModel) { le.PutUint64(m.mem[m.nifOff+nifRingOfs:], 1<<33) }},
		{"ring_ofs negative", 0, func(m *nmModel) { le.PutUint64(m.mem[m.nifOff+nifRingOfs:], uint64(1<<64-0x1000)) }},
		{"ring_ofs misaligned", 0, func(m *nmModel) {
			o := le.Uint64(m.mem[m.nifOff+nifRingOfs:])
			le.PutUint64(m.mem[m.nifOff+nifRingOfs:], o+2)
		}},
		{"ring count huge", 0, func(m *nmModel) { le.PutUint32(m.mem[m.nifOff+nifRxRings:], 1<<30) }},
		{"ring_ofs past region", 0, func(m *nmModel) { m.mem = m.mem[:m.nifOff+nifRingOfs+12] }},
		{"netmap_if cut short", 0, func(m *nmModel) { m.mem = m.mem[:m.nifOff+40] }},
		{"zero slots", 0, func(m *nmModel) { le.PutUint32(m.mem[m.tx.off+ringNumSlots:], 0) }},
		{"slots past region", 0, func(m *nmModel) { le.PutUint32(m.mem[m.rx.off+ringNumSlots:], nmMaxSlots) }},
		{"buffer size 0", 0, func(m *nmModel) { le.PutUint32(m.mem[m.tx.off+ringBufSize:], 0) }},
		{"buffer size huge", 0, func(m *nmModel) { le.PutUint32(m.mem[m.rx.off+ringBufSize:], 1<<31) }},
		{"buf_ofs outside", 0, func(m *nmModel) { le.PutUint64(m.mem[m.rx.off+ringBufOfs:], 1<<40) }},
		{"buf_ofs at end", 0, func(m *nmModel) {
			le.PutUint64(m.mem[m.rx.off+ringBufOfs:], uint64(len(m.mem)-m.rx.off))
		}},
		{"wrong dir", 0, func(m *nmModel) { le.PutUint16(m.mem[m.rx.off+ringDir:], 0) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newModel(t, modelConfig{slots: 16})
			off := uint64(m.nifOff)
			if tc.nifOff != 0 {
				off = tc.nifOff
			}
			if tc.f != nil {
				tc.f(m)
			}
			if _, _, err := mapRings(m.mem, off, 0, 1, 0, 1); err == nil {
				t.Fatal("bogus layout accepted")
			} else {
				t.Log(err)
			}
		})
	}
	// Asking for rings the netmap_if does not have is refused too.
	m := newModel(t, modelConfig{slots: 16})
	if _, _, err := mapRings(m.mem, uint64(m.nifOff), 0, 2, 0, 1); err == nil {
		t.Fatal("TX ring 1 of a one-ring port accepted")
	}
}

// TestNetmapValePair: two ports on one model switch exchange frames both ways, from a
// minimum frame to a 64 KiB GSO frame over 2048-byte buffers (33 slots), with every
// header length a VALE port can have.
func TestNetmapValePair(t *testing.T) {
	for _, hl := range []int{0, 10, 12} {
		t.Run(fmt.Sprintf("hdr%d", hl), func(t *testing.T) {
			a := newModel(t, modelConfig{slots: 256})
			b := newModel(t, modelConfig{slots: 256})
			link(a, b)
			ca, _, nsa := a.core(t, hl)
			cb, stb, nsb := b.core(t, hl)
			sizes := []int{port.MinFrame, 60, 1514, 2048 - hl, 2048 - hl + 1, 4096, 9000, 65536, port.MaxFrame}
			var frames [][]byte
			for i, n := range sizes {
				frames = append(frames, gsoFrame(hl, n, byte(i)))
			}
			writeAll(t, ca, frames)
			sameFrames(t, readAll(t, cb, len(frames)), frames)
			// The 64 KiB frame: 65536+hl bytes over 2048-byte buffers is 33 slots with a
			// header (32 without), MOREFRAG on all but the last, the header whole in the
			// first slot.
			k := 7
			lens, flags := a.txLens[k], a.txFlag[k]
			if want := (65536 + hl + 2047) / 2048; len(lens) != want {
				t.Fatalf("64 KiB frame took %d slots, want %d", len(lens), want)
			}
			for i, fl := range flags {
				if more := fl&nsMoreFrag != 0; more != (i < len(flags)-1) {
					t.Fatalf("slot %d of %d: MOREFRAG=%v", i, len(flags), more)
				}
				if i < len(flags)-1 && lens[i] != 2048 {
					t.Fatalf("slot %d of %d has %d bytes, want a full buffer", i, len(flags), lens[i])
				}
			}
			if lens[0] < hl {
				t.Fatalf("first slot %d bytes cannot hold the %d-byte header", lens[0], hl)
			}
			// And back.
			writeAll(t, cb, frames)
			sameFrames(t, readAll(t, ca, len(frames)), frames)
			if nsa.MultiOut.Load() == 0 || nsb.MultiIn.Load() == 0 {
				t.Fatalf("multi-slot counters: out %d in %d", nsa.MultiOut.Load(), nsb.MultiIn.Load())
			}
			if got := stb.FramesIn.Load(); got != uint64(len(frames)) {
				t.Fatalf("FramesIn %d, want %d", got, len(frames))
			}
			a.checkClean(t)
			b.checkClean(t)
		})
	}
}

// TestNetmapWrapAround pushes many frames of 1 to 5 slots through 8-slot rings, so
// head, cur and tail wrap many times, with chains that straddle the end of the ring.
func TestNetmapWrapAround(t *testing.T) {
	a := newModel(t, modelConfig{slots: 8, bufSize: 256})
	b := newModel(t, modelConfig{slots: 8, bufSize: 256})
	link(a, b)
	ca, _, _ := a.core(t, 12)
	cb, _, _ := b.core(t, 12)
	bufs, sizes := porttest.Buffers(4, port.MaxFrame+12)
	for i := 0; i < 300; i++ {
		f := gsoFrame(12, 50+(i*97)%(5*256-12-50), byte(i))
		n, err := ca.write([][]byte{f})
		if n != 1 || err != nil {
			t.Fatalf("frame %d: write %d, %v", i, n, err)
		}
		n, err = cb.read(bufs, sizes)
		if n != 1 || err != nil {
			t.Fatalf("frame %d: read %d, %v", i, n, err)
		}
		if !bytes.Equal(bufs[0][:sizes[0]], f) {
			t.Fatalf("frame %d (%d bytes) differs", i, len(f))
		}
	}
	if b.rxSyncs == 0 || a.txHwcur == 0 && b.rxHwtail == 0 {
		t.Fatal("rings did not move")
	}
	a.checkClean(t)
	b.checkClean(t)
}

// TestNetmapTxFull: a TX ring whose slots are not freed (a slow NIC) fills; write stops
// before the first frame that does not fit whole, nothing of that frame is published,
// and writing resumes once slots are released.
func TestNetmapTxFull(t *testing.T) {
	m := newModel(t, modelConfig{slots: 16, bufSize: 2048, holdTX: true})
	c, st, nst := m.core(t, 0)
	// 15 free slots: 3-slot frames fit five times, the sixth must wait.
	var frames [][]byte
	for i := 0; i < 8; i++ {
		frames = append(frames, porttest.Frame(5000, byte(i)))
	}
	n, err := c.write(frames)
	if n != 5 || err != errNoRoom {
		t.Fatalf("write = %d, %v; want 5, errNoRoom", n, err)
	}
	if len(m.out) != 5 || m.nfrag != 0 {
		t.Fatalf("kernel saw %d packets and %d slots of a partial one", len(m.out), m.nfrag)
	}
	if got := m.tx.loadHead(); got != 15 {
		t.Fatalf("published head %d, want 15 (nothing of frame 6)", got)
	}
	if nst.TxFull.Load() != 1 || st.FramesOut.Load() != 5 {
		t.Fatalf("TxFull %d FramesOut %d", nst.TxFull.Load(), st.FramesOut.Load())
	}
	if ok, err := c.writable(); ok || err != nil {
		t.Fatalf("writable = %v, %v on a full ring", ok, err)
	}
	if got, tail := m.tx.loadCur(), m.tx.loadTail(); got != tail {
		t.Fatalf("waiting for room: cur %d, want tail %d (so poll runs txsync)", got, tail)
	}
	m.releaseTX(2) // 2 free: still not enough for 3 slots
	if ok, _ := c.writable(); ok {
		t.Fatal("writable with 2 of 3 slots free")
	}
	m.releaseTX(100)
	if ok, err := c.writable(); !ok || err != nil {
		t.Fatalf("writable = %v, %v after release", ok, err)
	}
	n, err = c.write(frames[5:])
	if n != 3 || err != nil {
		t.Fatalf("write after release = %d, %v", n, err)
	}
	sameFrames(t, m.out, frames)
	if free, size := c.room(); size != 15*2048 || free > size {
		t.Fatalf("room %d of %d", free, size)
	}
	m.checkClean(t)
}

func TestNetmapTxRejects(t *testing.T) {
	m := newModel(t, modelConfig{slots: 8, bufSize: 1024})
	c, st, nst := m.core(t, 10)
	// 7 slots of 1 KiB: a 9000-byte frame needs 9 and can never be sent.
	big, ok := gsoFrame(10, 9000, 1), gsoFrame(10, 100, 2)
	n, err := c.write([][]byte{big, ok})
	if n != 2 || err != nil {
		t.Fatalf("write = %d, %v; want both handled", n, err)
	}
	if nst.TxTooBig.Load() != 1 || st.FramesOut.Load() != 1 || len(m.out) != 1 {
		t.Fatalf("TxTooBig %d FramesOut %d sent %d", nst.TxTooBig.Load(), st.FramesOut.Load(), len(m.out))
	}
	// Below the minimum (header + Ethernet header) or above the maximum: port.FrameError.
	for _, f := range [][]byte{make([]byte, 10+port.MinFrame-1), make([]byte, 10+port.MaxFrame+1)} {
		n, err := c.write([][]byte{ok, f, ok})
		var fe *port.FrameError
		if n != 1 || !errors.As(err, &fe) {
			t.Fatalf("write of %d-byte frame = %d, %v", len(f), n, err)
		}
	}
	if len(m.out) != 3 {
		t.Fatalf("%d frames sent, want the 3 good ones before each bad one", len(m.out))
	}
	m.checkClean(t)
}

// TestNetmapIncompleteChain: a NS_MOREFRAG chain cut at tail is not released (head
// stays at its start, cur runs ahead to tail) and is delivered once the rest arrives.
func TestNetmapIncompleteChain(t *testing.T) {
	m := newModel(t, modelConfig{slots: 64, bufSize: 2048, rxChunk: 2})
	c, _, nst := m.core(t, 12)
	small := gsoFrame(12, 100, 1)
	big := gsoFrame(12, 9000, 2) // 5 slots
	m.inject(small)
	m.inject(big)
	bufs, sizes := porttest.Buffers(8, port.MaxFrame+12)
	n, err := c.read(bufs, sizes) // sees small + 1 of big's 5 slots
	if n != 1 || err != nil || !bytes.Equal(bufs[0][:sizes[0]], small) {
		t.Fatalf("read = %d, %v", n, err)
	}
	if h, cur, tail := m.rx.loadHead(), m.rx.loadCur(), m.rx.loadTail(); h != 1 || cur != tail || tail != 2 {
		t.Fatalf("head %d cur %d tail %d; want head at the chain (1), cur = tail (2)", h, cur, tail)
	}
	if c.pending {
		t.Fatal("Pending with only an incomplete chain")
	}
	n, err = c.read(bufs, sizes) // 2 more slots: 3 of 5
	if n != 0 || err != nil {
		t.Fatalf("read with 3 of 5 slots = %d, %v", n, err)
	}
	if h := m.rx.loadHead(); h != 1 {
		t.Fatalf("incomplete chain released: head %d", h)
	}
	n, err = c.read(bufs, sizes)
	if n != 1 || err != nil || !bytes.Equal(bufs[0][:sizes[0]], big) {
		t.Fatalf("read of completed chain = %d, %v", n, err)
	}
	if nst.Partial.Load() != 2 || nst.MultiIn.Load() != 1 {
		t.Fatalf("Partial %d MultiIn %d", nst.Partial.Load(), nst.MultiIn.Load())
	}
	m.checkClean(t)
}

func TestNetmapPending(t *testing.T) {
	m := newModel(t, modelConfig{slots: 64})
	c, st, _ := m.core(t, 0)
	var want [][]byte
	for i := 0; i < 5; i++ {
		want = append(want, porttest.Frame(3000, byte(i)))
		m.inject(want[i])
	}
	bufs, sizes := porttest.Buffers(2, port.MaxFrame)
	var got [][]byte
	n, _ := c.read(bufs, sizes)
	for i := 0; i < n; i++ {
		got = append(got, append([]byte(nil), bufs[i][:sizes[i]]...))
	}
	syncs := st.ReadCalls.Load()
	for c.pending {
		n, err := c.read(bufs, sizes)
		if err != nil || n == 0 {
			t.Fatalf("Pending but read = %d, %v", n, err)
		}
		for i := 0; i < n; i++ {
			got = append(got, append([]byte(nil), bufs[i][:sizes[i]]...))
		}
	}
	if st.ReadCalls.Load() != syncs {
		t.Fatalf("reads of pending frames made %d syncs", st.ReadCalls.Load()-syncs)
	}
	sameFrames(t, got, want)
	m.checkClean(t)
}

// TestNetmapBogusRX: slots the other side filled with nonsense are dropped and counted,
// the frames around them still arrive, and nothing panics.
func TestNetmapBogusRX(t *testing.T) {
	good := porttest.Frame(200, 7)
	cases := []struct {
		name    string
		slots   []modelSlot
		fix     func(m *nmModel) // rewrites the slot just delivered
		counter func(*NetmapStats) uint64
	}{
		{"buf_idx past region", []modelSlot{{porttest.Frame(100, 1), 0}}, func(m *nmModel) {
			m.rx.setSlotBuf(1, 1<<30, 100, 0)
		}, func(s *NetmapStats) uint64 { return s.BadSlot.Load() }},
		{"buf_idx max", []modelSlot{{porttest.Frame(100, 1), 0}}, func(m *nmModel) {
			m.rx.setSlotBuf(1, ^uint32(0), 100, 0)
		}, func(s *NetmapStats) uint64 { return s.BadSlot.Load() }},
		{"len past buffer", []modelSlot{{porttest.Frame(100, 1), 0}}, func(m *nmModel) {
			m.rx.setSlotBuf(1, 3+64, 4000, 0)
		}, func(s *NetmapStats) uint64 { return s.BadSlot.Load() }},
		{"bad slot mid-chain", []modelSlot{{porttest.Frame(2048, 1), nsMoreFrag}, {porttest.Frame(2048, 2), nsMoreFrag}, {porttest.Frame(10, 3), 0}}, func(m *nmModel) {
			m.rx.setSlotBuf(2, 1<<20, 2048, nsMoreFrag)
		}, func(s *NetmapStats) uint64 { return s.BadSlot.Load() }},
		{"short frame", []modelSlot{{porttest.Frame(5, 1), 0}}, nil, func(s *NetmapStats) uint64 { return s.ShortFrame.Load() }},
		{"65 fragments", func() []modelSlot {
			var s []modelSlot
			for i := 0; i < 65; i++ {
				s = append(s, modelSlot{porttest.Frame(100, byte(i)), nsMoreFrag})
			}
			return append(s, modelSlot{porttest.Frame(100, 99), 0})
		}(), nil, func(s *NetmapStats) uint64 { return s.BadChain.Load() }},
		{"frame over port.MaxFrame", func() []modelSlot {
			var s []modelSlot
			for i := 0; i < 34; i++ {
				s = append(s, modelSlot{porttest.Frame(2048, byte(i)), nsMoreFrag})
			}
			return append(s, modelSlot{porttest.Frame(2048, 99), 0})
		}(), nil, func(s *NetmapStats) uint64 { return s.LongFrame.Load() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newModel(t, modelConfig{slots: 128})
			c, st, nst := m.core(t, 0)
			m.inject(good)
			m.injectSlots(tc.slots...)
			m.inject(good)
			if tc.fix != nil {
				m.corrupt = func(m *nmModel, dir int) {
					if dir == 1 && m.rxHwtail > 1 {
						tc.fix(m)
						m.corrupt = nil
					}
				}
			}
			got := readAll(t, c, 2)
			sameFrames(t, got, [][]byte{good, good})
			if tc.counter(nst) != 1 {
				t.Fatalf("counter = %d, want 1", tc.counter(nst))
			}
			if st.FramesIn.Load() != 2 {
				t.Fatalf("FramesIn %d", st.FramesIn.Load())
			}
			m.checkClean(t)
		})
	}
}

// TestNetmapBogusIndices: a tail out of range or moving backwards ends the port with a
// RingError; so does a TX slot whose buffer lies outside the region.
func TestNetmapBogusIndices(t *testing.T) {
	t.Run("rx tail out of range", func(t *testing.T) {
		m := newModel(t, modelConfig{slots: 16})
		c, _, nst := m.core(t, 0)
		m.corrupt = func(m *nmModel, dir int) { m.rx.storeTail(16) }
		bufs, sizes := porttest.Buffers(4, port.MaxFrame)
		_, err := c.read(bufs, sizes)
		var re *RingError
		if !errors.As(err, &re) || nst.BadRing.Load() != 1 {
			t.Fatalf("read = %v, BadRing %d", err, nst.BadRing.Load())
		}
		t.Log(err)
	})
	t.Run("rx tail backwards", func(t *testing.T) {
		m := newModel(t, modelConfig{slots: 16, rxChunk: 1})
		c, _, nst := m.core(t, 0)
		m.inject(porttest.Frame(3000, 1)) // 2 slots: the first read sees 1 and waits
		bufs, sizes := porttest.Buffers(4, port.MaxFrame)
		if n, err := c.read(bufs, sizes); n != 0 || err != nil {
			t.Fatalf("first read = %d, %v", n, err)
		}
		m.corrupt = func(m *nmModel, dir int) { m.rx.storeTail(0) }
		_, err := c.read(bufs, sizes)
		var re *RingError
		if !errors.As(err, &re) || nst.BadRing.Load() != 1 {
			t.Fatalf("read = %v, BadRing %d", err, nst.BadRing.Load())
		}
		t.Log(err)
	})
	t.Run("tx tail out of range", func(t *testing.T) {
		m := newModel(t, modelConfig{slots: 16})
		c, _, nst := m.core(t, 0)
		m.corrupt = func(m *nmModel, dir int) { m.tx.storeTail(1 << 31) }
		_, err := c.write([][]byte{porttest.Frame(100, 1)})
		var re *RingError
		if !errors.As(err, &re) || nst.BadRing.Load() != 1 {
			t.Fatalf("write = %v, BadRing %d", err, nst.BadRing.Load())
		}
	})
	t.Run("tx buf_idx", func(t *testing.T) {
		m := newModel(t, modelConfig{slots: 16})
		m.tx.setSlotBuf(0, 1<<30, 0, 0)
		c, _, nst := m.core(t, 0)
		_, err := c.write([][]byte{porttest.Frame(100, 1)})
		var re *RingError
		if !errors.As(err, &re) || nst.BadRing.Load() != 1 {
			t.Fatalf("write = %v, BadRing %d", err, nst.BadRing.Load())
		}
		t.Log(err)
	})
	t.Run("initial head out of range", func(t *testing.T) {
		m := newModel(t, modelConfig{slots: 16})
		binary.NativeEndian.PutUint32(m.mem[m.rx.off+ringHead:], 99)
		if _, err := newCore([]*nmRing{m.tx}, []*nmRing{m.rx}, 0, modelSync{m}, nil, nil); err == nil {
			t.Fatal("head 99 of 16 accepted")
		}
	})
}

// TestNetmapChainFillsRing: on a ring too small for the chain, a chain that fills the
// whole ring can never complete; it is dropped rather than waited for forever.
func TestNetmapChainFillsRing(t *testing.T) {
	m := newModel(t, modelConfig{slots: 8, bufSize: 64})
	c, _, nst := m.core(t, 0)
	var chain []modelSlot
	for i := 0; i < 12; i++ {
		chain = append(chain, modelSlot{porttest.Frame(64, byte(i)), nsMoreFrag})
	}
	chain = append(chain, modelSlot{porttest.Frame(20, 12), 0})
	good := porttest.Frame(60, 42)
	m.injectSlots(chain...)
	m.inject(good)
	sameFrames(t, readAll(t, c, 1), [][]byte{good})
	if nst.BadChain.Load() != 1 {
		t.Fatalf("BadChain %d", nst.BadChain.Load())
	}
	m.checkClean(t)
}

func TestNetmapDrain(t *testing.T) {
	m := newModel(t, modelConfig{slots: 16})
	c, _, nst := m.core(t, 12)
	m.inject(porttest.Frame(100, 1))
	m.inject(porttest.Frame(3000, 2))
	if err := c.drain(); err != nil {
		t.Fatal(err)
	}
	if nst.Stale.Load() != 2 {
		t.Fatalf("Stale %d", nst.Stale.Load())
	}
	f := gsoFrame(12, 100, 3)
	m.inject(f)
	sameFrames(t, readAll(t, c, 1), [][]byte{f})
	m.checkClean(t)
}

// loopRound writes frames and reads them back through a loopback model.
func loopRound(tb testing.TB, c *nmCore, frames, bufs [][]byte, sizes []int) {
	if n, err := c.write(frames); n != len(frames) || err != nil {
		tb.Fatalf("write = %d, %v", n, err)
	}
	for got := 0; got < len(frames); {
		n, err := c.read(bufs, sizes)
		if err != nil || n == 0 {
			tb.Fatalf("read = %d, %v after %d frames", n, err, got)
		}
		got += n
	}
}

// TestNetmapAllocs: the ring code allocates nothing per batch, in either direction.
func TestNetmapAllocs(t *testing.T) {
	m := newModel(t, modelConfig{slots: 256, loopback: true})
	c, _, _ := m.core(t, 12)
	frames := [][]byte{gsoFrame(12, 1500, 1), gsoFrame(12, 65000, 2), gsoFrame(12, 60, 3)}
	bufs, sizes := porttest.Buffers(8, port.MaxFrame+12)
	loopRound(t, c, frames, bufs, sizes)
	if allocs := testing.AllocsPerRun(100, func() { loopRound(t, c, frames, bufs, sizes) }); allocs != 0 {
		t.Fatalf("%.1f allocations per write+read round, want 0", allocs)
	}
	m.checkClean(t)
}

func BenchmarkNetmapCore(b *testing.B) {
	for _, sz := range []int{1514, 65536} {
		b.Run(fmt.Sprint(sz), func(b *testing.B) {
			m := newModel(b, modelConfig{slots: 1024, loopback: true})
			c, _, _ := m.core(b, 12)
			f := gsoFrame(12, sz, 1)
			frames := [][]byte{f, f, f, f, f, f, f, f}
			bufs, sizes := porttest.Buffers(8, port.MaxFrame+12)
			b.ReportAllocs()
			b.SetBytes(int64(len(f) * len(frames)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				loopRound(b, c, frames, bufs, sizes)
			}
		})
	}
}

// FuzzNetmapRX feeds the receive path arbitrary ring contents: slot fields, tail and the
// ring header's constants, as a hostile or broken other side could leave them.
func FuzzNetmapRX(f *testing.F) {
	f.Add([]byte{0}, uint32(0), uint8(16), uint16(2048))
	f.Add(bytes.Repeat([]byte{0x02, 0, 0, 0, 0x00, 0x08, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 16), uint32(15), uint8(16), uint16(2048))
	f.Add(bytes.Repeat([]byte{0xff}, 256), uint32(7), uint8(8), uint16(64))
	f.Add(bytes.Repeat([]byte{0x05, 0, 0, 0, 0x40, 0, 0, 0}, 64), uint32(3), uint8(32), uint16(128))
	f.Fuzz(func(t *testing.T, slots []byte, tail uint32, nslots uint8, bufSize uint16) {
		n := int(nslots%64) + 2
		bs := int(bufSize%4096) + 64
		m := newModel(t, modelConfig{slots: n, bufSize: bs})
		c, _, _ := m.core(t, 12)
		// Overwrite the slot array with the fuzz input, then publish tail as the kernel would.
		raw := m.mem[m.rx.off+nmRingHdrSize : m.rx.off+nmRingHdrSize+n*nmSlotSize]
		copy(raw, slots)
		m.corrupt = func(m *nmModel, dir int) {
			if dir == 1 {
				m.rx.storeTail(tail)
			}
		}
		bufs, sizes := porttest.Buffers(4, port.MaxFrame+12)
		for i := 0; i < 4; i++ {
			k, err := c.read(bufs, sizes)
			if err != nil {
				return
			}
			for j := 0; j < k; j++ {
				if sizes[j] < port.MinFrame+12 || sizes[j] > port.MaxFrame+12 {
					t.Fatalf("frame of %d bytes delivered", sizes[j])
				}
			}
		}
	})
}

// FuzzNetmapLayout feeds mapRings and newCore an arbitrary region: netmap_if, ring_ofs,
// ring headers and slots all come from the input.
func FuzzNetmapLayout(f *testing.F) {
	m := newModel(f, modelConfig{slots: 8, bufSize: 64, hostRings: true})
	f.Add(m.mem[:min(len(m.mem), 16384)], uint16(m.nifOff))
	f.Add(make([]byte, 512), uint16(0))
	f.Fuzz(func(t *testing.T, region []byte, nifOff uint16) {
		mem := make([]byte, len(region)) // a fresh, 8-aligned allocation like a mapping
		copy(mem, region)
		tx, rx, err := mapRings(mem, uint64(nifOff), 0, 1, 0, 1)
		if err != nil {
			return
		}
		c, err := newCore(tx, rx, 12, nopSync{}, nil, nil)
		if err != nil {
			return
		}
		bufs, sizes := porttest.Buffers(2, port.MaxFrame+12)
		c.read(bufs, sizes)
		c.write([][]byte{make([]byte, 100)})
	})
}

// nopSync is a kernel that never moves anything.
type nopSync struct{}

func (nopSync) txsync() error { return nil }
func (nopSync) rxsync() error { return nil }
