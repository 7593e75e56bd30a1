//go:build linux

package vhostuser

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

var frameSizes = []int{60, 61, 64, 100, 511, 1514, 1518, 4000, 9014, 16384, 32768, 65535, 65536}

// txLayouts build one chain (header + frame) from the bytes pkt placed at gpa.
var txLayouts = map[string]func(r *gring, gpa uint64, n int) uint16{
	"one": func(r *gring, gpa uint64, n int) uint16 { return r.addChain([]seg{{gpa, n, false}}) },
	"hdr+frame": func(r *gring, gpa uint64, n int) uint16 {
		return r.addChain([]seg{{gpa, 12, false}, {gpa + 12, n - 12, false}})
	},
	// The header split over two descriptors and the frame starting inside the second
	// (virtio spec "Message Framing": no layout may be assumed).
	"hdr-split": func(r *gring, gpa uint64, n int) uint16 {
		return r.addChain([]seg{{gpa, 5, false}, {gpa + 5, 17, false}, {gpa + 22, n - 22, false}})
	},
	"many": func(r *gring, gpa uint64, n int) uint16 { return r.addChain(pieces(gpa, n, 1+n/40, false)) },
	"indirect": func(r *gring, gpa uint64, n int) uint16 {
		return r.addIndirect(pieces(gpa, n, 1+n/16, false))
	},
}

// pieces cuts [gpa, gpa+n) into at most max descriptors of irregular sizes.
func pieces(gpa uint64, n, max int, write bool) []seg {
	var out []seg
	sz := n / min(max, 64)
	if sz < 1 {
		sz = 1
	}
	for off := 0; off < n; {
		l := min(sz+off%7, n-off)
		if len(out) == min(max, 64)-1 {
			l = n - off
		}
		out = append(out, seg{gpa + uint64(off), l, write})
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
			r, v := h.rings[1], h.vr[1]
			if v.Writable() || v.HdrLen() != 12 {
				t.Fatalf("ring 1: writable=%v hdrlen=%d", v.Writable(), v.HdrLen())
			}
			buf := h.g.alloc(12+65536, 4096)
			iov := make([][]byte, 0, 1024)
			got := make([]byte, 12+65536)
			seed := 0
			for name, lay := range txLayouts {
				for _, n := range frameSizes {
					seed++
					pkt := h.g.at(buf, 12+n)
					fill(pkt, seed)
					head := lay(r, buf, 12+n)
					r.publish(head)
					readEventfd(r.call)
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
					u := r.reap()
					if len(u) != 1 || u[0].id != head || u[0].len != 0 {
						t.Fatalf("%s/%d: used %v", name, n, u)
					}
					if !ei && !readEventfd(r.call) {
						t.Fatalf("%s/%d: no call", name, n)
					}
					if ei {
						// avail_event asks for a kick at the next index.
						if ae := r.availEvent(); ae != r.availIdx {
							t.Fatalf("avail_event %d, want %d", ae, r.availIdx)
						}
					}
				}
			}
			if bases := h.stop(); bases[1] != uint32(r.availIdx) {
				t.Fatalf("TX base %d, want %d", bases[1], r.availIdx)
			}
			if h.b.Stats().Calls.Load() == 0 {
				t.Fatal("no calls counted")
			}
		})
	}
}

// rxPost makes count receive chains of bufSize bytes each, some split into two
// descriptors, and returns the buffers per head.
func rxPost(r *gring, count, bufSize int, pieceMax int, bufs map[uint16][]seg) {
	var heads []uint16
	for i := 0; i < count; i++ {
		a := r.g.alloc(bufSize, 64)
		var segs []seg
		if pieceMax > 1 {
			segs = pieces(a, bufSize, pieceMax, true)
		} else {
			segs = []seg{{a, bufSize, true}}
		}
		h := r.addChain(segs)
		bufs[h] = segs
		heads = append(heads, h)
	}
	r.publish(heads...)
}

func (r *gring) readChain(segs []seg, n int) []byte {
	var out []byte
	for _, s := range segs {
		if n == 0 {
			break
		}
		l := min(n, s.n)
		out = append(out, r.g.at(s.gpa, l)...)
		n -= l
	}
	return out
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
			r, v := h.rings[1], h.vr[1]
			buf := h.g.alloc(2048, 64)
			iov := make([][]byte, 0, 64)
			rng := rand.New(rand.NewPCG(1, 2))
			total, calls := 0, 0
			for total < 70000 {
				nb := 1 + rng.IntN(30)
				heads := make([]uint16, nb)
				for i := range heads {
					heads[i] = r.addChain([]seg{{buf, 12, false}, {buf + 12, 60 + rng.IntN(1400), false}})
				}
				if ei {
					// Ask for a call only once the last of this batch is used.
					r.setUsedEvent(r.availIdx + uint16(nb) - 1)
				} else if rng.IntN(4) == 0 {
					r.setAvailFlags(availFNoInterrupt)
				} else {
					r.setAvailFlags(0)
				}
				noint := !ei && load32(r.avail, 0)&availFNoInterrupt != 0
				r.publish(heads...)
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
					called := readEventfd(r.call)
					if called {
						calls++
					}
					if noint && called {
						t.Fatal("call despite NO_INTERRUPT")
					}
					if ei && want > 0 && total > 0 {
						// Called iff used->idx passed used_event in this batch.
						uidx := uint16(load32(r.used, 0) >> 16)
						want := uidx == r.availIdx
						if called != want {
							t.Fatalf("at %d: called=%v, used idx %d avail %d", total, called, uidx, r.availIdx)
						}
					}
				}
				if u := r.reap(); len(u) != nb {
					t.Fatalf("reaped %d of %d", len(u), nb)
				}
				total += nb
			}
			if b := h.stop(); uint16(b[1]) != r.availIdx || total <= 65536 {
				t.Fatalf("base %d avail %d total %d", b[1], r.availIdx, total)
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
			r, v := h.rings[1], h.vr[1]
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
			buf := h.g.alloc(128, 64)
			for i := 0; i < 500; i++ {
				head := r.addChain([]seg{{buf, 100, false}})
				r.publish(head)
				kickEventfd(r.kick)
				deadline := time.Now().Add(5 * time.Second)
				for len(r.reap()) == 0 {
					if time.Now().After(deadline) {
						t.Fatalf("chain %d not used", i)
					}
					time.Sleep(20 * time.Microsecond)
				}
			}
			h.stop()
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
		{GPA: 0, Size: regAEnd, MmapOffset: 0},
		{GPA: regBBase, Size: 0x100000, MmapOffset: 0x300000},
		{GPA: regBBase + 0x100000, Size: 0x100000, MmapOffset: regBBase},
	}
	g := newGuest(t, layout)
	g.next = regBBase + 0x10000
	h := startSession(t, opts{guest: g})
	r, v := h.rings[1], h.vr[1]
	a := uint64(regBBase + 0x100000 - 100)
	data := make([]byte, 300)
	fill(data, 3)
	copy(g.at(a, 100), data[:100])
	copy(g.at(a+100, 200), data[100:])
	r.publish(r.addChain([]seg{{a, 300, false}}))
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
