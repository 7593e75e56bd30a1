package vnethdr

import (
	"bytes"
	"math/rand/v2"
	"strconv"
	"testing"
)

func TestChecksumMatchesReference(t *testing.T) {
	for _, seed := range []uint64{1, 2, 0xdeadbeef} {
		rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		buf := make([]byte, 9002)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		for n := 0; n <= 9001; n++ {
			b := buf[:n]
			if got, want := Checksum(b, 0), refChecksum(b); got != want {
				t.Fatalf("seed %d len %d: Checksum %#04x, reference %#04x", seed, n, got, want)
			}
			// Unaligned start too: Sum must not assume any alignment.
			if n > 0 {
				b = buf[1 : n+1]
				if got, want := Checksum(b, 0), refChecksum(b); got != want {
					t.Fatalf("seed %d len %d offset 1: Checksum %#04x, reference %#04x", seed, n, got, want)
				}
			}
		}
	}
}

func TestChecksumCarryHeavy(t *testing.T) {
	// All-ones data drives every 64-bit add to carry; the sum of such data folds to 0xffff.
	for _, fill := range []byte{0xff, 0xfe, 0x80, 0x01} {
		for _, n := range []int{1, 2, 3, 7, 8, 9, 31, 32, 33, 64, 65, 1500, 65535} {
			b := bytes.Repeat([]byte{fill}, n)
			if got, want := Checksum(b, 0), refChecksum(b); got != want {
				t.Errorf("fill %#x len %d: Checksum %#04x, reference %#04x", fill, n, got, want)
			}
			// A huge seed must not overflow either.
			acc := ^uint64(0) - 1
			ref := refChecksum(append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}, b...))
			if got := Checksum(b, acc); got != ref {
				t.Errorf("fill %#x len %d seeded with 2^64-2: %#04x, reference %#04x", fill, n, got, ref)
			}
		}
	}
}

func TestSumChainsEvenPieces(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for range 2000 {
		n := rng.IntN(4000)
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		// Cut at random even positions; only the final piece may be odd.
		var acc uint64
		rest := b
		for len(rest) > 0 {
			k := 2 * rng.IntN(len(rest)/2+1)
			if k == 0 || rng.IntN(4) == 0 {
				k = len(rest)
			}
			acc = Sum(rest[:k], acc)
			rest = rest[k:]
		}
		if got, want := ^Fold(acc), refChecksum(b); got != want {
			t.Fatalf("len %d chained: %#04x, reference %#04x", n, got, want)
		}
	}
}

func TestFold(t *testing.T) {
	for _, tc := range []struct {
		acc  uint64
		want uint16
	}{
		{0, 0},
		{0xffff, 0xffff},
		{0x10000, 1},
		{0x1fffe, 0xffff},
		{0xffffffff, 0xffff},
		{^uint64(0), 0xffff},
		{0x0001_0002_0003_0004, 0x000a},
	} {
		if got := Fold(tc.acc); got != tc.want {
			t.Errorf("Fold(%#x) = %#x, want %#x", tc.acc, got, tc.want)
		}
	}
}

func TestPseudoHeaderSum(t *testing.T) {
	// Expected values computed by hand (16-bit words summed with end-around carry):
	// 198.18.0.1 → 198.18.0.2, TCP, 120 bytes: c612+0001+c612+0002+0006+0078 = 0x8ca6.
	if got := Fold(PseudoHeaderSum(ProtoTCP, src4, dst4, 120)); got != 0x8ca6 {
		t.Errorf("IPv4 pseudo-header sum %#04x, want 0x8ca6", got)
	}
	// fd00:198:18::1 → ::2, UDP, 1000 bytes: 2·(fd00+0198+0018)+1+2+0011+03e8 = 0x015e.
	if got := Fold(PseudoHeaderSum(ProtoUDP, src6, dst6, 1000)); got != 0x015e {
		t.Errorf("IPv6 pseudo-header sum %#04x, want 0x015e", got)
	}
	// IPv6 upper-layer length is 32 bits: 0x10010 contributes 0001+0010.
	if got := Fold(PseudoHeaderSum(ProtoTCP, src6, dst6, 0x10010)); got != 0xfd7b {
		t.Errorf("IPv6 pseudo-header sum (len 0x10010) %#04x, want 0xfd7b", got)
	}
	// And against the byte-level reference for a range of lengths.
	for _, n := range []int{0, 1, 8, 1480, 65535} {
		if got, want := ^Fold(PseudoHeaderSum(ProtoUDP, src4, dst4, n)), refChecksum(refPseudo(false, ProtoUDP, n)); got != want {
			t.Errorf("IPv4 len %d: %#04x, reference %#04x", n, got, want)
		}
		if got, want := ^Fold(PseudoHeaderSum(ProtoTCP, src6, dst6, n)), refChecksum(refPseudo(true, ProtoTCP, n)); got != want {
			t.Errorf("IPv6 len %d: %#04x, reference %#04x", n, got, want)
		}
	}
}

// BenchmarkChecksum covers header sizes (20-60 bytes, summed once per packet), MTU
// segments (1448 = MSS at MTU 1500, 1500), a jumbo frame (9000) and 64 KB GSO packets.
func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{20, 40, 60, 64, 128, 256, 1448, 1500, 9000, 65535, 65536} {
		buf := pattern(n, 3)
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				Checksum(buf, 0)
			}
		})
	}
}
