package rxpool

import (
	"errors"
	"fmt"
	"time"

	"tapgro/port"
)

// Defaults. The buffer size and pool size were chosen with BenchmarkTapToPort and the
// integration benchmark (docs/receive-pool.md): a 1514-byte MTU frame fits one 2048-byte
// buffer (virtio-net's own mergeable buffers are of this order), and 2048 buffers (4 MiB)
// hold a whole 64-read TAP batch of 64 KB TSO frames split at MTU 1500 only in part, but
// every pool of 512 frames or more fills writev's 512-record limit, so a larger pool buys
// no fewer system calls, only more memory.
const (
	DefaultBufSize    = 2048
	DefaultBytes      = 4 << 20
	DefaultFlushDelay = 500 * time.Microsecond
)

// Limits on Config, checked by New (and by tapgro's flag parsing).
const (
	MinBufSize = 64
	MaxBufSize = 1 << 20
	MinBytes   = 128 << 10  // at least two MaxFrame frames
	MaxBytes   = 1024 << 20 // 1 GiB: a typo guard, not a design limit
	// MaxBuffers bounds Bytes/BufSize: every buffer has a descriptor and a HeadSlot
	// beside it (~48 MiB at the bound), and a pool of more than 512 frames already
	// fills one writev (port.BatchSender), so more buffers buy memory, not batching.
	MaxBuffers = 1 << 18
	MaxDelay   = time.Second
)

// Clock is the pool's time source. Tests inject a fake one so that the flush delay is
// deterministic; Sleep is only called while the port is recovering from a stall.
type Clock interface {
	Now() time.Time
	Sleep(d time.Duration)
}

type realClock struct{}

func (realClock) Now() time.Time        { return time.Now() }
func (realClock) Sleep(d time.Duration) { time.Sleep(d) }

// Sender is where a Pool delivers: the part of a port.VecSender it calls.
// TryWriteVecs returns port.ErrWouldBlock when the port is full.
type Sender interface {
	TryWriteVecs(frames []port.Vec) (n int, err error)
	WaitWritable(deadline time.Time) error
	Room() (free, size int)
}

var _ Sender = port.VecSender(nil)

// HeadSlot is the size of a record's header slot: port.VecHeadroom for the sender's
// framing, then up to HeadCap bytes of headers (a vnet header and a segment's Ethernet,
// VLAN, IP and TCP/UDP headers: 12 + 18 + 60 + 60 = 150 bytes for the largest IPv4
// ones). Every descriptor has its own slot, so headers never take ring buffers.
const (
	HeadSlot = 192
	HeadCap  = HeadSlot - port.VecHeadroom
)

// Config sizes a Pool. Zero fields take the defaults.
type Config struct {
	BufSize int // bytes per buffer (DefaultBufSize)
	Bytes   int // pool capacity; the buffer count is Bytes / BufSize (DefaultBytes)

	// FlushDelay is how long, after the port became writable again following a stall,
	// the pool waits for more room before flushing anyway (DefaultFlushDelay). Negative
	// means no delay.
	FlushDelay time.Duration

	// FlushThreshold (bytes) or FlushThresholdFrac (of the port's send buffer, in
	// (0, 1]) is the free room at which a recovering pool flushes without waiting out
	// the delay. Both zero means automatic: room for everything queued, but at most half
	// the send buffer.
	FlushThreshold     int
	FlushThresholdFrac float64

	// PerFrame makes Flush write one frame per TryWriteVecs with no delay, and tells
	// the caller to flush after every frame: the frame-per-write relay that the batching
	// is measured against (tapgro --rx-batch=off).
	PerFrame bool

	Clock Clock // nil means the real clock
}

