package coalescer

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"testing"

	"tapgro/vnethdr"
)

// runBatches feeds batch (frames with headroom) then Flush, b.N times, and reports
// ns/segment. One op = one batch.
func runBatches(b *testing.B, cfg Config, batch [][]byte, payload int) {
	cfg.VnetHdrLen = vnethdr.Len
	c := New(cfg, func([]byte) {})
	b.SetBytes(int64(payload))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, buf := range batch {
			c.Add(buf, nil, 0)
		}
		c.Flush()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch)), "ns/segment")
	st := c.Stats()
	b.ReportMetric(float64(st.Segments.Load())/float64(st.Packets.Load()), "segs/packet")
}

// BenchmarkInOrder: one TCPv4 flow, 44 × 1448-byte segments per batch (one 64 KB
// aggregate after 45 would hit the size cap; 44 keeps every batch one packet).
func BenchmarkInOrder(b *testing.B) {
	f := newFlow("tcp4")
	var batch [][]byte
	for range 44 {
		batch = append(batch, withHeadroom(f.Seg(mss)))
	}
	runBatches(b, Config{}, batch, 44*mss)
}

// BenchmarkAddEmit is Add+emit per segment (ns/op is per segment) on one TCPv4 flow of
// 1448-byte segments, 45 per 64 KB packet: copy is Add (each payload copied into the
// aggregate as its checksum is verified), ref is AddRef (checksum verified in place,
// payload referenced, the packet handed to emitV as 46 iovecs). The frames stay in
// their buffers, so nothing is released; emit does nothing.
func BenchmarkAddEmit(b *testing.B) {
	f := newFlow("tcp4")
	bufs := make([][]byte, 45*8)
	for i := range bufs {
		bufs[i] = withHeadroom(f.Seg(mss))
	}
	for _, mode := range []string{"copy", "ref"} {
		b.Run(mode, func(b *testing.B) {
			c := New(Config{VnetHdrLen: vnethdr.Len, RefTags: len(bufs)}, func([]byte) {})
			c.SetEmitV(func([][]byte) {})
			b.SetBytes(mss)
			b.ReportAllocs()
			k := 0
			for b.Loop() {
				if mode == "ref" {
					c.AddRef(bufs[k], nil, 0, k)
				} else {
					c.Add(bufs[k], nil, 0)
				}
				if k++; k == len(bufs) {
					k = 0 // the flow starts over: out of order, a new aggregate
				}
			}
			c.Flush()
			st := c.Stats()
			b.ReportMetric(float64(st.Segments.Load())/float64(st.Packets.Load()), "segs/packet")
		})
	}
}

// BenchmarkGatherAdd is what a vhost-user back-end pays per guest segment to run it
// through GRO: the frame (1514 bytes, one TCPv4 flow, 44 per batch, then Flush) lies in
// "guest memory" in two pieces (a 66-byte and a 1448-byte descriptor), and its first
// 512 bytes (vhostnet's validatePrefix) are already private. gather copies the rest into
// the private buffer and calls Add, which copies the payload again into the aggregate;
// split is AddSplit, which copies it from guest memory into the aggregate once. Per
// segment, checksums verified (no NEEDS_CSUM).
func BenchmarkGatherAdd(b *testing.B) {
	const prefix = 512
	f := newFlow("tcp4")
	var guest [][][]byte // per frame: its two descriptors
	for range 44 {
		seg := f.Seg(mss)
		guest = append(guest, [][]byte{append([]byte(nil), seg[:66]...), append([]byte(nil), seg[66:]...)})
	}
	flen := 66 + mss
	for _, mode := range []string{"gather", "split"} {
		b.Run(mode, func(b *testing.B) {
			c := New(Config{VnetHdrLen: vnethdr.Len}, func([]byte) {})
			buf := make([]byte, vnethdr.Len+flen)
			rest := make([][]byte, 0, 2)
			b.SetBytes(mss)
			b.ReportAllocs()
			for b.Loop() {
				for _, d := range guest {
					// The private prefix: as vhostnet's st.lin, then into buf.
					n := copy(buf[vnethdr.Len:], d[0])
					n += copy(buf[vnethdr.Len+n:vnethdr.Len+prefix], d[1])
					if mode == "gather" {
						copy(buf[vnethdr.Len+prefix:], d[1][prefix-66:])
						c.Add(buf, nil, 0)
						continue
					}
					rest = append(rest[:0], d[1][prefix-66:])
					c.AddSplit(buf, prefix, rest, nil, 0)
				}
				c.Flush()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(guest)), "ns/segment")
			st := c.Stats()
			b.ReportMetric(float64(st.Segments.Load())/float64(st.Packets.Load()), "segs/packet")
		})
	}
}

// BenchmarkInOrderTCP6 is the same for IPv6.
func BenchmarkInOrderTCP6(b *testing.B) {
	f := newFlow("tcp6")
	var batch [][]byte
	for range 44 {
		batch = append(batch, withHeadroom(f.Seg(mss)))
	}
	runBatches(b, Config{}, batch, 44*mss)
}

