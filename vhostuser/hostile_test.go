//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

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
		build  func(r *gring, buf uint64) // writes descriptors and publishes
	}
	d := func(r *gring, i int, addr uint64, n uint32, fl, next uint16) {
		putDesc(r.desc[16*i:], addr, n, fl, next)
	}
	ind := func(r *gring, n int) (uint64, []byte) {
		a := r.g.alloc(16*n, 16)
		return a, r.g.at(a, 16*n)
	}
	cases := []hcase{
		{name: "head", ring: 1, want: RejectHeadRange, build: func(r *gring, b uint64) {
			r.publish(uint16(r.num + 5))
		}},
		{name: "next", ring: 1, want: RejectNextRange, build: func(r *gring, b uint64) {
			d(r, 0, b, 100, descFNext, uint16(r.num))
			r.publish(0)
		}},
		{name: "loop", ring: 1, want: RejectLoop, build: func(r *gring, b uint64) {
			d(r, 0, b, 100, descFNext, 1)
			d(r, 1, b, 100, descFNext, 0)
			r.publish(0)
		}},
		{name: "selfloop", ring: 1, want: RejectLoop, build: func(r *gring, b uint64) {
			d(r, 3, b, 100, descFNext, 3)
			r.publish(3)
		}},
		{name: "zero", ring: 1, want: RejectZeroLen, build: func(r *gring, b uint64) {
			d(r, 0, b, 12, descFNext, 1)
			d(r, 1, b, 0, 0, 0)
			r.publish(0)
		}},
		{name: "tx-writable", ring: 1, want: RejectDirection, build: func(r *gring, b uint64) {
			d(r, 0, b, 12, descFNext, 1)
			d(r, 1, b, 100, descFWrite, 0)
			r.publish(0)
		}},
		{name: "rx-readable", ring: 0, want: RejectDirection, build: func(r *gring, b uint64) {
			d(r, 0, b, 1536, 0, 0)
			r.publish(0)
		}},
		{name: "avail-jump", ring: 1, want: RejectAvailJump, build: func(r *gring, b uint64) {
			d(r, 0, b, 100, 0, 0)
			r.availIdx = uint16(r.num + 1)
			store32(r.avail, 0, uint32(r.availIdx)<<16)
		}},
		{name: "hole", ring: 1, want: RejectAddress, build: func(r *gring, b uint64) {
			d(r, 0, regAEnd+0x100, 100, 0, 0)
			r.publish(0)
		}},
		{name: "into-hole", ring: 1, want: RejectAddress, build: func(r *gring, b uint64) {
			d(r, 0, regAEnd-50, 100, 0, 0) // starts mapped, runs into the hole
			r.publish(0)
		}},
		{name: "beyond", ring: 1, want: RejectAddress, build: func(r *gring, b uint64) {
			d(r, 0, memSize-50, 100, 0, 0)
			r.publish(0)
		}},
		{name: "wrap-addr", ring: 1, want: RejectLenOverflow, build: func(r *gring, b uint64) {
			d(r, 0, math.MaxUint64-10, 100, 0, 0)
			r.publish(0)
		}},
		{name: "chain-len", ring: 1, want: RejectLenOverflow, build: func(r *gring, b uint64) {
			d(r, 0, b, 100, descFNext, 1)
			d(r, 1, b, math.MaxUint32, 0, 0)
			r.publish(0)
		}},
		{name: "short", ring: 1, want: RejectShortChain, build: func(r *gring, b uint64) {
			d(r, 0, b, 5, descFNext, 1)
			d(r, 1, b, 6, 0, 0)
			r.publish(0)
		}},
		{name: "rx-short", ring: 0, want: RejectShortChain, build: func(r *gring, b uint64) {
			d(r, 0, b, 8, descFWrite, 0)
			r.publish(0)
		}},
		{name: "indirect-not-acked", ring: 1, ack: featsDefault &^ (1 << virtio.RingIndirectDesc),
			want: RejectIndirect, build: func(r *gring, b uint64) {
				ta, t := ind(r, 1)
				putDesc(t, b, 100, 0, 0)
				d(r, 0, ta, 16, descFIndirect, 0)
				r.publish(0)
			}},
		{name: "indirect-len", ring: 1, want: RejectIndirect, build: func(r *gring, b uint64) {
			ta, _ := ind(r, 2)
			d(r, 0, ta, 24, descFIndirect, 0)
			r.publish(0)
		}},
		{name: "indirect-zero", ring: 1, want: RejectIndirect, build: func(r *gring, b uint64) {
			d(r, 0, b, 0, descFIndirect, 0)
			r.publish(0)
		}},
		{name: "indirect-huge", ring: 1, want: RejectIndirect, build: func(r *gring, b uint64) {
			ta, _ := ind(r, r.num+1)
			d(r, 0, ta, uint32(16*(r.num+1)), descFIndirect, 0)
			r.publish(0)
		}},
		{name: "indirect-next", ring: 1, want: RejectIndirect, build: func(r *gring, b uint64) {
			ta, t := ind(r, 1)
			putDesc(t, b, 100, 0, 0)
			d(r, 0, ta, 16, descFIndirect|descFNext, 1)
			d(r, 1, b, 100, 0, 0)
			r.publish(0)
		}},
		{name: "indirect-nested", ring: 1, want: RejectIndirect, build: func(r *gring, b uint64) {
			ta, t := ind(r, 2)
			tb, t2 := ind(r, 1)
			putDesc(t2, b, 100, 0, 0)
			putDesc(t, b, 12, descFNext, 1)
			putDesc(t[16:], tb, 16, descFIndirect, 0)
			d(r, 0, ta, 32, descFIndirect, 0)
			r.publish(0)
		}},
		{name: "indirect-not-head", ring: 1, want: RejectIndirect, build: func(r *gring, b uint64) {
			ta, t := ind(r, 1)
			putDesc(t, b, 100, 0, 0)
			d(r, 0, b, 12, descFNext, 1)
			d(r, 1, ta, 16, descFIndirect, 0)
			r.publish(0)
		}},
		{name: "indirect-next-range", ring: 1, want: RejectNextRange, build: func(r *gring, b uint64) {
			ta, t := ind(r, 2)
			putDesc(t, b, 12, descFNext, 2)
			d(r, 0, ta, 32, descFIndirect, 0)
			r.publish(0)
		}},
		{name: "indirect-loop", ring: 1, want: RejectLoop, build: func(r *gring, b uint64) {
			ta, t := ind(r, 2)
			putDesc(t, b, 12, descFNext, 1)
			putDesc(t[16:], b, 12, descFNext, 0)
			d(r, 0, ta, 32, descFIndirect, 0)
			r.publish(0)
		}},
		{name: "indirect-table-unmapped", ring: 1, want: RejectAddress, build: func(r *gring, b uint64) {
			d(r, 0, regAEnd+0x10, 32, descFIndirect, 0)
			r.publish(0)
		}},
		{name: "iov-full", ring: 1, iovCap: 4, want: RejectIovFull, build: func(r *gring, b uint64) {
			for i := 0; i < 6; i++ {
				d(r, i, b+uint64(20*i), 20, descFNext, uint16(i+1))
			}
			d(r, 6, b+200, 20, 0, 0)
			r.publish(0)
		}},
	}
	stats := new(Stats)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := stats.Rejected[tc.want].Load()
			h := startSession(t, opts{ack: tc.ack, stats: stats})
			r, v := h.rings[tc.ring], h.vr[tc.ring]
			buf := h.g.alloc(4096, 64)
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
			if !readEventfd(r.errfd) {
				t.Fatal("err eventfd not written")
			}
			// Nothing was consumed: QEMU restarts from the offending chain.
			if b := h.stop(); b[tc.ring] != 0 {
				t.Fatalf("base %d", b[tc.ring])
			}
			if err := h.close(); err != nil {
				t.Fatalf("session: %v", err)
			}
			// The next session works.
			h2 := startSession(t, opts{stats: stats})
			r2, v2 := h2.rings[1], h2.vr[1]
			b2 := h2.g.alloc(256, 64)
			r2.publish(r2.addChain([]seg{{b2, 100, false}}))
			batch(t, v2, func() {
				c, err := v2.Pop(iov[:0:cap(iov)])
				if err != nil {
					t.Fatalf("next session: %v", err)
				}
				v2.Push(c.Head, 0)
			})
			if len(r2.reap()) != 1 {
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
		mod  func(p []byte, r *gring)
	}{
		{"desc-in-hole", func(p []byte, r *gring) { binary.LittleEndian.PutUint64(p[8:], r.g.regions[0].UserAddr+regAEnd) }},
		{"used-past-end", func(p []byte, r *gring) {
			binary.LittleEndian.PutUint64(p[16:], r.g.regions[1].UserAddr+r.g.regions[1].Size-8)
		}},
		{"avail-misaligned", func(p []byte, r *gring) { binary.LittleEndian.PutUint64(p[24:], r.g.qva(r.availA)+2) }},
		{"desc-crosses-regions", func(p []byte, r *gring) {
			binary.LittleEndian.PutUint64(p[8:], r.g.regions[0].UserAddr+regAEnd-16*16)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stats := new(Stats)
			h := startSession(t, opts{skipKick: true, stats: stats})
			r := h.rings[1]
			p := addrPayload(r)
			tc.mod(p, r)
			h.fe.send(ReqSetVringAddr, vuproto.FlagVersion, p)
			h.fe.send(ReqSetVringKick, vuproto.FlagVersion, u64(1), r.kick)
			h.fe.get(ReqGetFeatures)
			if n := stats.Rejected[RejectRingAddr].Load(); n != 1 {
				t.Fatalf("ring_addr = %d", n)
			}
			select {
			case v := <-h.rec.started:
				t.Fatalf("ring %d started", v.Index())
			default:
			}
			h.stop()
		})
	}
}