// Validate checks a Config after defaults are applied, naming the numbers at fault.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.BufSize < MinBufSize || c.BufSize > MaxBufSize:
		return fmt.Errorf("rxpool: buffer size %d bytes: want %d..%d", c.BufSize, MinBufSize, MaxBufSize)
	case c.Bytes < MinBytes || c.Bytes > MaxBytes:
		return fmt.Errorf("rxpool: pool of %d bytes: want %d..%d", c.Bytes, MinBytes, MaxBytes)
	case c.Bytes/c.BufSize < 2:
		return fmt.Errorf("rxpool: pool of %d bytes holds %d buffers of %d: want at least 2", c.Bytes, c.Bytes/c.BufSize, c.BufSize)
	case c.Bytes/c.BufSize > MaxBuffers:
		return fmt.Errorf("rxpool: pool of %d bytes holds %d buffers of %d: want at most %d (larger buffers, or a smaller pool)", c.Bytes, c.Bytes/c.BufSize, c.BufSize, MaxBuffers)
	case c.FlushDelay > MaxDelay:
		return fmt.Errorf("rxpool: flush delay %v: want at most %v", c.FlushDelay, MaxDelay)
	case c.FlushThreshold < 0:
		return fmt.Errorf("rxpool: flush threshold %d bytes: want >= 0", c.FlushThreshold)
	case c.FlushThresholdFrac < 0 || c.FlushThresholdFrac > 1:
		return fmt.Errorf("rxpool: flush threshold fraction %v: want (0, 1]", c.FlushThresholdFrac)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.BufSize == 0 {
		c.BufSize = DefaultBufSize
	}
	if c.Bytes == 0 {
		c.Bytes = DefaultBytes
	}
	if c.FlushDelay == 0 {
		c.FlushDelay = DefaultFlushDelay
	}
	if c.FlushDelay < 0 || c.PerFrame {
		c.FlushDelay = 0
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return c
}

// desc describes one staged or reserved frame: a copy (Reserve), whose bytes are in
// ring buffers [buf, buf+nbuf), or a vector (ReserveVec), whose head bytes are in the
// descriptor's header slot and whose body is the caller's memory.
type desc struct {
	buf    int    // first buffer (copies)
	n      int    // frame length (the reserved maximum until committed)
	nbuf   int    // buffers from buf on that the frame holds (0 for a vector)
	skip   int    // buffers skipped at the slab's end before buf, freed with this frame
	charge int    // capacity in buffers the frame counts for: skip + NumBuffers(n)
	head   int    // vector: header bytes in the slot, after port.VecHeadroom
	body   []byte // the frame's bytes (copy: in the slab; vector: lent by the caller)
	vec    bool
}

// Pool stages frames in a ring of fixed-size buffers and delivers them to a Sender in
// batches. It is owned by one goroutine; only its Stats may be read by others.
type Pool struct {
	cfg   Config
	clock Clock
	bs    int
	count int
	slab  []byte

	// The buffer ring: buffers [tail-used, tail) (mod count) are held by copies, in
	// frame order. charged is the capacity held by every frame, copies and vectors
	// (charged >= used): a vector counts for the buffers its frame would span had it
	// been copied, so the pool bounds what it stages the same way whether or not it
	// copied it.
	tail, used int
	charged    int

	// hdrs holds each descriptor's header slot: descs[i] owns hdrs[i*HeadSlot:][:HeadSlot].
	hdrs []byte
	// borrowed counts committed vectors whose body is the caller's memory: the caller
	// must not reuse that memory while it is > 0 (Borrowing).
	borrowed int

	// The frame ring: descs[dHead:] holds dLen committed frames, then dRs reservations.
	descs            []desc
	dHead, dLen, dRs int
	queued           int // bytes committed and not yet released

	newFrames, newBytes int // staged since the last publish

	views []port.Vec // scratch for Staged
	stats *Stats
}

// New allocates a pool's whole memory at once. st may be nil for private counters.
func New(cfg Config, st *Stats) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if st == nil {
		st = new(Stats)
	}
	count := cfg.Bytes / cfg.BufSize
	p := &Pool{
		cfg:   cfg,
		clock: cfg.Clock,
		bs:    cfg.BufSize,
		count: count,
		slab:  make([]byte, count*cfg.BufSize),
		descs: make([]desc, count), // every frame counts for at least one buffer
		hdrs:  make([]byte, count*HeadSlot),
		views: make([]port.Vec, count),
		stats: st,
	}
	return p, nil
}

// Stats returns the pool's counters.
func (p *Pool) Stats() *Stats { return p.stats }

// BufSize is the size of one buffer.
func (p *Pool) BufSize() int { return p.bs }

// Buffers is the number of buffers.
func (p *Pool) Buffers() int { return p.count }

// InUse is the capacity, in buffers, that staged or reserved frames hold: a copy the
// buffers it spans, a vector those it would span (see Reserve and ReserveVec).
func (p *Pool) InUse() int { return p.charged }

