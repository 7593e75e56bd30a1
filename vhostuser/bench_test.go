//go:build linux

package vhostuser

import (
	"encoding/binary"
	"testing"
)

// republish puts heads back on the avail ring without the test allocator (0 allocs on
// the guest side too, so -benchmem measures the back-end).
func (r *gring) republish(heads []uint16) {
	for _, h := range heads {
		binary.LittleEndian.PutUint16(r.avail[4+2*(int(r.availIdx)%r.num):], h)
		r.availIdx++
	}
	store32(r.avail, 0, uint32(r.availIdx)<<16)
}

// BenchmarkTX pops and pushes TX chains (header descriptor + frame descriptor), batch
// chains per Begin/End, one call per batch. ns/op and allocs/op are per chain.
func BenchmarkTX(b *testing.B) {
	for _, bs := range []int{1, 32} {
		b.Run(map[int]string{1: "batch1", 32: "batch32"}[bs], func(b *testing.B) {
			h := startSession(b, opts{num: 256})
			r, v := h.rings[1], h.vr[1]
			buf := h.g.alloc(1600, 64)
			heads := make([]uint16, bs)
			for i := range heads {
				heads[i] = r.addChain([]seg{{buf, 12, false}, {buf + 12, 1514, false}})
			}
			iov := make([][]byte, 0, 64)
			b.ReportAllocs()
			b.SetBytes(1526)
			b.ResetTimer()
			for i := 0; i < b.N; i += bs { // one op = one chain
				r.republish(heads)
				if err := v.Begin(); err != nil {
					b.Fatal(err)
				}
				for range heads {
					c, err := v.Pop(iov)
					if err != nil {
						b.Fatal(err)
					}
					v.Push(c.Head, 0)
				}
				v.End()
				readEventfd(r.call)
			}
		})
	}
}

// BenchmarkRX reserves mergeable 1536-byte buffers for 1514-byte frames (32 per batch)
// and 64 KiB frames (43 buffers each, one per batch), copies the frame in, and commits
// (num_buffers, used entries, one publish per batch). ns/op and allocs/op are per frame.
func BenchmarkRX(b *testing.B) {
	for _, n := range []int{1514, 65536} {
		b.Run(map[int]string{1514: "1514", 65536: "64k"}[n], func(b *testing.B) {
			h := startSession(b, opts{num: 256})
			r, v := h.rings[0], h.vr[0]
			heads := make([]uint16, 128)
			for i := range heads {
				heads[i] = r.addChain([]seg{{h.g.alloc(1536, 64), 1536, true}})
			}
			frame := make([]byte, 12+n)
			per := (len(frame) + 1535) / 1536 // chains per frame
			frames := max(1, 32/per)          // frames per batch
			iov := make([][]byte, 0, 128)
			cur := 0
			b.ReportAllocs()
			b.SetBytes(int64(n))
			b.ResetTimer()
			for i := 0; i < b.N; i += frames {
				for j := 0; j < per*frames; j++ {
					r.republish(heads[cur : cur+1])
					cur = (cur + 1) % len(heads)
				}
				if err := v.Begin(); err != nil {
					b.Fatal(err)
				}
				for f := 0; f < frames; f++ {
					segs, _, err := v.ReserveRX(len(frame), iov)
					if err != nil {
						b.Fatal(err)
					}
					CopyTo(segs, frame)
					if v.CommitRX(len(frame)) != per {
						b.Fatal("chains")
					}
				}
				v.End()
				readEventfd(r.call)
			}
		})
	}
}
