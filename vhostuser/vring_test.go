//go:build linux

package vhostuser

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

var frameSizes = []int{60, 61, 64, 100, 511, 1514, 1518, 4000, 9014, 16384, 32768, 65535, 65536}

// txLayouts build one chain (header + frame) from the bytes pkt placed at gpa.
var txLayouts = map[string]func(r *vhostusertest.Ring, gpa uint64, n int) uint16{
	"one": func(r *vhostusertest.Ring, gpa uint64, n int) uint16 {
		return r.AddChain([]vhostusertest.Seg{{GPA: gpa, Len: n}})
	},
	"hdr+frame": func(r *vhostusertest.Ring, gpa uint64, n int) uint16 {
		return r.AddChain([]vhostusertest.Seg{{GPA: gpa, Len: 12}, {GPA: gpa + 12, Len: n - 12}})
	},
	// The header split over two descriptors and the frame starting inside the second
	// (virtio spec "Message Framing": no layout may be assumed).
	"hdr-split": func(r *vhostusertest.Ring, gpa uint64, n int) uint16 {
		return r.AddChain([]vhostusertest.Seg{{GPA: gpa, Len: 5}, {GPA: gpa + 5, Len: 17}, {GPA: gpa + 22, Len: n - 22}})
	},
	"many": func(r *vhostusertest.Ring, gpa uint64, n int) uint16 {
		return r.AddChain(pieces(gpa, n, 1+n/40, false))
	},
	"indirect": func(r *vhostusertest.Ring, gpa uint64, n int) uint16 {
		return r.AddIndirect(pieces(gpa, n, 1+n/16, false))
	},
}

// pieces cuts [gpa, gpa+n) into at most max descriptors of irregular sizes.
func pieces(gpa uint64, n, max int, write bool) []vhostusertest.Seg {
	var out []vhostusertest.Seg
	sz := n / min(max, 64)
	if sz < 1 {
		sz = 1
	}
	for off := 0; off < n; {
		l := min(sz+off%7, n-off)
		if len(out) == min(max, 64)-1 {
			l = n - off
		}
		out = append(out, vhostusertest.Seg{GPA: gpa + uint64(off), Len: l, Write: write})
		off += l
	}
	return out
}

func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(i*7 + seed)
	}
}

func TestTXFrames(t *testing.T) {
	for _, ei := range []bool{true, false} {
		t.Run(fmt.Sprintf("eventidx=%v", ei), func(t *testing.T) {
			ack := uint64(featsDefault)
			if !ei {
				ack &^= 1 << virtio.RingEventIdx
			}
			h := startSession(t, opts{ack: ack})
			r, v := h.Rings[1], h.vr[1]
			if v.Writable() || v.HdrLen() != 12 {
				t.Fatalf("ring 1: writable=%v hdrlen=%d", v.Writable(), v.HdrLen())
			}
			buf := h.G.Alloc(12+65536, 4096)
			iov := make([][]byte, 0, 1024)
			got := make([]byte, 12+65536)
			seed := 0
			for name, lay := range txLayouts {
				for _, n := range frameSizes {
					seed++
					pkt := h.G.At(buf, 12+n)
					fill(pkt, seed)
					head := lay(r, buf, 12+n)
					r.Publish(head)
					r.Called()
					batch(t, v, func() {
						c, err := v.Pop(iov)
						if err != nil {
							t.Fatalf("%s/%d: Pop: %v", name, n, err)
						}
						if c.Head != head || c.Len != 12+n {
							t.Fatalf("%s/%d: chain head %d len %d", name, n, c.Head, c.Len)
						}
						if k := CopyFrom(got[:c.Len], c.Iov, 0); k != c.Len || !bytes.Equal(got[:k], pkt) {
							t.Fatalf("%s/%d: gathered bytes differ", name, n)
						}
						if _, err := v.Pop(iov); err != ErrEmpty {
							t.Fatalf("second Pop: %v", err)
						}
						v.Push(c.Head, 0)
					})
					u := r.Reap()
					if len(u) != 1 || u[0].ID != head || u[0].Len != 0 {
						t.Fatalf("%s/%d: used %v", name, n, u)
					}
					if !ei && !r.Called() {
						t.Fatalf("%s/%d: no call", name, n)
					}
					if ei {
						// End leaves kicks off (avail_event behind last_avail_idx);
						// only a worker about to sleep enables them (Wait).
						if ae := r.AvailEvent(); ae == r.AvailIdx() {
							t.Fatalf("avail_event %d: End enabled kicks", ae)
						}
					}
				}
			}
			if bases := h.Stop(); bases[1] != uint32(r.AvailIdx()) {
				t.Fatalf("TX base %d, want %d", bases[1], r.AvailIdx())
			}
			if h.b.Stats().Calls.Load() == 0 {
				t.Fatal("no calls counted")
			}
		})
	}
}

