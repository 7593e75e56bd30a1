//go:build !purego

#include "textflag.h"

// AVX2 bulk of the internet checksum (RFC 1071), for Sum and SumCopy in checksum.go.
//
// The math. RFC 1071 §2 defines the checksum as the ones'-complement sum of 16-bit
// words, and shows in §2(B) that it is byte-order independent (summing byte-swapped
// words gives the byte-swapped sum) and in §2(C) that words may be added in any
// grouping (32 or 64 bits at a time) as long as the carries are added back in
// (end-around carry), because 2^16 ≡ 1 (mod 2^16-1): any multiple of 2^16, 2^32 or
// 2^64 is just 1 in ones'-complement arithmetic. Scalar code does this with one
// add-with-carry chain (the Linux kernel's arch/x86/lib/csum-partial_64.c,
// csum_partial, is an adcq chain; so is the pure-Go Sum). A vector unit has no carry
// flag, so instead each little-endian 32-bit word w is added, zero-extended, into a
// 64-bit lane: words are below 2^32, so neither a lane nor the total of all lanes can
// carry out before 2^32 words (16 GiB) have been added, and checksum.go feeds at most
// simdChunk (1 GiB) per call. The caller folds the
// returned 64-bit total to 16 bits (Fold) and byte-swaps it once (§2(B)).
//
// The trick that saves an instruction. Zero-extending both 32-bit halves of a 64-bit
// word x = hi·2^32 + lo costs an AND (lo) and a shift (hi) per vector. Instead each
// lane keeps A = Σx (VPADDQ of the whole word, wrapping mod 2^64) and B = Σhi (shift,
// then VPADDQ; exact). Σlo is then A - (B<<32) mod 2^64, exact because the true Σlo
// is itself below 2^64 (fewer than 2^32 words per lane); and the wanted lane sum is
// Σlo + Σhi = A - (B<<32) + B. That is a shift and two adds per 32 bytes, no AND.
//
// Throughput. Eight independent accumulators (four A, four B), so no add waits on the
// previous one; 128 bytes per iteration (four 32-byte loads), then whole 32-byte
// blocks. Measured (BenchmarkChecksum, development VM, AMD EPYC): ~3x the pure-Go adc
// chain at 1448 bytes, where the ~8-10 ns fixed cost of a call is half the time, ~5x
// at 9000 and 65536 bytes (~100 GB/s). AVX-512 was not tried: at MTU sizes the loop
// is no longer the larger part of a call, and Zen 4 (whose feature flags the
// development CPU shows) executes 512-bit integer ops as two 256-bit halves.
//
// Bounds. Only whole 32-byte blocks are read (len &^ 31): the caller sums the tail in
// Go, so nothing past the end of the slice is ever touched (a read past it could
// fault on a page boundary).

// CSUM_ZERO clears the eight accumulators: Y0-Y3 hold A (whole words), Y4-Y7 hold B
// (high halves).
#define CSUM_ZERO \
	VPXOR Y0, Y0, Y0 \
	VPXOR Y1, Y1, Y1 \
	VPXOR Y2, Y2, Y2 \
	VPXOR Y3, Y3, Y3 \
	VPXOR Y4, Y4, Y4 \
	VPXOR Y5, Y5, Y5 \
	VPXOR Y6, Y6, Y6 \
	VPXOR Y7, Y7, Y7

// CSUM_REDUCE folds the eight accumulators into one 64-bit total in AX, in this order:
//   Y0 = A = Y0+Y1+Y2+Y3 and Y4 = B = Y4+Y5+Y6+Y7 (per lane);
//   Y0 = A - (B<<32) = Σlo, then Y0 = Σlo + B = the lane sums (the trick above);
//   the upper 128 bits added to the lower (VEXTRACTI128), the two 64-bit halves of
//   that swapped (VPSHUFD $0x4e) and added, the low 64 bits moved to AX.
// Every intermediate is exact (see above), so plain adds do.
#define CSUM_REDUCE \
	VPADDQ       Y1, Y0, Y0    \
	VPADDQ       Y3, Y2, Y2    \
	VPADDQ       Y2, Y0, Y0    \
	VPADDQ       Y5, Y4, Y4    \
	VPADDQ       Y7, Y6, Y6    \
	VPADDQ       Y6, Y4, Y4    \
	VPSLLQ       $32, Y4, Y5   \
	VPSUBQ       Y5, Y0, Y0    \
	VPADDQ       Y4, Y0, Y0    \
	VEXTRACTI128 $1, Y0, X1    \
	VPADDQ       X1, X0, X0    \
	VPSHUFD      $0x4e, X0, X1 \
	VPADDQ       X1, X0, X0    \
	VMOVQ        X0, AX

