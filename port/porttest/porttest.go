// Package porttest is the port contract's test kit: Run checks that a transport's ports
// keep what package port promises of a Port (frames whole and in order within the
// frame limits, read deadlines that do not end the connection, Pending, Close), and of
// each optional capability a port has (BatchSender, VecSender, Lender, ShmSender,
// Backend). A transport's own tests call it with a function that makes a connected
// pair of its ports; the kit knows no transport, so it depends only on port, and every
// transport is held to the same rules the engine relies on.
//
// helpers.go has what the transports' own tests share besides: self-identifying
// frames, read buffers, reading frames back, raw connection pairs and a leak check.
// Connected pairs of real ports for tests of code above the transports (the engine,
// the receive pool) are the transports' business: package sockport/sockporttest.
package porttest

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"tapgro/port"
	"tapgro/vnethdr"
)

// NewPair returns two connected ports of the transport under test: what one writes, the
// other reads. The pair must be lossless while both ends are open and the reader keeps
// reading (a UDP pair is not: loopback drops what a slow reader's buffer cannot hold),
// and both ends must carry the same VnetHdrLen. Run closes both when the subtest ends.
type NewPair func(t testing.TB) (a, b port.Port)

// limit bounds every wait in the kit: a port that should have answered by then is
// broken, not slow.
const limit = 10 * time.Second

// Run checks the contract on fresh pairs from newPair, one subtest per rule.
func Run(t *testing.T, newPair NewPair) {
	pair := func(t *testing.T) (a, b port.Port) {
		t.Helper()
		a, b = newPair(t)
		t.Cleanup(func() { a.Close(); b.Close() })
		if a.VnetHdrLen() != b.VnetHdrLen() {
			t.Fatalf("the ends carry %d- and %d-byte vnet headers", a.VnetHdrLen(), b.VnetHdrLen())
		}
		return a, b
	}
	t.Run("Frames", func(t *testing.T) { testFrames(t, pair) })
	t.Run("FrameLimits", func(t *testing.T) { testFrameLimits(t, pair) })
	t.Run("ReadDeadline", func(t *testing.T) { testReadDeadline(t, pair) })
	t.Run("Pending", func(t *testing.T) { testPending(t, pair) })
	t.Run("Close", func(t *testing.T) { testClose(t, pair) })
	t.Run("Backend", func(t *testing.T) { testBackend(t, pair) })
	t.Run("BatchSender", func(t *testing.T) { testBatchSender(t, pair) })
	t.Run("VecSender", func(t *testing.T) { testVecSender(t, pair) })
	t.Run("Lender", func(t *testing.T) { testLender(t, pair) })
	t.Run("ShmSender", func(t *testing.T) { testShmSender(t, pair) })
}

type pairFunc func(t *testing.T) (a, b port.Port)

// record is what a port with hl-byte vnet headers carries for an n-byte frame: an
// all-zero header (plain, fully checksummed) and bytes that tell frames and positions
// apart.
func record(hl, n int, tag byte) []byte {
	r := make([]byte, hl+n)
	for i := range r[hl:] {
		r[hl+i] = tag ^ byte(i) ^ byte(i>>8)
	}
	return r
}

// records are the frames of sizes as records for p, tagged by position from tag on.
func records(p port.Port, sizes []int, tag int) [][]byte {
	rs := make([][]byte, len(sizes))
	for i, n := range sizes {
		rs[i] = record(p.VnetHdrLen(), n, byte(tag+i))
	}
	return rs
}

// sizeMix is one of each size class a port meets: the limits, ACKs, MTU and jumbo
// frames, and a GSO super-frame.
var sizeMix = []int{port.MinFrame, 60, 1514, 9014, 65000, port.MaxFrame}

func buffers(p port.Port, n int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, p.VnetHdrLen()+port.MaxFrame)
	}
	return bufs, make([]int, n)
}

// writeAsync writes frames with WriteBatch from a goroutine and reports the outcome.
func writeAsync(p port.Port, frames [][]byte) <-chan error {
	errc := make(chan error, 1)
	go func() {
		n, err := p.WriteBatch(frames)
		if err == nil && n != len(frames) {
			err = errors.New("WriteBatch returned short without an error")
		}
		errc <- err
	}()
	return errc
}

