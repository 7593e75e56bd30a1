package netmapio

import (
	"errors"
	"fmt"
	"sync/atomic"
	"tapgro/port"
)

// Ring protocol constants (netmap sys/net/netmap.h).
const (
	nsMoreFrag = 0x20 // NS_MOREFRAG: the packet continues in the next slot
	nmMaxFrags = 64   // NETMAP_MAX_FRAGS: the most slots one packet may span
)

// NetmapStats counts what only a netmap port can see. Like Stats, one NetmapStats is
// shared by every port an Endpoint registers, so the totals survive re-registration.
type NetmapStats struct {
	RxSlots  atomic.Uint64 // RX slots consumed (a multi-slot frame counts each)
	TxSlots  atomic.Uint64 // TX slots filled
	MultiIn  atomic.Uint64 // frames received over more than one slot (NS_MOREFRAG)
	MultiOut atomic.Uint64 // frames sent over more than one slot
	Partial  atomic.Uint64 // reads that found a NS_MOREFRAG chain cut at tail and waited for the rest
	TxFull   atomic.Uint64 // times the TX ring had no room for the next whole frame

	BadSlot    atomic.Uint64 // RX frames dropped for a slot whose buf_idx or len lay outside the region or buffer
	BadChain   atomic.Uint64 // RX chains longer than 64 slots or filling the whole ring, dropped
	ShortFrame atomic.Uint64 // RX frames shorter than the vnet header + port.MinFrame, dropped
	LongFrame  atomic.Uint64 // RX frames longer than port.MaxFrame + vnet header or the caller's buffer, dropped
	TxTooBig   atomic.Uint64 // frames needing more slots than one packet may span on this ring, dropped
	BadRing    atomic.Uint64 // ring indices out of range or moving backwards, or a bad TX buf_idx; each ends the port
	Stale      atomic.Uint64 // frames discarded at registration: they arrived before the header length was set
}

// nmSyncer is the kernel's side of the rings: NIOCTXSYNC / NIOCRXSYNC on the real
// device, the in-process model in tests.
type nmSyncer interface {
	txsync() error
	rxsync() error
}

// errNoRoom: the TX ring cannot take the next whole frame now.
var errNoRoom = errors.New("netmap: TX ring full")

// RingError reports ring indices from shared memory that break the protocol (out of
// range, or tail moving backwards). The port cannot continue with such a ring: the
// caller closes it and the Endpoint registers the port afresh.
type RingError struct {
	Ring  string // "TX 0", "RX 1"
	What  string
	Value uint32
	Limit uint32
}

func (e *RingError) Error() string {
	return fmt.Sprintf("netmap: ring %s: %s %d (limit %d)", e.Ring, e.What, e.Value, e.Limit)
}

// rxRing is the reader's view of an RX ring: head and cur are ours (the copies in shared
// memory are only ever written from these), tail is the last value read and checked.
type rxRing struct {
	r          *nmRing
	name       string
	head, tail uint32
	skip       bool // dropping the rest of an over-long chain
}

type txRing struct {
	r    *nmRing
	name string
	w    uint32 // next slot to fill; head as published once flushed
	pub  uint32 // head last published
	tail uint32
}

// nmCore is the ring logic of a netmap port, independent of the OS: it runs unchanged
// against the real mmap and against the in-process model in the tests. It never waits;
// the caller does (netpoller on the real device). The reader half (rx, rxNext, pending)
// and the writer half (tx, txNeed) belong to different goroutines.
type nmCore struct {
	sync   nmSyncer
	hdrLen int
	st     *port.Stats
	nst    *NetmapStats

	rx      []rxRing
	rxNext  int
	pending bool

	tx     []txRing
	txNeed int // slots the frame that did not fit needs
}