// Borrowing reports whether a staged frame's body is memory the caller lent
// (CommitVec). The caller must not reuse lent memory until this is false: after a
// Flush that returned nil the pool is empty, and after a failed one Discard empties it.
func (p *Pool) Borrowing() bool { return p.borrowed > 0 }

// Queued returns the committed frames and their bytes not yet delivered.
func (p *Pool) Queued() (frames, bytes int) { return p.dLen, p.queued }

// PerFrame reports whether the pool runs as the frame-per-write baseline.
func (p *Pool) PerFrame() bool { return p.cfg.PerFrame }

// NumBuffers is how many buffers a frame of n bytes spans: virtio's num_buffers for a
// mergeable receive buffer of this pool's size (VIRTIO_NET_F_MRG_RXBUF, virtio spec
// "Setting Up Receive Buffers"; the caller includes any header it stages in n). A
// 65549-byte frame over 2048-byte buffers spans 33.
func (p *Pool) NumBuffers(n int) int { return max(1, (n+p.bs-1)/p.bs) }

// Fits reports whether frames of these sizes could be reserved together in an empty
// pool. A frame that does not fit can never be staged: the caller drops it (DropTooBig).
func (p *Pool) Fits(n, frames int) bool {
	return n > 0 && frames > 0 && p.NumBuffers(n) <= p.count && p.NumBuffers(n)*frames <= p.count
}

// Reserve claims room for one more frame of up to maxLen bytes after every frame already
// staged or reserved, in consecutive buffers so the frame is one contiguous slice. It
// returns false when the pool cannot take it now (flush, then try again; see Fits).
// Reservations are committed (Commit) or abandoned (Cancel) in order; several may be
// open at once, so a GSO frame's segments can be split straight into the pool.
func (p *Pool) Reserve(maxLen int) ([]byte, bool) {
	if maxLen <= 0 || p.dLen+p.dRs == p.count {
		return nil, false
	}
	if p.used == 0 {
		p.tail = 0 // an empty ring restarts at the front: nothing to skip
	}
	need := p.NumBuffers(maxLen)
	skip := 0
	if p.tail+need > p.count {
		skip = p.count - p.tail // keep the frame contiguous: leave the tail buffers empty
	}
	// The free buffers are [tail, tail+count-used); needing skip+need of them from tail
	// on is exactly the condition that the frame's buffers are free. Vectors hold
	// capacity but no buffers, and charged >= used, so the capacity test implies it.
	if p.charged+skip+need > p.count {
		return nil, false
	}
	start := (p.tail + skip) % p.count
	off := start * p.bs
	p.descs[(p.dHead+p.dLen+p.dRs)%p.count] = desc{buf: start, n: maxLen, nbuf: need, skip: skip, charge: skip + need,
		body: p.slab[off : off+maxLen : off+maxLen]}
	p.dRs++
	p.tail = (start + need) % p.count
	p.used += skip + need
	p.charged += skip + need
	if skip > 0 {
		p.stats.SkippedBuffers.Add(uint64(skip))
	}
	return p.slab[off : off+maxLen : off+maxLen], true
}

// ReserveVec claims, after every frame already staged or reserved, a frame of headLen
// bytes built in the pool followed by up to bodyMax bytes of the caller's memory, left
// where it is: a segment's headers before its payload in the TAP's read buffer, or a
// vnet header before a whole frame. It returns the header slot (headLen <= HeadCap
// bytes) or false when the pool cannot take the frame now. The frame counts for the
// buffers it would span if copied (NumBuffers(headLen+bodyMax)) but takes none, so
// staging is bounded exactly as for copies. Commit it with CommitVec, in order with
// any other open reservation.
func (p *Pool) ReserveVec(headLen, bodyMax int) ([]byte, bool) {
	if headLen < 0 || headLen > HeadCap || bodyMax < 0 || headLen+bodyMax <= 0 || p.dLen+p.dRs == p.count {
		return nil, false
	}
	need := p.NumBuffers(headLen + bodyMax)
	if p.charged+need > p.count {
		return nil, false
	}
	i := (p.dHead + p.dLen + p.dRs) % p.count
	p.descs[i] = desc{n: headLen + bodyMax, charge: need, head: headLen, vec: true}
	p.dRs++
	p.charged += need
	off := i*HeadSlot + port.VecHeadroom
	return p.hdrs[off : off+headLen : off+headLen], true
}

