//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

// Each case makes the guest break one rule; the chain must be rejected with that
// reason, counted, the ring stopped (Begin → ErrBroken), the err eventfd written, and
// GET_VRING_BASE and a fresh session must still work.
func TestHostile(t *testing.T) {
	type hcase struct {
		name   string
		ring   int
		ack    uint64
		iovCap int
		want   Reason
		build  func(r *vhostusertest.Ring, buf uint64) // writes descriptors and publishes
	}
	d := func(r *vhostusertest.Ring, i int, addr uint64, n uint32, fl, next uint16) {
		vhostusertest.PutDesc(r.Desc[16*i:], addr, n, fl, next)
	}
	ind := func(r *vhostusertest.Ring, n int) (uint64, []byte) {
		a := r.G.Alloc(16*n, 16)
		return a, r.G.At(a, 16*n)
	}
	cases := []hcase{
		{name: "head", ring: 1, want: RejectHeadRange, build: func(r *vhostusertest.Ring, b uint64) {
			r.Publish(uint16(r.Num + 5))
		}},
		{name: "next", ring: 1, want: RejectNextRange, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 100, descFNext, uint16(r.Num))
			r.Publish(0)
		}},
		{name: "loop", ring: 1, want: RejectLoop, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 100, descFNext, 1)
			d(r, 1, b, 100, descFNext, 0)
			r.Publish(0)
		}},
		{name: "selfloop", ring: 1, want: RejectLoop, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 3, b, 100, descFNext, 3)
			r.Publish(3)
		}},
		{name: "zero", ring: 1, want: RejectZeroLen, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 12, descFNext, 1)
			d(r, 1, b, 0, 0, 0)
			r.Publish(0)
		}},
		{name: "tx-writable", ring: 1, want: RejectDirection, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 12, descFNext, 1)
			d(r, 1, b, 100, descFWrite, 0)
			r.Publish(0)
		}},
		{name: "rx-readable", ring: 0, want: RejectDirection, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 1536, 0, 0)
			r.Publish(0)
		}},
		{name: "avail-jump", ring: 1, want: RejectAvailJump, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 100, 0, 0)
			store32(r.Avail, 0, uint32(r.Num+1)<<16) // avail->idx num+1 ahead of used
		}},
		{name: "hole", ring: 1, want: RejectAddress, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, vhostusertest.RegionAEnd+0x100, 100, 0, 0)
			r.Publish(0)
		}},
		{name: "into-hole", ring: 1, want: RejectAddress, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, vhostusertest.RegionAEnd-50, 100, 0, 0) // starts mapped, runs into the hole
			r.Publish(0)
		}},
		{name: "beyond", ring: 1, want: RejectAddress, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, memSize-50, 100, 0, 0)
			r.Publish(0)
		}},
		{name: "wrap-addr", ring: 1, want: RejectLenOverflow, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, math.MaxUint64-10, 100, 0, 0)
			r.Publish(0)
		}},
		{name: "chain-len", ring: 1, want: RejectLenOverflow, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 100, descFNext, 1)
			d(r, 1, b, math.MaxUint32, 0, 0)
			r.Publish(0)
		}},
		{name: "short", ring: 1, want: RejectShortChain, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 5, descFNext, 1)
			d(r, 1, b, 6, 0, 0)
			r.Publish(0)
		}},
		{name: "rx-short", ring: 0, want: RejectShortChain, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 8, descFWrite, 0)
			r.Publish(0)
		}},
		{name: "indirect-not-acked", ring: 1, ack: featsDefault &^ (1 << virtio.RingIndirectDesc),
			want: RejectIndirect, build: func(r *vhostusertest.Ring, b uint64) {
				ta, t := ind(r, 1)
				vhostusertest.PutDesc(t, b, 100, 0, 0)
				d(r, 0, ta, 16, descFIndirect, 0)
				r.Publish(0)
			}},
		{name: "indirect-len", ring: 1, want: RejectIndirect, build: func(r *vhostusertest.Ring, b uint64) {
			ta, _ := ind(r, 2)
			d(r, 0, ta, 24, descFIndirect, 0)
			r.Publish(0)
		}},
		{name: "indirect-zero", ring: 1, want: RejectIndirect, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, b, 0, descFIndirect, 0)
			r.Publish(0)
		}},
		{name: "indirect-huge", ring: 1, want: RejectIndirect, build: func(r *vhostusertest.Ring, b uint64) {
			ta, _ := ind(r, r.Num+1)
			d(r, 0, ta, uint32(16*(r.Num+1)), descFIndirect, 0)
			r.Publish(0)
		}},
		{name: "indirect-next", ring: 1, want: RejectIndirect, build: func(r *vhostusertest.Ring, b uint64) {
			ta, t := ind(r, 1)
			vhostusertest.PutDesc(t, b, 100, 0, 0)
			d(r, 0, ta, 16, descFIndirect|descFNext, 1)
			d(r, 1, b, 100, 0, 0)
			r.Publish(0)
		}},
		{name: "indirect-nested", ring: 1, want: RejectIndirect, build: func(r *vhostusertest.Ring, b uint64) {
			ta, t := ind(r, 2)
			tb, t2 := ind(r, 1)
			vhostusertest.PutDesc(t2, b, 100, 0, 0)
			vhostusertest.PutDesc(t, b, 12, descFNext, 1)
			vhostusertest.PutDesc(t[16:], tb, 16, descFIndirect, 0)
			d(r, 0, ta, 32, descFIndirect, 0)
			r.Publish(0)
		}},
		{name: "indirect-not-head", ring: 1, want: RejectIndirect, build: func(r *vhostusertest.Ring, b uint64) {
			ta, t := ind(r, 1)
			vhostusertest.PutDesc(t, b, 100, 0, 0)
			d(r, 0, b, 12, descFNext, 1)
			d(r, 1, ta, 16, descFIndirect, 0)
			r.Publish(0)
		}},
		{name: "indirect-next-range", ring: 1, want: RejectNextRange, build: func(r *vhostusertest.Ring, b uint64) {
			ta, t := ind(r, 2)
			vhostusertest.PutDesc(t, b, 12, descFNext, 2)
			d(r, 0, ta, 32, descFIndirect, 0)
			r.Publish(0)
		}},
		{name: "indirect-loop", ring: 1, want: RejectLoop, build: func(r *vhostusertest.Ring, b uint64) {
			ta, t := ind(r, 2)
			vhostusertest.PutDesc(t, b, 12, descFNext, 1)
			vhostusertest.PutDesc(t[16:], b, 12, descFNext, 0)
			d(r, 0, ta, 32, descFIndirect, 0)
			r.Publish(0)
		}},
		{name: "indirect-table-unmapped", ring: 1, want: RejectAddress, build: func(r *vhostusertest.Ring, b uint64) {
			d(r, 0, vhostusertest.RegionAEnd+0x10, 32, descFIndirect, 0)
			r.Publish(0)
		}},
		{name: "iov-full", ring: 1, iovCap: 4, want: RejectIovFull, build: func(r *vhostusertest.Ring, b uint64) {
			for i := 0; i < 6; i++ {
				d(r, i, b+uint64(20*i), 20, descFNext, uint16(i+1))
			}
			d(r, 6, b+200, 20, 0, 0)
			r.Publish(0)
		}},
	}
	stats := new(Stats)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := stats.Rejected[tc.want].Load()
			h := startSession(t, opts{ack: tc.ack, stats: stats})
			r, v := h.Rings[tc.ring], h.vr[tc.ring]
			buf := h.G.Alloc(4096, 64)
			tc.build(r, buf)
			iov := make([][]byte, 0, max(tc.iovCap, 1))
			if tc.iovCap == 0 {
				iov = make([][]byte, 0, 1024)
			}
			if err := v.Begin(); err != nil {
				t.Fatal(err)
			}
			_, err := v.Pop(iov)
			var re *RingError
			if !errors.As(err, &re) || re.Reason != tc.want || !errors.Is(err, ErrBroken) {
				t.Fatalf("Pop: %v, want %v", err, tc.want)
			}
			if _, err := v.Pop(iov); !errors.Is(err, ErrBroken) {
				t.Fatalf("second Pop: %v", err)
			}
			v.End()
			if got := stats.Rejected[tc.want].Load(); got != before+1 {
				t.Fatalf("counter %v = %d, want %d", tc.want, got, before+1)
			}
			if err := v.Begin(); !errors.Is(err, ErrBroken) {
				t.Fatalf("Begin after violation: %v", err)
			}
			if err := v.Wait(); !errors.Is(err, ErrBroken) {
				t.Fatalf("Wait after violation: %v", err)
			}
			if !r.Errored() {
				t.Fatal("err eventfd not written")
			}
			// Nothing was consumed: QEMU restarts from the offending chain.
			if b := h.Stop(); b[tc.ring] != 0 {
				t.Fatalf("base %d", b[tc.ring])
			}
			if err := h.Close(); err != nil {
				t.Fatalf("session: %v", err)
			}
			// The next session works.
			h2 := startSession(t, opts{stats: stats})
			r2, v2 := h2.Rings[1], h2.vr[1]
			b2 := h2.G.Alloc(256, 64)
			r2.Publish(r2.AddChain([]vhostusertest.Seg{{GPA: b2, Len: 100}}))
			batch(t, v2, func() {
				c, err := v2.Pop(iov[:0:cap(iov)])
				if err != nil {
					t.Fatalf("next session: %v", err)
				}
				v2.Push(c.Head, 0)
			})
			if len(r2.Reap()) != 1 {
				t.Fatal("next session: no used entry")
			}
		})
	}
}