func newCore(tx, rx []*nmRing, hdrLen int, sync nmSyncer, st *port.Stats, nst *NetmapStats) (*nmCore, error) {
	if len(tx) == 0 || len(rx) == 0 {
		return nil, fmt.Errorf("netmap: port has %d TX and %d RX rings, need at least one of each", len(tx), len(rx))
	}
	if st == nil {
		st = new(port.Stats)
	}
	if nst == nil {
		nst = new(NetmapStats)
	}
	c := &nmCore{sync: sync, hdrLen: hdrLen, st: st, nst: nst}
	for i, r := range rx {
		if r.bufSize < hdrLen {
			return nil, fmt.Errorf("netmap: RX ring %d has %d-byte buffers, smaller than the %d-byte vnet header", i, r.bufSize, hdrLen)
		}
		s := rxRing{r: r, name: fmt.Sprintf("RX %d", i), head: r.loadHead()}
		if s.head >= r.n {
			nst.BadRing.Add(1)
			return nil, &RingError{s.name, "head", s.head, r.n - 1}
		}
		if s.tail = r.loadTail(); s.tail >= r.n {
			nst.BadRing.Add(1)
			return nil, &RingError{s.name, "tail", s.tail, r.n - 1}
		}
		r.publish(s.head, s.head)
		c.rx = append(c.rx, s)
	}
	for i, r := range tx {
		if r.bufSize < hdrLen {
			return nil, fmt.Errorf("netmap: TX ring %d has %d-byte buffers, smaller than the %d-byte vnet header", i, r.bufSize, hdrLen)
		}
		s := txRing{r: r, name: fmt.Sprintf("TX %d", i), w: r.loadHead()}
		if s.w >= r.n {
			nst.BadRing.Add(1)
			return nil, &RingError{s.name, "head", s.w, r.n - 1}
		}
		if s.tail = r.loadTail(); s.tail >= r.n {
			nst.BadRing.Add(1)
			return nil, &RingError{s.name, "tail", s.tail, r.n - 1}
		}
		s.pub = s.w
		r.publish(s.w, s.w)
		c.tx = append(c.tx, s)
	}
	return c, nil
}

// dist is how many slots lie from a forward to b on a ring of n.
func dist(a, b, n uint32) uint32 {
	if b >= a {
		return b - a
	}
	return b + n - a
}

func next(i, n uint32) uint32 {
	if i+1 == n {
		return 0
	}
	return i + 1
}

// refreshTail reads tail after a sync and checks it: in range, and not behind the old
// tail as seen from head (the kernel only ever hands slots over, it never takes back
// slots it gave us).
func refreshTail(r *nmRing, name string, head, old uint32, nst *NetmapStats) (uint32, error) {
	t := r.loadTail()
	if t >= r.n {
		nst.BadRing.Add(1)
		return old, &RingError{name, "tail", t, r.n - 1}
	}
	if dist(head, t, r.n) < dist(head, old, r.n) {
		nst.BadRing.Add(1)
		return old, &RingError{name, "tail moved backwards to", t, old}
	}
	return t, nil
}

// ---- receive ----

// read returns the complete frames visible now, syncing once unless frames are already
// pending. It never waits: n == 0 with a nil error means "wait for POLLIN", and the
// rings' cur has been set to tail so that the kernel's poll wakes us for new slots.
func (c *nmCore) read(bufs [][]byte, sizes []int) (int, error) {
	want := min(len(bufs), len(sizes))
	if want == 0 {
		return 0, nil
	}
	n := 0
	if c.pending {
		n = c.scan(bufs[:want], sizes)
	}
	if n == 0 {
		c.st.ReadCalls.Add(1)
		if err := c.sync.rxsync(); err != nil {
			return 0, err
		}
		for i := range c.rx {
			s := &c.rx[i]
			t, err := refreshTail(s.r, s.name, s.head, s.tail, c.nst)
			if err != nil {
				return 0, err
			}
			s.tail = t
		}
		n = c.scan(bufs[:want], sizes)
	}
	return n, nil
}

// scan takes frames from the rings' visible slots, starting with a different ring each
// time so one busy ring cannot starve the others.
func (c *nmCore) scan(bufs [][]byte, sizes []int) int {
	n := 0
	for k := 0; k < len(c.rx) && n < len(bufs); k++ {
		s := &c.rx[(c.rxNext+k)%len(c.rx)]
		n += c.scanRing(s, bufs[n:], sizes[n:])
	}
	c.rxNext = (c.rxNext + 1) % len(c.rx)
	c.pending = false
	for i := range c.rx {
		if c.hasFrame(&c.rx[i]) {
			c.pending = true
			break
		}
	}
	if n > 0 {
		bytes := 0
		for _, l := range sizes[:n] {
			bytes += l
		}
		c.st.FramesIn.Add(uint64(n))
		c.st.BytesIn.Add(uint64(bytes))
	}
	return n
}

