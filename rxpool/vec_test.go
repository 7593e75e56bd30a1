package rxpool

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"tapgro/port"
)

// stageVec stages head (built in the pool's header slot) followed by body (left in the
// caller's memory) and fails the test if it does not fit.
func stageVec(t testing.TB, p *Pool, head, body []byte) {
	t.Helper()
	slot, ok := p.ReserveVec(len(head), len(body))
	if !ok {
		t.Fatalf("ReserveVec(%d, %d) failed with %d of %d buffers in use", len(head), len(body), p.InUse(), p.Buffers())
	}
	copy(slot, head)
	p.CommitVec(body)
}

// Vectors count for the buffers their frame would span if copied, take none of the
// ring, keep their header in their own slot and their body where the caller has it;
// copies and vectors interleave in one order.
func TestVecRecords(t *testing.T) {
	p := newPool(t, Config{BufSize: 2048, Bytes: 128 << 10}) // 64 buffers
	payload := seqFrame(7, 65000)
	stageVec(t, p, []byte("headers of a segment"), payload[:1460]) // 1480 bytes: 1 buffer
	stage(t, p, seqFrame(2, 3000))                                 // a copy: 2 buffers
	stageVec(t, p, make([]byte, 12), payload)                      // 65012 bytes: 32 buffers
	if p.InUse() != 35 || p.used != 2 || !p.Borrowing() {
		t.Fatalf("InUse %d (want 35), ring buffers %d (want 2), borrowing %t", p.InUse(), p.used, p.Borrowing())
	}
	if f, b := p.Queued(); f != 3 || b != 1480+3000+65012 {
		t.Fatalf("Queued = %d frames, %d bytes", f, b)
	}
	v := p.Staged()
	if len(v) != 3 || !bytes.Equal(flat(v[0]), append([]byte("headers of a segment"), payload[:1460]...)) ||
		&v[0].Body[0] != &payload[0] || &v[2].Body[0] != &payload[0] || !bytes.Equal(v[1].Body, seqFrame(2, 3000)) ||
		&v[1].Body[0] != &p.slab[0] {
		t.Fatal("Staged does not return the vectors' slots and bodies and the copy's buffers")
	}
	// The header slots are the descriptors' own: distinct, never in the ring.
	if &v[0].Head[0] == &v[2].Head[0] || len(v[2].Head) != port.VecHeadroom+12 || cap(v[0].Head) != len(v[0].Head) {
		t.Fatal("header slots overlap or are not capped")
	}
	// Capacity is the bound: 29 buffers are left, so a frame that would span 30 waits.
	if _, ok := p.ReserveVec(54, 29*2048); ok {
		t.Fatal("ReserveVec beyond the pool's capacity succeeded")
	}
	if _, ok := p.ReserveVec(HeadCap+1, 10); ok {
		t.Fatal("a head larger than its slot was accepted")
	}
	// Reservations of both kinds roll back together; CommitVec gives back the capacity
	// a shorter body does not need.
	if _, ok := p.ReserveVec(54, 4000); !ok { // 3 buffers
		t.Fatal("ReserveVec failed")
	}
	if _, ok := p.Reserve(100); !ok {
		t.Fatal("Reserve failed")
	}
	p.Cancel()
	if p.InUse() != 35 || p.used != 2 {
		t.Fatalf("after Cancel: InUse %d, ring %d", p.InUse(), p.used)
	}
	if _, ok := p.ReserveVec(54, 4000); !ok {
		t.Fatal("ReserveVec failed")
	}
	p.CommitVec(payload[:100])
	if p.InUse() != 36 {
		t.Fatalf("InUse = %d after committing 154 bytes of a 3-buffer vector, want 36", p.InUse())
	}
	s := &fakeSender{keep: true}
	if n, _, err := p.Flush(s, ReasonBatchEnd); n != 4 || err != nil {
		t.Fatalf("Flush = %d, %v", n, err)
	}
	if p.InUse() != 0 || p.Borrowing() || p.used != 0 {
		t.Fatalf("after Flush: InUse %d, borrowing %t", p.InUse(), p.Borrowing())
	}
	if !bytes.Equal(s.got[2], append(make([]byte, 12), payload...)) {
		t.Fatal("the third frame differs")
	}
}

