//go:build amd64 && !purego

package vnethdr

import "golang.org/x/sys/cpu"

// useAVX2 selects the AVX2 bulk loops in checksum_amd64.s. x/sys/cpu reports AVX2 only
// if the OS also saves the YMM registers (XGETBV), so the check is complete. It is a
// variable so that tests can run the pure-Go path on the same machine.
var useAVX2 = cpu.X86.HasAVX2

// sumAVX2 returns the sum of the little-endian 32-bit words of b[:len(b)&^31], each
// zero-extended to 64 bits (no carries are lost for len(b) < 16 GiB).
//
//go:noescape
func sumAVX2(b []byte) uint64

// sumCopyAVX2 copies src[:n] into dst[:n], n = len(src)&^31, and returns
// sumAVX2(src). len(dst) >= n and no overlap are the caller's to guarantee.
//
//go:noescape
func sumCopyAVX2(dst, src []byte) uint64
