//go:build !amd64 || purego

package vnethdr

// useAVX2 is false: no assembly on this architecture (or with the purego build tag),
// so Sum and SumCopy run their pure-Go code.
var useAVX2 = false

func sumAVX2(b []byte) uint64 { panic("vnethdr: sumAVX2 without AVX2") }

func sumCopyAVX2(dst, src []byte) uint64 { panic("vnethdr: sumCopyAVX2 without AVX2") }
