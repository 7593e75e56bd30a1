package rxpool

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"tapgro/port"
)

// fakeClock only moves when the pool sleeps or a test says so.
type fakeClock struct {
	now    time.Time
	sleeps int
	onTick func() // called after every Sleep, e.g. to let the consumer free room
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1000, 0)} }

func (c *fakeClock) Now() time.Time { return c.now }
func (c *fakeClock) Sleep(d time.Duration) {
	c.now = c.now.Add(d)
	c.sleeps++
	if c.onTick != nil {
		c.onTick()
	}
}

// fakeSender takes at most accept frames per TryWriteBatch (all when accept < 0), then
// reports ErrWouldBlock; it keeps copies of what it took when keep is set.
type fakeSender struct {
	accept  func() int
	keep    bool
	got     [][]byte
	frames  int
	writes  int
	waits   int
	free    int // what Room reports
	size    int
	waitErr error
	clock   *fakeClock
	waitFor time.Duration // how long WaitWritable takes on the fake clock
}

// flat is the frame a Vec describes: its head after the headroom, then its body.
func flat(v port.Vec) []byte {
	return append(bytes.Clone(v.Head[port.VecHeadroom:]), v.Body...)
}

func (s *fakeSender) TryWriteVecs(frames []port.Vec) (int, error) {
	s.writes++
	n := len(frames)
	if s.accept != nil {
		if a := s.accept(); a >= 0 && a < n {
			n = a
		}
	}
	if s.keep {
		for _, f := range frames[:n] {
			if len(f.Head) < port.VecHeadroom {
				panic("a Vec without headroom")
			}
			s.got = append(s.got, flat(f))
		}
	}
	s.frames += n
	if n < len(frames) {
		return n, port.ErrWouldBlock
	}
	return n, nil
}

func (s *fakeSender) WaitWritable(time.Time) error {
	s.waits++
	if s.clock != nil {
		s.clock.now = s.clock.now.Add(s.waitFor)
	}
	return s.waitErr
}

func (s *fakeSender) Room() (int, int) { return s.free, s.size }

func newPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	p, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stage copies f into the pool and fails the test if it does not fit.
func stage(t testing.TB, p *Pool, f []byte) {
	t.Helper()
	buf, ok := p.Reserve(len(f))
	if !ok {
		t.Fatalf("Reserve(%d) failed with %d of %d buffers in use", len(f), p.InUse(), p.Buffers())
	}
	p.Commit(copy(buf, f))
}

// seqFrame is an n-byte frame carrying seq in its first 8 bytes and a pattern after.
func seqFrame(seq uint64, n int) []byte {
	f := make([]byte, n)
	binary.BigEndian.PutUint64(f, seq)
	for i := 8; i < n; i++ {
		f[i] = byte(seq) ^ byte(i)
	}
	return f
}

func TestMergeableSpan(t *testing.T) {
	p := newPool(t, Config{BufSize: 2048, Bytes: 4 << 20})
	if got := p.NumBuffers(65549); got != 33 {
		t.Fatalf("NumBuffers(65549) over 2048-byte buffers = %d, want 33", got)
	}
	for _, c := range []struct{ n, want int }{{1, 1}, {2048, 1}, {2049, 2}, {1514, 1}, {65536, 32}} {
		if got := p.NumBuffers(c.n); got != c.want {
			t.Errorf("NumBuffers(%d) = %d, want %d", c.n, got, c.want)
		}
	}
	stage(t, p, seqFrame(1, 65549))
	if p.InUse() != 33 {
		t.Fatalf("a 65549-byte frame holds %d buffers, want 33", p.InUse())
	}
	stage(t, p, seqFrame(2, 1514))
	if p.InUse() != 34 {
		t.Fatalf("InUse = %d after one more MTU frame, want 34", p.InUse())
	}
	v := p.Staged()
	if len(v) != 2 || v[0].Len() != 65549 || v[1].Len() != 1514 || !bytes.Equal(v[0].Body, seqFrame(1, 65549)) ||
		len(v[0].Head) != port.VecHeadroom {
		t.Fatalf("Staged: %d frames", len(v))
	}
	// The frame is one contiguous slice: the second starts 33 buffers after the first.
	if &v[1].Body[0] != &p.slab[33*2048] {
		t.Fatal("second frame does not start right after the first one's 33 buffers")
	}
}