// CommitVec stages the oldest open reservation, which ReserveVec made, as its header
// slot followed by body (len(body) <= its bodyMax). The pool refers to body, never
// copies or writes it, until the frame is delivered or discarded: until then the
// caller keeps it unchanged (Borrowing).
func (p *Pool) CommitVec(body []byte) {
	if p.dRs == 0 {
		panic("rxpool: CommitVec without a reservation")
	}
	d := &p.descs[(p.dHead+p.dLen)%p.count]
	if !d.vec || d.head+len(body) > d.n || d.head+len(body) == 0 {
		panic(fmt.Sprintf("rxpool: CommitVec of %d body bytes to a reservation of %d (vector %t)", len(body), d.n, d.vec))
	}
	d.n = d.head + len(body)
	if need := p.NumBuffers(d.n); need < d.charge {
		p.charged -= d.charge - need
		d.charge = need
	}
	d.body = body
	if len(body) > 0 {
		p.borrowed++
	}
	p.dLen++
	p.dRs--
	p.queued += d.n
	p.newFrames++
	p.newBytes += d.n
}

// Commit stages the oldest open reservation as a frame of n bytes (n <= its maxLen).
// Buffers it reserved but does not need are returned when it is the newest reservation,
// and otherwise freed together with it.
func (p *Pool) Commit(n int) {
	if p.dRs == 0 {
		panic("rxpool: Commit without a reservation")
	}
	i := (p.dHead + p.dLen) % p.count
	d := &p.descs[i]
	if d.vec || n <= 0 || n > d.n {
		panic(fmt.Sprintf("rxpool: Commit(%d) of a %d-byte reservation (vector %t)", n, d.n, d.vec))
	}
	d.n = n
	d.body = d.body[:n:n]
	if p.dRs == 1 {
		if need := p.NumBuffers(n); need < d.nbuf {
			p.used -= d.nbuf - need
			p.charged -= d.nbuf - need
			p.tail = (d.buf + need) % p.count
			d.nbuf = need
			d.charge = d.skip + need
		}
	}
	p.dLen++
	p.dRs--
	p.queued += n
	p.newFrames++
	p.newBytes += n
}

// Cancel abandons every open reservation (a GSO frame that turned out malformed).
func (p *Pool) Cancel() {
	for p.dRs > 0 {
		d := &p.descs[(p.dHead+p.dLen+p.dRs-1)%p.count]
		p.charged -= d.charge
		if !d.vec {
			p.used -= d.skip + d.nbuf
			p.tail = (d.buf - d.skip + p.count) % p.count
		}
		d.body = nil
		p.dRs--
	}
}

// Staged returns the committed frames as Vecs, oldest first: a vector's header slot
// (after port.VecHeadroom) and lent body, a copy's bytes in the ring as the body. Each
// Head begins with the slot's port.VecHeadroom bytes, the sender's to overwrite. The
// slice and the views are valid until the next Release, Discard or Reserve.
func (p *Pool) Staged() []port.Vec {
	v := p.views[:p.dLen]
	for k := range v {
		i := (p.dHead + k) % p.count
		d := &p.descs[i]
		off := i * HeadSlot
		end := off + port.VecHeadroom + d.head
		v[k] = port.Vec{Head: p.hdrs[off:end:end], Body: d.body}
	}
	return v
}

// Release frees the k oldest committed frames (they were delivered).
func (p *Pool) Release(k int) {
	if k < 0 || k > p.dLen {
		panic(fmt.Sprintf("rxpool: Release(%d) with %d frames staged", k, p.dLen))
	}
	for ; k > 0; k-- {
		d := &p.descs[p.dHead]
		p.used -= d.skip + d.nbuf
		p.charged -= d.charge
		if d.vec && len(d.body) > 0 {
			p.borrowed--
		}
		d.body = nil // the caller's memory is its own again
		p.queued -= d.n
		p.dHead = (p.dHead + 1) % p.count
		p.dLen--
	}
	p.stats.InUse.Store(int64(p.charged))
}

// Discard drops every committed frame, counting them under why (the port failed).
func (p *Pool) Discard(why Drop) {
	p.publish()
	if p.dLen > 0 {
		p.stats.Drops[why].Add(uint64(p.dLen))
		p.Release(p.dLen)
	}
}