func (c *nmCore) scanRing(s *rxRing, bufs [][]byte, sizes []int) int {
	r := s.r
	n := 0
	i := s.head
	waiting := true // we stopped because nothing complete is left, not for lack of buffers
	for i != s.tail {
		if s.skip {
			_, _, fl := r.slot(i)
			i = next(i, r.n)
			c.nst.RxSlots.Add(1)
			if fl&nsMoreFrag == 0 {
				s.skip = false
			}
			continue
		}
		if n == len(bufs) {
			waiting = false
			break
		}
		end, size, ok := c.gather(s, i, bufs[n])
		if end == i {
			c.nst.Partial.Add(1)
			break // incomplete chain at tail: not released, cur runs ahead to wait
		}
		i = end
		if ok {
			sizes[n] = size
			n++
		}
	}
	s.head = i
	cur := i
	if waiting {
		cur = s.tail
	}
	r.publish(s.head, cur)
	return n
}

// gather copies the packet that starts at slot i into dst. It returns the slot after the
// packet and whether the packet was good; end == i means the chain is cut at tail and
// must wait. Bad packets are counted and consumed.
func (c *nmCore) gather(s *rxRing, i uint32, dst []byte) (end uint32, size int, ok bool) {
	r := s.r
	j := i
	total, frags := 0, 0
	bad := false
	for {
		if j == s.tail {
			if dist(i, s.tail, r.n) == r.n-1 {
				// The chain fills the whole ring: it can never complete. Drop what is
				// here and the rest of it as it arrives.
				c.nst.BadChain.Add(1)
				c.nst.RxSlots.Add(uint64(frags))
				s.skip = true
				return j, 0, false
			}
			return i, 0, false
		}
		idx, l, fl := r.slot(j)
		j = next(j, r.n)
		frags++
		b := r.buf(idx)
		if b == nil || int(l) > r.bufSize {
			bad = true
		} else if !bad && total+int(l) <= len(dst) {
			copy(dst[total:], b[:l])
		}
		total += int(l)
		if fl&nsMoreFrag == 0 {
			break
		}
		if frags == nmMaxFrags {
			c.nst.BadChain.Add(1)
			c.nst.RxSlots.Add(uint64(frags))
			s.skip = true
			return j, 0, false
		}
	}
	c.nst.RxSlots.Add(uint64(frags))
	switch {
	case bad:
		c.nst.BadSlot.Add(1)
	case total < port.MinFrame+c.hdrLen:
		c.nst.ShortFrame.Add(1)
	case total > port.MaxFrame+c.hdrLen || total > len(dst):
		c.nst.LongFrame.Add(1)
	default:
		if frags > 1 {
			c.nst.MultiIn.Add(1)
		}
		return j, total, true
	}
	return j, 0, false
}

// hasFrame reports whether a complete packet starts at the ring's head (Pending).
func (c *nmCore) hasFrame(s *rxRing) bool {
	r := s.r
	j := s.head
	for s.skip && j != s.tail { // the end of the chain being dropped is not a frame
		_, _, fl := r.slot(j)
		j = next(j, r.n)
		if fl&nsMoreFrag == 0 {
			break
		}
	}
	for k := 0; k < nmMaxFrags && j != s.tail; k++ {
		if _, _, fl := r.slot(j); fl&nsMoreFrag == 0 {
			return true
		}
		j = next(j, r.n)
	}
	return false
}

// drain releases every slot visible now without delivering it: frames that arrived
// before the port's header length was set carry the wrong header: VALE converts the header
// to the receiving port's length when it forwards a frame (netmap
// sys/dev/netmap/netmap_vale.c), not when we read it.
func (c *nmCore) drain() error {
	c.st.ReadCalls.Add(1)
	if err := c.sync.rxsync(); err != nil {
		return err
	}
	for i := range c.rx {
		s := &c.rx[i]
		t, err := refreshTail(s.r, s.name, s.head, s.tail, c.nst)
		if err != nil {
			return err
		}
		s.tail = t
		for j := s.head; j != t; j = next(j, s.r.n) {
			if _, _, fl := s.r.slot(j); fl&nsMoreFrag == 0 {
				c.nst.Stale.Add(1)
			}
		}
		s.head = t
		s.r.publish(t, t)
	}
	c.pending = false
	c.st.ReadCalls.Add(1)
	return c.sync.rxsync() // hand the slots back now
}

// ---- transmit ----

// slotsFor is how many slots a frame of l bytes takes on ring r. The vnet header (at
// most 12 bytes, buffers at least 64) always lies whole in the first slot, as VALE
// requires (netmap sys/dev/netmap/netmap_vale.c drops a packet whose header is split).
func slotsFor(l int, r *nmRing) int {
	if l == 0 {
		return 1
	}
	return (l + r.bufSize - 1) / r.bufSize
}