// A frame that would run past the slab's end skips the tail buffers, which are freed
// with it; and a full pool refuses Reserve.
func TestWrapSkip(t *testing.T) {
	const bs = 16 << 10
	p := newPool(t, Config{BufSize: bs, Bytes: 8 * bs})                            // 8 buffers
	a, b, c := seqFrame(1, 2*bs+100), seqFrame(2, 2*bs+100), seqFrame(3, 2*bs+100) // 3 buffers each
	stage(t, p, a)
	stage(t, p, b)
	if _, ok := p.Reserve(2*bs + 100); ok {
		t.Fatal("Reserve of 3 buffers succeeded with 2 free")
	}
	if buf, ok := p.Reserve(bs); !ok { // 1 buffer still fits at 6, 7
		t.Fatal("Reserve of 1 buffer failed with 2 free")
	} else {
		_ = buf
		p.Cancel()
	}
	p.Release(1) // a: buffers 0..2 free, b holds 3..5, tail at 6
	if p.InUse() != 3 {
		t.Fatalf("InUse = %d, want 3", p.InUse())
	}
	stage(t, p, c) // 6, 7 skipped; c at 0..2
	if p.InUse() != 8 || p.stats.SkippedBuffers.Load() != 2 {
		t.Fatalf("after wrapping: InUse %d (want 8), skipped %d (want 2)", p.InUse(), p.stats.SkippedBuffers.Load())
	}
	if _, ok := p.Reserve(1); ok {
		t.Fatal("Reserve succeeded on a full pool")
	}
	v := p.Staged()
	if len(v) != 2 || !bytes.Equal(flat(v[0]), b) || !bytes.Equal(flat(v[1]), c) || &v[1].Body[0] != &p.slab[0] {
		t.Fatal("staged frames are not b then c (at the slab's start)")
	}
	p.Release(1)
	if p.InUse() != 5 { // c's 3 buffers and the 2 it skipped
		t.Fatalf("InUse = %d after releasing b, want 5", p.InUse())
	}
	p.Release(1)
	if p.InUse() != 0 || p.stats.InUse.Load() != 0 {
		t.Fatalf("InUse = %d after releasing everything", p.InUse())
	}
	// An empty pool restarts at the front: a 7-buffer frame fits without skipping.
	stage(t, p, seqFrame(4, 7*bs))
	if p.stats.SkippedBuffers.Load() != 2 {
		t.Fatal("an empty pool skipped buffers")
	}
}

// Reservations: several at once (a GSO frame's segments), Commit trims the newest,
// Cancel rolls back exactly.
func TestReserveCommitCancel(t *testing.T) {
	const bs = 16 << 10
	p := newPool(t, Config{BufSize: bs, Bytes: 8 * bs})
	stage(t, p, seqFrame(1, 100))
	for i := 0; i < 3; i++ {
		if _, ok := p.Reserve(bs + 1); !ok { // 2 buffers each
			t.Fatalf("reservation %d failed", i)
		}
	}
	if p.InUse() != 7 {
		t.Fatalf("InUse = %d with 1+3×2 buffers held", p.InUse())
	}
	p.Commit(bs + 1)
	p.Cancel()
	if p.InUse() != 3 {
		t.Fatalf("InUse = %d after Cancel, want 3", p.InUse())
	}
	buf, ok := p.Reserve(3 * bs)
	if !ok || &buf[0] != &p.slab[3*bs] {
		t.Fatal("the reservation after Cancel does not start where the cancelled ones did")
	}
	p.Commit(10) // the newest reservation gives back what it does not need
	if p.InUse() != 4 {
		t.Fatalf("InUse = %d after committing 10 bytes of a 3-buffer reservation, want 4", p.InUse())
	}
	if f, b := p.Queued(); f != 3 || b != 100+bs+1+10 {
		t.Fatalf("Queued = %d frames, %d bytes", f, b)
	}
	if _, ok := p.Reserve(8*bs + 1); ok || p.Fits(8*bs+1, 1) || !p.Fits(bs, 8) || p.Fits(bs, 9) {
		t.Fatal("a frame larger than the pool is not refused")
	}
}