// publish brings the shared counters up to date. Staging only touches plain fields
// (atomic adds per frame cost ~10% of BenchmarkTapToPort); the pool publishes when it
// flushes, when it is fullest, so the gauges see the peak.
func (p *Pool) publish() {
	if p.newFrames > 0 {
		p.stats.FramesStaged.Add(uint64(p.newFrames))
		p.stats.BytesStaged.Add(uint64(p.newBytes))
		p.newFrames, p.newBytes = 0, 0
	}
	u := int64(p.charged)
	p.stats.InUse.Store(u)
	if u > p.stats.MaxInUse.Load() {
		p.stats.MaxInUse.Store(u)
	}
}

// Flush delivers every committed frame to s, in order, with as few TryWriteVecs calls
// as the port allows, and returns what was delivered. r is why the caller flushes.
//
// When the port answers ErrWouldBlock, Flush waits in the port's netpoller for
// writability (no CPU while the peer is stalled), then for up to FlushDelay more until
// the port's free room reaches the threshold, and then sends everything queued in one go
// (the delayed flush of QEMU hw/net/spapr_llan.c h_add_logical_lan_buffer). Flush returns
// only when the pool is empty or the port failed; on failure the undelivered frames stay
// staged for the caller to Discard. Open reservations must have been committed or
// cancelled.
func (p *Pool) Flush(s Sender, r Reason) (frames, bytes int, err error) {
	if p.dRs > 0 {
		panic("rxpool: Flush with open reservations")
	}
	p.publish()
	if p.dLen == 0 {
		return 0, 0, nil
	}
	p.stats.Flushes[r].Add(1)
	for p.dLen > 0 {
		v := p.Staged()
		if p.cfg.PerFrame {
			v = v[:1] // the baseline relay: one frame per write
		}
		t0 := p.clock.Now()
		n, werr := s.TryWriteVecs(v)
		p.stats.Writes.Add(1)
		if n > 0 {
			b := 0
			for i := range v[:n] {
				b += v[i].Len()
			}
			p.stats.Batches.Add(1)
			p.stats.BatchFrames[batchBucket(n)].Add(1)
			p.stats.FramesSent.Add(uint64(n))
			p.stats.BytesSent.Add(uint64(b))
			frames += n
			bytes += b
			clear(v) // do not keep views of buffers about to be reused
			p.Release(n)
		}
		switch {
		case werr == nil && n == 0:
			return frames, bytes, errNoProgress
		case werr == nil:
		case errors.Is(werr, port.ErrWouldBlock):
			// A stream port that met a full socket mid-record waited in the
			// netpoller for the rest of that record: blocked time too.
			p.stats.BlockedNanos.Add(uint64(max(0, p.clock.Now().Sub(t0))))
			why, err := p.recover(s)
			if err != nil {
				return frames, bytes, err
			}
			p.stats.Flushes[why].Add(1)
		default:
			return frames, bytes, werr
		}
	}
	return frames, bytes, nil
}

var errNoProgress = errors.New("rxpool: sender took no frames and reported no error")

// recover waits out a stall: first for writability, then, for at most FlushDelay, for
// the threshold of free room, polling Room every FlushDelay/8 (the only timer, armed
// only while frames are queued after a stall).
func (p *Pool) recover(s Sender) (Reason, error) {
	p.stats.Stalls.Add(1)
	start := p.clock.Now()
	defer func() { p.stats.BlockedNanos.Add(uint64(max(0, p.clock.Now().Sub(start)))) }()
	if err := s.WaitWritable(time.Time{}); err != nil {
		return 0, err
	}
	deadline := p.clock.Now().Add(p.cfg.FlushDelay)
	for {
		free, size := s.Room()
		if free >= p.threshold(size) {
			return ReasonThreshold, nil
		}
		now := p.clock.Now()
		left := deadline.Sub(now)
		if left <= 0 {
			return ReasonDeadline, nil
		}
		p.clock.Sleep(min(left, max(p.cfg.FlushDelay/8, time.Microsecond)))
	}
}

// threshold is the free room at which a recovering pool flushes at once.
func (p *Pool) threshold(size int) int {
	switch {
	case p.cfg.FlushThreshold > 0:
		return p.cfg.FlushThreshold
	case p.cfg.FlushThresholdFrac > 0:
		return int(p.cfg.FlushThresholdFrac * float64(size))
	}
	// Everything queued with its stream prefix, but never more than half the buffer:
	// a pool larger than the socket must not wait out the whole delay every time.
	return min(p.queued+4*p.dLen, size/2)
}