// func sumAVX2(b []byte) uint64
// Returns the sum of the little-endian 32-bit words of b[:len(b)&^31], each
// zero-extended to 64 bits. Requires AVX2 (checked by the caller).
TEXT ·sumAVX2(SB), NOSPLIT, $0-32
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), CX
	ANDQ $-32, CX // whole 32-byte blocks only; the tail is the caller's

	CSUM_ZERO

	CMPQ CX, $128
	JB   sum32

sum128:
	// Four unaligned 32-byte loads (VMOVDQU: no alignment assumed; on current CPUs
	// an aligned address costs the same as with VMOVDQA).
	VMOVDQU 0(SI), Y8
	VMOVDQU 32(SI), Y9
	VMOVDQU 64(SI), Y10
	VMOVDQU 96(SI), Y11
	VPADDQ  Y8, Y0, Y0      // A += x
	VPADDQ  Y9, Y1, Y1
	VPADDQ  Y10, Y2, Y2
	VPADDQ  Y11, Y3, Y3
	VPSRLQ  $32, Y8, Y8     // hi = x >> 32 (zero-extended high word)
	VPSRLQ  $32, Y9, Y9
	VPSRLQ  $32, Y10, Y10
	VPSRLQ  $32, Y11, Y11
	VPADDQ  Y8, Y4, Y4      // B += hi
	VPADDQ  Y9, Y5, Y5
	VPADDQ  Y10, Y6, Y6
	VPADDQ  Y11, Y7, Y7
	ADDQ    $128, SI
	SUBQ    $128, CX
	CMPQ    CX, $128
	JAE     sum128

sum32:
	// Zero to three remaining 32-byte blocks, into the first accumulator pair.
	TESTQ CX, CX
	JZ    sumdone

sum32loop:
	VMOVDQU (SI), Y8
	VPADDQ  Y8, Y0, Y0
	VPSRLQ  $32, Y8, Y8
	VPADDQ  Y8, Y4, Y4
	ADDQ    $32, SI
	SUBQ    $32, CX
	JNZ     sum32loop

sumdone:
	CSUM_REDUCE
	// Clear the upper YMM halves: dirty upper state makes later legacy-SSE code (the
	// Go runtime and compiler use SSE for memmove, zeroing, floats) pay a transition
	// penalty or a false dependency on many CPUs.
	VZEROUPPER
	MOVQ AX, ret+24(FP)
	RET

// func sumCopyAVX2(dst, src []byte) uint64
// Copies src[:n] to dst[:n], n = len(src)&^31, and returns what sumAVX2(src) would.
// The caller guarantees len(dst) >= n and that dst and src do not overlap. Each
// 32-byte block is loaded once, stored, and summed from the register: one pass over
// the data instead of memmove then sum.
TEXT ·sumCopyAVX2(SB), NOSPLIT, $0-56
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	ANDQ $-32, CX

	CSUM_ZERO

	CMPQ CX, $128
	JB   copy32

copy128:
	VMOVDQU 0(SI), Y8
	VMOVDQU 32(SI), Y9
	VMOVDQU 64(SI), Y10
	VMOVDQU 96(SI), Y11
	VMOVDQU Y8, 0(DI)       // store before the shift below overwrites the register
	VMOVDQU Y9, 32(DI)
	VMOVDQU Y10, 64(DI)
	VMOVDQU Y11, 96(DI)
	VPADDQ  Y8, Y0, Y0
	VPADDQ  Y9, Y1, Y1
	VPADDQ  Y10, Y2, Y2
	VPADDQ  Y11, Y3, Y3
	VPSRLQ  $32, Y8, Y8
	VPSRLQ  $32, Y9, Y9
	VPSRLQ  $32, Y10, Y10
	VPSRLQ  $32, Y11, Y11
	VPADDQ  Y8, Y4, Y4
	VPADDQ  Y9, Y5, Y5
	VPADDQ  Y10, Y6, Y6
	VPADDQ  Y11, Y7, Y7
	ADDQ    $128, SI
	ADDQ    $128, DI
	SUBQ    $128, CX
	CMPQ    CX, $128
	JAE     copy128

copy32:
	TESTQ CX, CX
	JZ    copydone

copy32loop:
	VMOVDQU (SI), Y8
	VMOVDQU Y8, (DI)
	VPADDQ  Y8, Y0, Y0
	VPSRLQ  $32, Y8, Y8
	VPADDQ  Y8, Y4, Y4
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $32, CX
	JNZ     copy32loop

copydone:
	CSUM_REDUCE
	VZEROUPPER
	MOVQ AX, ret+48(FP)
	RET
