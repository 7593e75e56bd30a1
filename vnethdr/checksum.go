package vnethdr

import (
	"encoding/binary"
	"math/bits"
)

// Sum adds b to the running ones'-complement sum acc as big-endian 16-bit words and returns
// the unfolded 64-bit accumulator. An odd trailing byte is padded with zero, so Sum must only
// be chained on even-length pieces except for the last one. Only Fold(acc) is specified:
// the raw accumulator depends on how the bulk was summed (AVX2 or not), its fold does not
// (Fold(acc) is 0 only for acc 0, and otherwise acc mod 0xffff mapped to 1..0xffff, and
// every path adds the same value mod 0xffff, and a non-zero one if any byte is non-zero).
//
// On amd64 with AVX2 the bulk (whole 32-byte blocks, from simdMin bytes on) is summed by
// sumAVX2 (checksum_amd64.s), which adds 32-bit words into 64-bit vector lanes; the rest
// is pure Go. Summing 64 bits at a time with add-with-carry is what made wireguard-go's
// checksum 1.3–2x faster (wireguard-go commit b82c016). The bulk is summed with
// little-endian loads and swapped once (below), which took BenchmarkChecksum/1500 from
// ~7.6 to ~12 GB/s on the (2-vCPU) development VM.
func Sum(b []byte, acc uint64) uint64 {
	var carry uint64
	if len(b) >= 64 {
		// Bulk in little-endian loads (no byte swap per word on x86), folded and
		// byte-swapped once: the ones'-complement sum of byte-swapped words is the
		// byte-swapped sum (RFC 1071 §2(B)); the explicit LittleEndian keeps this right
		// on any host. The carry stays in one adc chain across iterations and is added
		// back once. The bulk is a multiple of 8 bytes (32 with AVX2), so word alignment
		// is preserved.
		var le uint64
		if useAVX2 && len(b) >= simdMin {
			// sumAVX2 returns the sum of the little-endian 32-bit words in 64-bit
			// lanes: the same value as the loop below modulo 0xffff, and 0 only for
			// zero data. At most simdChunk bytes per call keeps its lanes far from
			// overflowing (its contract: < 16 GiB).
			for len(b) >= 32 {
				n := min(len(b), simdChunk) &^ 31
				le, carry = bits.Add64(le, sumAVX2(b[:n]), carry)
				b = b[n:]
			}
		} else {
			for len(b) >= 64 {
				le, carry = bits.Add64(le, binary.LittleEndian.Uint64(b[0:]), carry)
				le, carry = bits.Add64(le, binary.LittleEndian.Uint64(b[8:]), carry)
				le, carry = bits.Add64(le, binary.LittleEndian.Uint64(b[16:]), carry)
				le, carry = bits.Add64(le, binary.LittleEndian.Uint64(b[24:]), carry)
				le, carry = bits.Add64(le, binary.LittleEndian.Uint64(b[32:]), carry)
				le, carry = bits.Add64(le, binary.LittleEndian.Uint64(b[40:]), carry)
				le, carry = bits.Add64(le, binary.LittleEndian.Uint64(b[48:]), carry)
				le, carry = bits.Add64(le, binary.LittleEndian.Uint64(b[56:]), carry)
				b = b[64:]
			}
		}
		le += carry // cannot overflow: after a carry-out le ≤ 2^64-2
		acc, carry = bits.Add64(acc, uint64(bits.ReverseBytes16(Fold(le))), 0)
		acc += carry
	}
	for len(b) >= 32 {
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[0:]), 0)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[8:]), carry)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[16:]), carry)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[24:]), carry)
		acc += carry
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b), 0)
		acc += carry
		b = b[8:]
	}
	if len(b) >= 4 {
		acc, carry = bits.Add64(acc, uint64(binary.BigEndian.Uint32(b)), 0)
		acc += carry
		b = b[4:]
	}
	if len(b) >= 2 {
		acc, carry = bits.Add64(acc, uint64(binary.BigEndian.Uint16(b)), 0)
		acc += carry
		b = b[2:]
	}
	if len(b) == 1 {
		acc, carry = bits.Add64(acc, uint64(b[0])<<8, 0)
		acc += carry
	}
	return acc
}

// simdMin is the length from which Sum uses sumAVX2 and SumCopy uses sumCopyAVX2. A
// call costs a fixed ~8-10 ns (ABI0 call, zeroing eight accumulators, the vector
// reduction, VZEROUPPER) that the pure-Go loops (~0.05 ns/byte) pay back only between
// 128 and 192 bytes (within the noise there; the assembly wins clearly from 256:
// BenchmarkChecksum, development VM). 192 keeps every size below on exactly the code it
// had, headers (20-60 bytes, summed once per packet) included.
const simdMin = 192

// simdChunk bounds one sumAVX2/sumCopyAVX2 call: 1 GiB is 2^28 32-bit words, so every
// lane, and their total, stays below 2^60, far from a carry out (the limit is 16 GiB).
// A variable only so that tests can exercise the chunking with small buffers.
var simdChunk = 1 << 30

// SumCopy copies src into dst, which must be at least as long as src and must not
// overlap it, and returns Sum(src, acc). With AVX2 the bulk is copied and summed in
// one pass (each 32-byte block loaded once, stored, and added from the register), which
// beats memmove followed by Sum (BenchmarkSumCopy in package coalescer). Bytes of dst
// past len(src) are not touched.
func SumCopy(dst, src []byte, acc uint64) uint64 {
	dst = dst[:len(src)] // panics, before any write, if dst is too short
	if useAVX2 && len(src) >= simdMin {
		// As in Sum: little-endian lane sums, chained with carry, folded and swapped once.
		var le, carry uint64
		for len(src) >= 32 {
			n := min(len(src), simdChunk) &^ 31
			le, carry = bits.Add64(le, sumCopyAVX2(dst[:n], src[:n]), carry)
			src, dst = src[n:], dst[n:]
		}
		le += carry
		acc, carry = bits.Add64(acc, uint64(bits.ReverseBytes16(Fold(le))), 0)
		acc += carry
	}
	copy(dst, src)
	return Sum(src, acc)
}

// Fold reduces a Sum accumulator to 16 bits (not complemented).
func Fold(acc uint64) uint16 {
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 16) + (acc & 0xffff)
	acc = (acc >> 16) + (acc & 0xffff)
	return uint16(acc)
}

// Checksum returns the internet checksum (complemented) of b seeded with acc.
func Checksum(b []byte, acc uint64) uint16 { return ^Fold(Sum(b, acc)) }

// PseudoHeaderSum returns the unfolded sum of the TCP/UDP pseudo-header for IPv4 (4-byte
// addresses) or IPv6 (16-byte addresses) with the given L4 protocol and L4 length.
func PseudoHeaderSum(proto uint8, src, dst []byte, l4Len int) uint64 {
	acc := Sum(src, 0)
	acc = Sum(dst, acc)
	acc, carry := bits.Add64(acc, uint64(proto)+uint64(uint32(l4Len)), 0)
	return acc + carry
}