// Order is preserved across spans, wrap-arounds and flushes cut short by the port.
func TestOrderPreserved(t *testing.T) {
	const bs = 2048
	clk := newFakeClock()
	p := newPool(t, Config{BufSize: bs, Bytes: 128 << 10, Clock: clk}) // 64 buffers
	rng := rand.New(rand.NewPCG(1, 2))
	s := &fakeSender{keep: true, accept: func() int { return rng.IntN(5) }, size: 1 << 20, free: 1 << 20}
	var want [][]byte
	for seq := uint64(0); seq < 5000; seq++ {
		n := 14 + rng.IntN(3*bs) // 1 to 4 buffers
		if rng.IntN(50) == 0 {
			n = 60000 // 30 buffers
		}
		f := seqFrame(seq, max(n, 14))
		buf, ok := p.Reserve(len(f))
		if !ok {
			if _, _, err := p.Flush(s, ReasonPoolFull); err != nil {
				t.Fatal(err)
			}
			if buf, ok = p.Reserve(len(f)); !ok {
				t.Fatalf("Reserve(%d) failed on an empty pool", len(f))
			}
		}
		p.Commit(copy(buf, f))
		want = append(want, f)
		switch rng.IntN(8) {
		case 0:
			if _, _, err := p.Flush(s, ReasonBatchEnd); err != nil {
				t.Fatal(err)
			}
		case 1:
			// Deliver only the oldest few and keep staging behind them, so the ring
			// wraps with frames still queued.
			v := p.Staged()
			k := rng.IntN(len(v) + 1)
			for _, f := range v[:k] {
				s.got = append(s.got, flat(f))
			}
			p.Release(k)
		}
	}
	if _, _, err := p.Flush(s, ReasonBatchEnd); err != nil {
		t.Fatal(err)
	}
	if len(s.got) != len(want) {
		t.Fatalf("sender got %d frames, want %d", len(s.got), len(want))
	}
	for i := range want {
		if !bytes.Equal(s.got[i], want[i]) {
			t.Fatalf("frame %d differs (seq %d)", i, binary.BigEndian.Uint64(s.got[i]))
		}
	}
	st := p.Stats()
	if st.FramesStaged.Load() != 5000 || p.InUse() != 0 || st.Stalls.Load() == 0 || st.SkippedBuffers.Load() == 0 {
		t.Fatalf("stats: sent %d staged %d inuse %d stalls %d skipped %d", st.FramesSent.Load(), st.FramesStaged.Load(), p.InUse(), st.Stalls.Load(), st.SkippedBuffers.Load())
	}
}

// The delayed flush: after a stall and writability, the consumer frees room several
// times within the delay; the pool flushes once, when the threshold is reached.
func TestDelayedFlushThreshold(t *testing.T) {
	clk := newFakeClock()
	p := newPool(t, Config{BufSize: 2048, Bytes: 1 << 20, FlushDelay: 500 * time.Microsecond, FlushThreshold: 50000, Clock: clk})
	s := &fakeSender{size: 1 << 20, clock: clk, waitFor: 3 * time.Millisecond}
	calls := 0
	s.accept = func() int {
		calls++
		if calls == 1 {
			return 2 // the port runs short after two frames
		}
		return -1
	}
	clk.onTick = func() { s.free += 10000 } // each poll finds 10000 more bytes free
	for i := uint64(0); i < 40; i++ {
		stage(t, p, seqFrame(i, 1514))
	}
	n, b, err := p.Flush(s, ReasonBatchEnd)
	if err != nil || n != 40 || b != 40*1514 {
		t.Fatalf("Flush = %d, %d, %v", n, b, err)
	}
	st := p.Stats()
	if s.writes != 2 || s.waits != 1 {
		t.Fatalf("%d writes and %d waits; want 2 writes (before and after the stall) and 1 wait", s.writes, s.waits)
	}
	if clk.sleeps != 5 {
		t.Fatalf("%d polls of Room before the threshold, want 5", clk.sleeps)
	}
	if st.Flushes[ReasonThreshold].Load() != 1 || st.Flushes[ReasonDeadline].Load() != 0 || st.Flushes[ReasonBatchEnd].Load() != 1 || st.Stalls.Load() != 1 {
		t.Fatalf("flush reasons: %v", flushCounts(st))
	}
	// Blocked: the 3 ms wait for writability plus 5 polls of 62.5 µs.
	if got, want := time.Duration(st.BlockedNanos.Load()), 3*time.Millisecond+5*62500*time.Nanosecond; got != want {
		t.Fatalf("blocked %v, want %v", got, want)
	}
	if st.BatchFrames[batchBucket(2)].Load() != 1 || st.BatchFrames[batchBucket(38)].Load() != 1 {
		t.Fatal("frames-per-write histogram does not show the writes of 2 and 38")
	}
}

// When the room never reaches the threshold, the delay bounds the wait: one flush when
// it expires, however often the consumer freed a little.
func TestDelayedFlushDeadline(t *testing.T) {
	for _, delay := range []time.Duration{500 * time.Microsecond, -1} {
		clk := newFakeClock()
		p := newPool(t, Config{BufSize: 2048, Bytes: 1 << 20, FlushDelay: delay, Clock: clk})
		s := &fakeSender{size: 1 << 20, clock: clk}
		calls := 0
		s.accept = func() int {
			calls++
			if calls == 1 {
				return 0
			}
			return -1
		}
		clk.onTick = func() { s.free += 100 }
		for i := uint64(0); i < 10; i++ {
			stage(t, p, seqFrame(i, 1514))
		}
		start := clk.now
		if n, _, err := p.Flush(s, ReasonPoolFull); n != 10 || err != nil {
			t.Fatalf("Flush = %d, %v", n, err)
		}
		st := p.Stats()
		wantWait, wantSleeps := 500*time.Microsecond, 8
		if delay < 0 {
			wantWait, wantSleeps = 0, 0
		}
		if waited := clk.now.Sub(start); waited != wantWait || clk.sleeps != wantSleeps || s.writes != 2 || st.Flushes[ReasonDeadline].Load() != 1 {
			t.Fatalf("delay %v: waited %v in %d polls with %d writes, reasons %v; want %v in %d polls, 2 writes, one deadline flush",
				delay, waited, clk.sleeps, s.writes, flushCounts(st), wantWait, wantSleeps)
		}
	}
}