// Order and bytes are preserved for a random mix of copies and vectors across
// wrap-arounds, stalls and partial flushes; the pool lends nothing back before it
// delivered it: each "read buffer" is poisoned as soon as Borrowing is false, which
// the pool may only report once every frame pointing into it has gone out.
func TestVecOrderPreservedAndLent(t *testing.T) {
	const bs = 2048
	clk := newFakeClock()
	p := newPool(t, Config{BufSize: bs, Bytes: 128 << 10, Clock: clk}) // 64 buffers
	rng := rand.New(rand.NewPCG(3, 4))
	s := &fakeSender{keep: true, accept: func() int { return rng.IntN(5) }, size: 1 << 20, free: 1 << 20}
	var want [][]byte
	rd := make([]byte, 1<<20) // the caller's read buffer, reused once nothing is lent
	used := 0
	poison := func() {
		if !p.Borrowing() {
			for i := range rd[:used] {
				rd[i] = 0xee
			}
			used = 0
		}
	}
	for seq := uint64(0); seq < 5000; seq++ {
		n := 14 + rng.IntN(3*bs)
		if rng.IntN(50) == 0 {
			n = 60000
		}
		f := seqFrame(seq, n)
		vec := rng.IntN(2) == 0 && used+n <= len(rd)
		h := min(rng.IntN(HeadCap+1), n)
		var ok bool
		if vec {
			copy(rd[used:], f[h:])
			body := rd[used : used+n-h]
			var slot []byte
			if slot, ok = p.ReserveVec(h, len(body)); ok {
				copy(slot, f[:h])
				p.CommitVec(body)
				used += len(body)
			}
		} else {
			var buf []byte
			if buf, ok = p.Reserve(n); ok {
				p.Commit(copy(buf, f))
			}
		}
		if !ok {
			if _, _, err := p.Flush(s, ReasonPoolFull); err != nil {
				t.Fatal(err)
			}
			poison()
			seq-- // stage it again into the empty pool
			continue
		}
		want = append(want, f)
		if rng.IntN(8) == 0 {
			if _, _, err := p.Flush(s, ReasonBatchEnd); err != nil {
				t.Fatal(err)
			}
			poison()
		}
	}
	if _, _, err := p.Flush(s, ReasonBatchEnd); err != nil {
		t.Fatal(err)
	}
	if p.Borrowing() || p.InUse() != 0 {
		t.Fatal("pool not empty after the last Flush")
	}
	if len(s.got) != len(want) {
		t.Fatalf("sender got %d frames, want %d", len(s.got), len(want))
	}
	for i := range want {
		if !bytes.Equal(s.got[i], want[i]) {
			t.Fatalf("frame %d differs", i)
		}
	}
	if p.Stats().Stalls.Load() == 0 {
		t.Fatal("no stall: the test did not exercise the delayed flush")
	}
}

// Discard releases lent memory too.
func TestVecDiscard(t *testing.T) {
	p := newPool(t, Config{})
	stageVec(t, p, []byte{1, 2, 3}, make([]byte, 1000))
	p.Discard(DropPortError)
	if p.Borrowing() || p.InUse() != 0 || p.Stats().Drops[DropPortError].Load() != 1 {
		t.Fatal("Discard left the vector staged")
	}
}

func TestVecZeroAllocs(t *testing.T) {
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
	body := seqFrame(1, 1460)
	allocs := testing.AllocsPerRun(200, func() {
		for i := 0; i < 64; i++ {
			slot, ok := p.ReserveVec(54, len(body))
			if !ok {
				t.Fatal("ReserveVec failed")
			}
			slot[0] = byte(i)
			p.CommitVec(body)
		}
		if n, _, err := p.Flush(s, ReasonBatchEnd); n != 64 || err != nil {
			t.Fatalf("Flush = %d, %v", n, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per batch of 64 vectors, want 0", allocs)
	}
}

// BenchmarkStageFlushVec is BenchmarkStageFlush with the payload lent instead of copied.
func BenchmarkStageFlushVec(b *testing.B) {
	p := newPool(b, Config{})
	s := &fakeSender{}
	body := seqFrame(1, 1460)
	hdr := make([]byte, 54)
	b.SetBytes(64 * 1514)
	b.ReportAllocs()
	for b.Loop() {
		for i := 0; i < 64; i++ {
			slot, _ := p.ReserveVec(len(hdr), len(body))
			copy(slot, hdr)
			p.CommitVec(body)
		}
		p.Flush(s, ReasonBatchEnd)
	}
}