// rxPost makes count receive chains of bufSize bytes each, some split into two
// descriptors, and returns the buffers per head.
func rxPost(r *vhostusertest.Ring, count, bufSize int, pieceMax int, bufs map[uint16][]vhostusertest.Seg) {
	var heads []uint16
	for i := 0; i < count; i++ {
		a := r.G.Alloc(bufSize, 64)
		var segs []vhostusertest.Seg
		if pieceMax > 1 {
			segs = pieces(a, bufSize, pieceMax, true)
		} else {
			segs = []vhostusertest.Seg{{GPA: a, Len: bufSize, Write: true}}
		}
		h := r.AddChain(segs)
		bufs[h] = segs
		heads = append(heads, h)
	}
	r.Publish(heads...)
}

// Receiving into several chains per frame (MRG_RXBUF, num_buffers) is the net
// device's, and tested with it (vhostnet TestReservation, TestReservationShortage).

// TestWrap pushes more than 65536 chains through a ring so the free-running 16-bit
// indices wrap, with and without EVENT_IDX, and checks the call rules.
func TestWrap(t *testing.T) {
	for _, ei := range []bool{true, false} {
		t.Run(fmt.Sprintf("eventidx=%v", ei), func(t *testing.T) {
			ack := uint64(featsDefault)
			if !ei {
				ack &^= 1 << virtio.RingEventIdx
			}
			h := startSession(t, opts{ack: ack, num: 64})
			r, v := h.Rings[1], h.vr[1]
			buf := h.G.Alloc(2048, 64)
			iov := make([][]byte, 0, 64)
			rng := rand.New(rand.NewPCG(1, 2))
			total, calls := 0, 0
			for total < 70000 {
				nb := 1 + rng.IntN(30)
				heads := make([]uint16, nb)
				for i := range heads {
					heads[i] = r.AddChain([]vhostusertest.Seg{{GPA: buf, Len: 12}, {GPA: buf + 12, Len: 60 + rng.IntN(1400)}})
				}
				if ei {
					// Ask for a call only once the last of this batch is used.
					r.SetUsedEvent(r.AvailIdx() + uint16(nb) - 1)
				} else if rng.IntN(4) == 0 {
					r.SetAvailFlags(availFNoInterrupt)
				} else {
					r.SetAvailFlags(0)
				}
				noint := !ei && load32(r.Avail, 0)&availFNoInterrupt != 0
				r.Publish(heads...)
				// Consume in two batches so a call can fall in either.
				half := nb / 2
				for _, want := range []int{half, nb - half} {
					batch(t, v, func() {
						for i := 0; i < want; i++ {
							c, err := v.Pop(iov)
							if err != nil {
								t.Fatalf("Pop at %d: %v", total, err)
							}
							v.Push(c.Head, 0)
						}
					})
					called := r.Called()
					if called {
						calls++
					}
					if noint && called {
						t.Fatal("call despite NO_INTERRUPT")
					}
					if ei && want > 0 && total > 0 {
						// Called iff used->idx passed used_event in this batch.
						uidx := uint16(load32(r.Used, 0) >> 16)
						want := uidx == r.AvailIdx()
						if called != want {
							t.Fatalf("at %d: called=%v, used idx %d avail %d", total, called, uidx, r.AvailIdx())
						}
					}
				}
				if u := r.Reap(); len(u) != nb {
					t.Fatalf("reaped %d of %d", len(u), nb)
				}
				total += nb
			}
			if b := h.Stop(); uint16(b[1]) != r.AvailIdx() || total <= 65536 {
				t.Fatalf("base %d avail %d total %d", b[1], r.AvailIdx(), total)
			}
			t.Logf("%d chains, %d calls", total, calls)
		})
	}
}