// The automatic threshold is room for everything queued (with stream prefixes), capped at
// half the send buffer.
func TestAutoThreshold(t *testing.T) {
	p := newPool(t, Config{BufSize: 2048, Bytes: 1 << 20})
	for i := uint64(0); i < 10; i++ {
		stage(t, p, seqFrame(i, 1000))
	}
	if got := p.threshold(1 << 20); got != 10*1004 {
		t.Fatalf("threshold = %d, want %d", got, 10*1004)
	}
	if got := p.threshold(8000); got != 4000 {
		t.Fatalf("threshold with an 8000-byte buffer = %d, want 4000", got)
	}
	p.cfg.FlushThresholdFrac = 0.25
	if got := p.threshold(8000); got != 2000 {
		t.Fatalf("25%% threshold = %d, want 2000", got)
	}
}

// A failing port ends Flush with its error and leaves the rest staged for Discard.
func TestFlushPortError(t *testing.T) {
	p := newPool(t, Config{BufSize: 2048, Bytes: 1 << 20, Clock: newFakeClock()})
	s := &fakeSender{accept: func() int { return 0 }, waitErr: port.ErrClosed}
	for i := uint64(0); i < 5; i++ {
		stage(t, p, seqFrame(i, 100))
	}
	if _, _, err := p.Flush(s, ReasonBatchEnd); !errors.Is(err, port.ErrClosed) {
		t.Fatalf("Flush on a closed port: %v", err)
	}
	if f, _ := p.Queued(); f != 5 {
		t.Fatalf("%d frames still staged, want 5", f)
	}
	p.Discard(DropPortError)
	if p.InUse() != 0 || p.Stats().Drops[DropPortError].Load() != 5 {
		t.Fatalf("after Discard: InUse %d, port_error drops %d", p.InUse(), p.Stats().Drops[DropPortError].Load())
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{BufSize: 32},
		{Bytes: 1024},
		{BufSize: 1 << 20, Bytes: 1 << 20},
		{FlushDelay: 2 * time.Second},
		{FlushThreshold: -1},
		{FlushThresholdFrac: 1.5},
	} {
		if _, err := New(c, nil); err == nil {
			t.Errorf("New(%+v) accepted a bad config", c)
		}
	}
}

// Steady state allocates nothing: stage, flush (with a stall and the delayed flush),
// release.
func TestZeroAllocs(t *testing.T) {
	clk := newFakeClock()
	p := newPool(t, Config{BufSize: 2048, Bytes: 1 << 20, Clock: clk})
	calls := 0
	s := &fakeSender{size: 1 << 20, accept: func() int {
		calls++
		if calls%2 == 1 {
			return 3
		}
		return -1
	}}
	f := seqFrame(1, 1514)
	allocs := testing.AllocsPerRun(200, func() {
		for i := 0; i < 64; i++ {
			buf, ok := p.Reserve(len(f))
			if !ok {
				t.Fatal("Reserve failed")
			}
			p.Commit(copy(buf, f))
		}
		if n, _, err := p.Flush(s, ReasonBatchEnd); n != 64 || err != nil {
			t.Fatalf("Flush = %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of 64 frames, want 0", allocs)
	}
}

func flushCounts(st *Stats) map[string]uint64 {
	m := map[string]uint64{}
	for r := Reason(0); r < NumReasons; r++ {
		m[r.String()] = st.Flushes[r].Load()
	}
	return m
}

// BenchmarkStageFlush measures staging MTU frames (a memcpy each) and one flush per 64
// to a sender that takes everything: the pool's own overhead per frame.
func BenchmarkStageFlush(b *testing.B) {
	p := newPool(b, Config{})
	s := &fakeSender{}
	f := seqFrame(1, 1514)
	b.SetBytes(64 * 1514)
	b.ReportAllocs()
	for b.Loop() {
		for i := 0; i < 64; i++ {
			buf, _ := p.Reserve(len(f))
			p.Commit(copy(buf, f))
		}
		p.Flush(s, ReasonBatchEnd)
	}
}