// maxSlots is the most slots one frame may take on r: netmap's fragment limit, and one
// slot less than the ring (a full ring keeps one slot empty).
func maxSlots(r *nmRing) int { return min(nmMaxFrags, int(r.n)-1) }

// write puts frames into TX ring 0 in order and syncs once at the end (and once in the
// middle if the ring fills). It returns how many frames were handled — sent, or dropped
// and counted for being too large for the ring — with errNoRoom when the next frame does
// not fit even after a sync; a frame is never written in part. A frame of invalid length
// stops the batch with a *FrameError. Only ring 0 is used: frames stay in order.
func (c *nmCore) write(frames [][]byte) (int, error) {
	s := &c.tx[0]
	r := s.r
	n, sent, bytes, synced := 0, 0, 0, false
	var err error
	for n < len(frames) {
		f := frames[n]
		if err = port.CheckFrameLen(uint64(len(f)), port.MinFrame+c.hdrLen, port.MaxFrame+c.hdrLen); err != nil {
			break
		}
		need := slotsFor(len(f), r)
		if need > maxSlots(r) {
			c.nst.TxTooBig.Add(1)
			n++
			continue
		}
		if need > int(dist(s.w, s.tail, r.n)) {
			if synced {
				c.nst.TxFull.Add(1)
				c.txNeed = need
				err = errNoRoom
				break
			}
			if err = c.flush(s); err != nil {
				break
			}
			synced = true
			continue
		}
		if err = c.put(s, f, need); err != nil {
			break
		}
		n++
		sent++
		bytes += len(f)
		synced = false
	}
	if s.w != s.pub {
		if ferr := c.flush(s); ferr != nil {
			return n, ferr
		}
	}
	c.st.FramesOut.Add(uint64(sent))
	c.st.BytesOut.Add(uint64(bytes))
	return n, err
}

// put copies f into need free slots from s.w on, NS_MOREFRAG on all but the last.
func (c *nmCore) put(s *txRing, f []byte, need int) error {
	r := s.r
	w := s.w
	for k := 0; k < need; k++ {
		idx, _, _ := r.slot(w)
		b := r.buf(idx)
		if b == nil {
			// The kernel owns TX buffer assignment; a bad index means the ring is not
			// ours to trust any more.
			c.nst.BadRing.Add(1)
			return &RingError{s.name, "buf_idx", idx, r.nbufs - 1}
		}
		l := copy(b, f)
		f = f[l:]
		var fl uint16
		if k < need-1 {
			fl = nsMoreFrag
		}
		r.setSlot(w, uint16(l), fl)
		w = next(w, r.n)
	}
	c.nst.TxSlots.Add(uint64(need))
	if need > 1 {
		c.nst.MultiOut.Add(1)
	}
	s.w = w
	return nil
}

// flush publishes the filled slots (head = cur), runs txsync and reads the new tail.
func (c *nmCore) flush(s *txRing) error {
	if s.w != s.pub {
		s.r.publish(s.w, s.w)
		s.pub = s.w
	}
	c.st.WriteCalls.Add(1)
	if err := c.sync.txsync(); err != nil {
		return err
	}
	t, err := refreshTail(s.r, s.name, s.w, s.tail, c.nst)
	if err != nil {
		return err
	}
	s.tail = t
	return nil
}

// writable syncs and reports whether the frame that last did not fit would fit now. When
// it would not, cur is set to tail: netmap's poll then runs txsync and reports POLLOUT
// once slots are freed (netmap sys/dev/netmap/netmap.c netmap_poll; QEMU's net/netmap.c
// waits the same way).
func (c *nmCore) writable() (bool, error) {
	s := &c.tx[0]
	if err := c.flush(s); err != nil {
		return false, err
	}
	if int(dist(s.w, s.tail, s.r.n)) >= max(c.txNeed, 1) {
		c.txNeed = 0
		return true, nil
	}
	s.r.publish(s.w, s.tail)
	return false, nil
}

// room is the free TX space in bytes and the ring's capacity, as of the last sync.
func (c *nmCore) room() (free, size int) {
	s := &c.tx[0]
	return int(dist(s.w, s.tail, s.r.n)) * s.r.bufSize, int(s.r.n-1) * s.r.bufSize
}