// expect reads from p until every record of want has arrived and checks each, in order.
// A frame that never comes fails the test once limit has passed.
func expect(t *testing.T, p port.Port, want [][]byte, batch int) {
	t.Helper()
	defer readDeadline(t, p)()
	bufs, sizes := buffers(p, batch)
	for got := 0; got < len(want); {
		n, err := p.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatalf("ReadBatch after %d of %d frames: %v", got, len(want), err)
		}
		if n == 0 {
			t.Fatalf("ReadBatch returned no frame and no error")
		}
		for i := 0; i < n; i++ {
			if got == len(want) {
				t.Fatalf("more frames arrived than were sent")
			}
			if !bytes.Equal(bufs[i][:sizes[i]], want[got]) {
				t.Fatalf("frame %d: got %d bytes, want %d (or the bytes differ)", got, sizes[i], len(want[got]))
			}
			got++
		}
	}
}

// readDeadline bounds p's reads by limit, until the function it returns clears it.
func readDeadline(t *testing.T, p port.Port) (done func()) {
	t.Helper()
	if err := p.SetReadDeadline(time.Now().Add(limit)); err != nil {
		t.Fatalf("SetReadDeadline = %v", err)
	}
	return func() { p.SetReadDeadline(time.Time{}) }
}

// wait fails the test if errc says nothing within limit, and returns what it said.
func wait(t *testing.T, errc <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(limit):
		t.Fatalf("%s did not return within %v", what, limit)
		return nil
	}
}

// Frames of every size class cross whole and in order, both ways, as one batch and as
// many, and read batches of any size take them.
func testFrames(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	var small []int
	for i := 0; i < 100; i++ {
		small = append(small, 60+i)
	}
	for _, dir := range []struct {
		name     string
		from, to port.Port
	}{{"a to b", a, b}, {"b to a", b, a}} {
		for _, batch := range []int{1, 7, 64} {
			mix := records(dir.from, sizeMix, 0)
			many := records(dir.from, small, 100)
			errc := make(chan error, 1)
			go func() {
				if err := <-writeAsync(dir.from, mix); err != nil {
					errc <- err
					return
				}
				for _, r := range mix { // and one WriteBatch per frame
					if _, err := dir.from.WriteBatch([][]byte{r}); err != nil {
						errc <- err
						return
					}
				}
				errc <- <-writeAsync(dir.from, many)
			}()
			want := append(append(append([][]byte{}, mix...), mix...), many...)
			expect(t, dir.to, want, batch)
			if err := wait(t, errc, "WriteBatch"); err != nil {
				t.Fatalf("%s, read batch %d: %v", dir.name, batch, err)
			}
		}
	}
}

// A frame outside [MinFrame, MaxFrame] (plus the vnet header) is not sent: WriteBatch
// returns the frames before it, which do arrive, and a *port.FrameError.
func testFrameLimits(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	hl := a.VnetHdrLen()
	good := record(hl, 1514, 1)
	for _, bad := range [][]byte{record(hl, port.MinFrame-1, 2), record(hl, port.MaxFrame+1, 3)} {
		n, err := a.WriteBatch([][]byte{good, bad, good})
		var fe *port.FrameError
		if n != 1 || !errors.As(err, &fe) {
			t.Fatalf("WriteBatch with a %d-byte frame second = %d, %v; want 1, a *port.FrameError", len(bad)-hl, n, err)
		}
		expect(t, b, [][]byte{good}, 8)
	}
}

// A read deadline makes a blocked ReadBatch return os.ErrDeadlineExceeded without
// ending the connection; the zero time clears it.
func testReadDeadline(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	bufs, sizes := buffers(b, 8)
	if err := b.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	readc := make(chan error, 1)
	go func() { _, err := b.ReadBatch(bufs, sizes); readc <- err }()
	if err := wait(t, readc, "ReadBatch past its deadline"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadBatch past the deadline = %v, want os.ErrDeadlineExceeded", err)
	}
	if err := b.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	want := records(a, sizeMix, 0)
	errc := writeAsync(a, want)
	expect(t, b, want, 8)
	if err := wait(t, errc, "WriteBatch"); err != nil {
		t.Fatal(err)
	}
}