// TestWorkerKick runs a real worker goroutine that sleeps in Wait on the kick eventfd,
// as the data path will, and a guest that kicks.
func TestWorkerKick(t *testing.T) {
	for _, ei := range []bool{true, false} {
		t.Run(fmt.Sprintf("eventidx=%v", ei), func(t *testing.T) {
			ack := uint64(featsDefault)
			if !ei {
				ack &^= 1 << virtio.RingEventIdx
			}
			h := startSession(t, opts{ack: ack})
			r, v := h.Rings[1], h.vr[1]
			done := make(chan error, 1)
			var popped int
			go func() {
				iov := make([][]byte, 0, 16)
				for {
					if err := v.Wait(); err != nil {
						done <- err
						return
					}
					if err := v.Begin(); err != nil {
						done <- err
						return
					}
					for {
						c, err := v.Pop(iov)
						if err != nil {
							break
						}
						popped++
						v.Push(c.Head, 0)
					}
					v.End()
				}
			}()
			buf := h.G.Alloc(128, 64)
			for i := 0; i < 500; i++ {
				head := r.AddChain([]vhostusertest.Seg{{GPA: buf, Len: 100}})
				r.Publish(head)
				r.KickNow()
				deadline := time.Now().Add(5 * time.Second)
				for len(r.Reap()) == 0 {
					if time.Now().After(deadline) {
						t.Fatalf("chain %d not used", i)
					}
					time.Sleep(20 * time.Microsecond)
				}
			}
			h.Stop()
			select {
			case err := <-done:
				if !errors.Is(err, ErrStopped) {
					t.Fatalf("worker ended with %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("worker not woken by the stop")
			}
			if popped != 500 || h.b.Stats().Kicks.Load() == 0 {
				t.Fatalf("popped %d, kicks %d", popped, h.b.Stats().Kicks.Load())
			}
		})
	}
}

// TestCrossRegion: a buffer contiguous in guest-physical space but spanning two
// regions (backed by unrelated fd offsets) becomes two iovecs with the right bytes.
func TestCrossRegion(t *testing.T) {
	layout := []vuproto.MemRegion{
		{GPA: 0, Size: vhostusertest.RegionAEnd, MmapOffset: 0},
		{GPA: vhostusertest.RegionBBase, Size: 0x100000, MmapOffset: 0x300000},
		{GPA: vhostusertest.RegionBBase + 0x100000, Size: 0x100000, MmapOffset: vhostusertest.RegionBBase},
	}
	g := vhostusertest.NewGuest(t, memSize, layout)
	h := startSession(t, opts{guest: g})
	r, v := h.Rings[1], h.vr[1]
	a := uint64(vhostusertest.RegionBBase + 0x100000 - 100)
	data := make([]byte, 300)
	fill(data, 3)
	copy(g.At(a, 100), data[:100])
	copy(g.At(a+100, 200), data[100:])
	r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: a, Len: 300}}))
	iov := make([][]byte, 0, 8)
	batch(t, v, func() {
		c, err := v.Pop(iov)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Iov) != 2 || len(c.Iov[0]) != 100 || len(c.Iov[1]) != 200 {
			t.Fatalf("iov lens %d", len(c.Iov))
		}
		got := make([]byte, 300)
		CopyFrom(got, c.Iov, 0)
		if !bytes.Equal(got, data) {
			t.Fatal("bytes differ")
		}
		v.Push(c.Head, 0)
	})
}