// BenchmarkInterleaved64: 64 flows round-robin, 8 segments each per batch: every
// segment hashes to a different flow than the one before.
func BenchmarkInterleaved64(b *testing.B) {
	flows := make([]*flow, 64)
	for i := range flows {
		flows[i] = newFlow("tcp4", withPort(uint16(10000+i)))
	}
	var batch [][]byte
	for range 8 {
		for _, f := range flows {
			batch = append(batch, withHeadroom(f.Seg(mss)))
		}
	}
	runBatches(b, Config{}, batch, len(batch)*mss)
}

// BenchmarkIneligible: every frame passes through (pure ACKs, the reverse direction of
// a bulk transfer), with one flow held so each ACK also pays the flow lookup.
func BenchmarkIneligible(b *testing.B) {
	f := newFlow("tcp4")
	var batch [][]byte
	for range 44 {
		batch = append(batch, withHeadroom(f.Seg(0, withAck(f.Spec.Ack+1448))))
		f.Spec.Ack += 1448
	}
	runBatches(b, Config{}, batch, 0)
}

// BenchmarkUDPOff: UDP datagrams with UDP GRO off (parse, then pass through).
func BenchmarkUDPOff(b *testing.B) {
	f := newFlow("udp4")
	var batch [][]byte
	for range 44 {
		batch = append(batch, withHeadroom(f.Seg(1400)))
	}
	runBatches(b, Config{}, batch, 44*1400)
}

// BenchmarkSumCopy compares, per MTU segment payload (1448 = MSS at MTU 1500) and
// jumbo payload (8948 = MSS at MTU 9000): sumCopy (what the coalescer uses), copySum
// (memmove, then vnethdr.Sum), SumCopy (vnethdr's fused copy+sum, AVX2 on amd64) and
// fused (the pure-Go single loop below).
func BenchmarkSumCopy(b *testing.B) {
	for _, n := range []int{mss, 8948} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(i*7 + 3)
		}
		dst := make([]byte, n)
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.Run("sumCopy", func(b *testing.B) {
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					sumCopy(dst, src)
				}
			})
			b.Run("copySum", func(b *testing.B) {
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					copy(dst, src)
					vnethdr.Fold(vnethdr.Sum(src, 0))
				}
			})
			b.Run("SumCopy", func(b *testing.B) {
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					vnethdr.Fold(vnethdr.SumCopy(dst, src, 0))
				}
			})
			b.Run("fused", func(b *testing.B) {
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					sumCopyFused(dst, src)
				}
			})
		})
	}
}

// sumCopyFused is the single-loop alternative to sumCopy, kept to re-measure the choice:
// words are loaded in host (little-endian) order, stored, and added; ones'-complement
// addition commutes with byte swapping (RFC 1071 §2(B)), so one final swap suffices.
func sumCopyFused(dst, src []byte) uint16 {
	dst = dst[:len(src)]
	var acc, carry uint64
	for len(src) >= 32 {
		s, d := src[:32:32], dst[:32:32] // lets the compiler drop the bounds checks
		w0 := binary.LittleEndian.Uint64(s[0:8])
		w1 := binary.LittleEndian.Uint64(s[8:16])
		w2 := binary.LittleEndian.Uint64(s[16:24])
		w3 := binary.LittleEndian.Uint64(s[24:32])
		binary.LittleEndian.PutUint64(d[0:8], w0)
		binary.LittleEndian.PutUint64(d[8:16], w1)
		binary.LittleEndian.PutUint64(d[16:24], w2)
		binary.LittleEndian.PutUint64(d[24:32], w3)
		acc, carry = bits.Add64(acc, w0, carry)
		acc, carry = bits.Add64(acc, w1, carry)
		acc, carry = bits.Add64(acc, w2, carry)
		acc, carry = bits.Add64(acc, w3, carry)
		src, dst = src[32:], dst[32:]
	}
	for len(src) >= 8 {
		w := binary.LittleEndian.Uint64(src)
		binary.LittleEndian.PutUint64(dst, w)
		acc, carry = bits.Add64(acc, w, carry)
		src, dst = src[8:], dst[8:]
	}
	if len(src) > 0 {
		// Zero-padding the tail to a whole word leaves the sum unchanged; a lone odd
		// byte lands in the low half of its little-endian 16-bit word, which the final
		// swap turns into the high half, as RFC 1071 requires.
		var tail [8]byte
		copy(tail[:], src)
		copy(dst, src)
		acc, carry = bits.Add64(acc, binary.LittleEndian.Uint64(tail[:]), carry)
	}
	// Adding the last carry into acc can itself carry only if acc was all ones, and
	// then the result is 0: the end-around 1 fits.
	acc, carry = bits.Add64(acc, 0, carry)
	acc += carry
	return bits.ReverseBytes16(vnethdr.Fold(acc))
}