// Pending true means complete frames are buffered, so ReadBatch returns one at once,
// without a system call: not even a read deadline already past stops it. The engine
// ends a read batch (and flushes GRO) where Pending turns false. Once every frame sent
// has been read it is false.
func testPending(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	want := records(a, []int{60, 1514, 9014, 60, 60}, 0)
	// One WriteBatch, so a stream's reader likely gets them all in one read.
	if err := wait(t, writeAsync(a, want), "WriteBatch"); err != nil {
		t.Fatal(err)
	}
	bufs, sizes := buffers(b, 1)
	pendings := 0
	for got := 0; got < len(want); got++ {
		deadline := time.Now().Add(limit)
		if got > 0 && b.Pending() {
			pendings++
			deadline = time.Now().Add(-time.Second)
		}
		if err := b.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		n, err := b.ReadBatch(bufs, sizes)
		if err != nil || n != 1 || !bytes.Equal(bufs[0][:sizes[0]], want[got]) {
			t.Fatalf("ReadBatch of frame %d (Pending %v) = %d, %v (or the bytes differ)", got, deadline.Before(time.Now()), n, err)
		}
	}
	if err := b.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if b.Pending() {
		t.Fatal("Pending is true with every frame sent read")
	}
	t.Logf("Pending was true before %d of %d reads", pendings, len(want)-1)
}

// Close unblocks a ReadBatch, which then reports port.ErrClosed, as do reads and writes
// after it; a second Close is harmless (the engine closes a port from two places).
func testClose(t *testing.T, pair pairFunc) {
	a, _ := pair(t)
	bufs, sizes := buffers(a, 8)
	errc := make(chan error, 1)
	go func() { _, err := a.ReadBatch(bufs, sizes); errc <- err }()
	time.Sleep(20 * time.Millisecond) // let it block
	if err := a.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if err := wait(t, errc, "ReadBatch across Close"); !errors.Is(err, port.ErrClosed) {
		t.Fatalf("ReadBatch across Close = %v, want port.ErrClosed", err)
	}
	if _, err := a.ReadBatch(bufs, sizes); !errors.Is(err, port.ErrClosed) {
		t.Fatalf("ReadBatch after Close = %v, want port.ErrClosed", err)
	}
	if _, err := a.WriteBatch(records(a, []int{60}, 0)); !errors.Is(err, port.ErrClosed) {
		t.Fatalf("WriteBatch after Close = %v, want port.ErrClosed", err)
	}
	a.Close()
}

// BackendOf agrees with the Port, and a port delivers no offload it was not allowed
// (and none at all without a vnet header).
func testBackend(t *testing.T, pair pairFunc) {
	a, _ := pair(t)
	be := port.BackendOf(a)
	if be.VnetHdrLen() != a.VnetHdrLen() || be.Accepts() != a.Accepts() {
		t.Fatalf("Backend says %d-byte headers accepting %s, the Port %d accepting %s",
			be.VnetHdrLen(), be.Accepts(), a.VnetHdrLen(), a.Accepts())
	}
	if be.State() == "" || a.Peer() == "" {
		t.Errorf("State %q, Peer %q: both should say something", be.State(), a.Peer())
	}
	for _, allow := range []vnethdr.Offloads{^vnethdr.Offloads(0), vnethdr.OffloadCSUM | vnethdr.OffloadTSO4, 0} {
		got, err := be.SetOffloads(allow)
		switch {
		case err != nil:
			t.Errorf("SetOffloads(%s) = %v", allow, err)
		case got&^allow != 0:
			t.Errorf("SetOffloads(%s) = %s: more than allowed", allow, got)
		case a.VnetHdrLen() == 0 && got != 0:
			t.Errorf("SetOffloads(%s) = %s on a port without vnet headers", allow, got)
		}
	}
}

// within fails the test if fn, run on its own goroutine, takes longer than limit: the
// calls it makes must never wait for the peer. fn reports with t.Errorf.
func within(t *testing.T, what string, fn func()) {
	t.Helper()
	Within(t, limit, what, fn)
}