// TestRingAddr: ring addresses that do not translate (or are misaligned) are refused
// at start: counted as ring_addr, no RingStarted, and GET_VRING_BASE still answers.
func TestRingAddr(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(p []byte, r *vhostusertest.Ring)
	}{
		{"desc-in-hole", func(p []byte, r *vhostusertest.Ring) {
			binary.LittleEndian.PutUint64(p[8:], r.G.Regions[0].UserAddr+vhostusertest.RegionAEnd)
		}},
		{"used-past-end", func(p []byte, r *vhostusertest.Ring) {
			binary.LittleEndian.PutUint64(p[16:], r.G.Regions[1].UserAddr+r.G.Regions[1].Size-8)
		}},
		{"avail-misaligned", func(p []byte, r *vhostusertest.Ring) { binary.LittleEndian.PutUint64(p[24:], r.G.QVA(r.AvailA)+2) }},
		{"desc-crosses-regions", func(p []byte, r *vhostusertest.Ring) {
			binary.LittleEndian.PutUint64(p[8:], r.G.Regions[0].UserAddr+vhostusertest.RegionAEnd-16*16)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stats := new(Stats)
			h := startSession(t, opts{skipKick: true, stats: stats})
			r := h.Rings[1]
			p := vhostusertest.AddrPayload(r)
			tc.mod(p, r)
			h.FE.Send(ReqSetVringAddr, vuproto.FlagVersion, p)
			h.FE.Send(ReqSetVringKick, vuproto.FlagVersion, vhostusertest.U64(1), r.Kick)
			h.FE.Get(ReqGetFeatures)
			if n := stats.Rejected[RejectRingAddr].Load(); n != 1 {
				t.Fatalf("ring_addr = %d", n)
			}
			select {
			case v := <-h.rec.started:
				t.Fatalf("ring %d started", v.Index())
			default:
			}
			h.Stop()
		})
	}
}