// sendAll sends items with try (TryWriteBatch or TryWriteVecs), waiting with
// WaitWritable whenever the transport is full, and keeping the unsent items first in
// line, the same memory, as a caller must.
func sendAll[T any](s port.BatchSender, items []T, try func([]T) (int, error)) error {
	for len(items) > 0 {
		n, err := try(items)
		items = items[n:]
		if errors.Is(err, port.ErrWouldBlock) {
			err = s.WaitWritable(time.Now().Add(limit))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func checkRoom(t *testing.T, s port.BatchSender) {
	t.Helper()
	if free, size := s.Room(); size <= 0 || free < 0 || free > size {
		t.Errorf("Room = %d free of %d", free, size)
	}
}

// A BatchSender never blocks: TryWriteBatch fills the transport and stops with
// port.ErrWouldBlock; retried, unsent frames first, after WaitWritable while the peer
// reads, it delivers every frame whole and in order. Room stays a sane estimate.
func testBatchSender(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	s, ok := a.(port.BatchSender)
	if !ok {
		t.Skip("not a port.BatchSender")
	}
	checkRoom(t, s)
	var sent, rest [][]byte
	full := false
	within(t, "TryWriteBatch on a transport nobody reads", func() {
		for i := 0; i < 4096 && !full; i++ {
			batch := records(a, []int{1514, 9014, 60, 1514}, len(sent))
			n, err := s.TryWriteBatch(batch)
			sent = append(sent, batch[:n]...)
			switch {
			case errors.Is(err, port.ErrWouldBlock):
				full, rest = true, batch[n:]
			case err != nil:
				t.Errorf("TryWriteBatch = %v", err)
				return
			case n != len(batch):
				t.Errorf("TryWriteBatch = %d of %d without an error", n, len(batch))
				return
			}
		}
	})
	if t.Failed() {
		return
	}
	if !full {
		t.Logf("the transport took %d frames without filling: backpressure not exercised", len(sent))
	}
	checkRoom(t, s)
	more := append(rest, records(a, sizeMix, 7)...)
	errc := make(chan error, 1)
	go func() { errc <- sendAll(s, more, s.TryWriteBatch) }()
	expect(t, b, append(sent, more...), 64)
	if err := wait(t, errc, "TryWriteBatch with WaitWritable"); err != nil {
		t.Fatal(err)
	}
	checkRoom(t, s)
}

// A VecSender sends each Vec as the frame Head[VecHeadroom:] followed by Body, whichever
// piece is empty, with the same rules as TryWriteBatch.
func testVecSender(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	s, ok := a.(port.VecSender)
	if !ok {
		t.Skip("not a port.VecSender")
	}
	var want [][]byte
	for i := 0; i < 50; i++ {
		want = append(want, records(a, sizeMix, len(want))...)
	}
	vecs := make([]port.Vec, len(want))
	for i, r := range want {
		// The whole record as the body, headers in the head (as the TAP→port pipeline
		// stages a segment), all of it in the head, a few bytes only.
		c := min([]int{0, a.VnetHdrLen() + 54, len(r), 7}[i%4], len(r))
		vecs[i] = port.Vec{Head: append(make([]byte, port.VecHeadroom), r[:c]...), Body: r[c:]}
		if vecs[i].Len() != len(r) {
			t.Fatalf("Vec.Len = %d for a %d-byte record", vecs[i].Len(), len(r))
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- sendAll(s, vecs, s.TryWriteVecs) }()
	expect(t, b, want, 64)
	if err := wait(t, errc, "TryWriteVecs with WaitWritable"); err != nil {
		t.Fatal(err)
	}
}

// expectLent is expect through ReadBatchLent, used as the engine uses it: frames in
// order, each one's ShmHeadroom bytes overwritten (with the TAP's header, in the engine)
// only once the frame before it is done with, ReleaseLent after each batch.
func expectLent(t *testing.T, p port.Port, l port.Lender, want [][]byte, batch int) (lentN int) {
	t.Helper()
	defer readDeadline(t, p)()
	hl := p.VnetHdrLen()
	bufs, sizes := buffers(p, batch)
	lent := make([][]byte, batch)
	poison := bytes.Repeat([]byte{0xa5}, port.ShmHeadroom)
	for got := 0; got < len(want); {
		n, err := l.ReadBatchLent(bufs, sizes, lent)
		if err != nil {
			t.Fatalf("ReadBatchLent after %d of %d frames: %v", got, len(want), err)
		}
		if n == 0 {
			t.Fatalf("ReadBatchLent returned no frame and no error")
		}
		for i := 0; i < n; i++ {
			if got == len(want) {
				t.Fatalf("more frames arrived than were sent")
			}
			w := want[got]
			if lent[i] == nil {
				if !bytes.Equal(bufs[i][:sizes[i]], w) {
					t.Fatalf("frame %d (copied): got %d bytes, want %d (or the bytes differ)", got, sizes[i], len(w))
				}
				got++
				continue
			}
			lentN++
			l := lent[i]
			if len(l) < port.ShmHeadroom-hl+sizes[i] {
				t.Fatalf("frame %d lent in %d bytes, its %d-byte record at %d does not fit", got, len(l), sizes[i], port.ShmHeadroom-hl)
			}
			if !bytes.Equal(l[port.ShmHeadroom-hl:port.ShmHeadroom-hl+sizes[i]], w) {
				t.Fatalf("frame %d (lent): got %d bytes, want %d (or the bytes differ)", got, sizes[i], len(w))
			}
			copy(l, poison) // the headroom is the reader's
			if !bytes.Equal(l[port.ShmHeadroom:port.ShmHeadroom-hl+sizes[i]], w[hl:]) {
				t.Fatalf("frame %d: writing its headroom changed the frame", got)
			}
			got++
		}
		l.ReleaseLent()
		clear(lent)
	}
	return lentN
}

// A Lender's frames, lent or copied, are the frames sent, and writing each one's
// headroom in order spoils none of them.
func testLender(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	l, ok := b.(port.Lender)
	if !ok {
		t.Skip("not a port.Lender")
	}
	var want [][]byte
	for i := 0; i < 20; i++ {
		want = append(want, records(a, sizeMix, len(want))...)
	}
	errc := writeAsync(a, want)
	n := expectLent(t, b, l, want, 64)
	if err := wait(t, errc, "WriteBatch"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d frames lent", n, len(want))
}

// An active ShmSender's ring carries frames the way the TAP→port pipeline uses it:
// TxSlots for a TAP read, a descriptor per frame (PutShmDesc) sent in its place, TxDone;
// the peer reads the frames themselves, copied or lent, and the slots come back.
func testShmSender(t *testing.T, pair pairFunc) {
	a, b := pair(t)
	s, ok := a.(port.ShmSender)
	if !ok || !s.ShmActive() {
		t.Skip("not an active port.ShmSender")
	}
	hl := a.VnetHdrLen()
	if m := s.ShmMinFrame(); m < port.MinFrame || m > port.MaxFrame || s.ShmDescLen() <= 0 {
		t.Fatalf("ShmMinFrame %d, ShmDescLen %d", m, s.ShmDescLen())
	}
	l, _ := b.(port.Lender)
	slots := make([][]byte, 8)
	for round := 0; round < 64; round++ { // more frames than a small ring holds
		k := s.TxSlots(slots, hl)
		if k == 0 {
			t.Fatalf("round %d: no free slot, though the peer has read every frame", round)
		}
		var want, recs [][]byte
		for i := 0; i < k; i++ {
			if i%3 == 2 {
				continue // a slot no descriptor names goes back with TxDone
			}
			n := min(s.ShmMinFrame()+1000*i+round, len(slots[i])-hl)
			w := record(hl, n, byte(round+i))
			copy(slots[i], w) // the TAP read: [header][frame]
			rec := make([]byte, hl+s.ShmDescLen())
			copy(rec, w[:hl])
			s.PutShmDesc(rec[hl:], i, n)
			if f := s.TxFrame(rec); !bytes.Equal(f, w[hl:]) {
				t.Fatalf("round %d: TxFrame of slot %d's descriptor is %d bytes, want the %d-byte frame", round, i, len(f), n)
			}
			want, recs = append(want, w), append(recs, rec)
		}
		errc := writeAsync(a, recs)
		if l != nil && round%2 == 1 {
			expectLent(t, b, l, want, 8)
		} else {
			expect(t, b, want, 8)
		}
		if err := wait(t, errc, "WriteBatch of descriptors"); err != nil {
			t.Fatal(err)
		}
		s.TxDone()
	}
}
