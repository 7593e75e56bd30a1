package vnethdr

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// refFoldedSum is a deliberately naive reference for Fold(Sum(b, acc)): the seed's four
// 16-bit pieces plus b as big-endian byte pairs (an odd last byte is the high half of
// a zero-padded word), added exactly and folded with end-around carry (RFC 1071 §2,
// §4.1). Like Fold, it is 0 only if everything added was 0.
func refFoldedSum(b []byte, acc uint64) uint16 {
	s := acc>>48 + acc>>32&0xffff + acc>>16&0xffff + acc&0xffff
	for i := 0; i+1 < len(b); i += 2 {
		s += uint64(b[i])<<8 | uint64(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint64(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// sumPaths runs f once per implementation of the bulk: the AVX2 assembly (skipped where
// the CPU or build has none) and the pure-Go loop.
func sumPaths(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	saved := useAVX2
	defer func() { useAVX2 = saved }()
	t.Run("asm", func(t *testing.T) {
		if !saved {
			t.Skip("no AVX2 on this CPU, or built with purego")
		}
		useAVX2 = true
		f(t)
	})
	t.Run("go", func(t *testing.T) {
		useAVX2 = false
		f(t)
	})
}

// testSeeds are initial accumulators: zero, small, and near 2^64 where every add in Sum
// carries.
var testSeeds = []uint64{0, 1, 0xffff, 0x1234_5678_9abc_def0, 1 << 63, ^uint64(0), ^uint64(0) - 1, ^uint64(0) - 0xffff, ^uint64(0) - 12345}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestSumEveryLengthAndOffset: every length 0..600 at every start offset 0..63, with
// random, all-0xff (every add carries) and all-zero data, against the reference.
func TestSumEveryLengthAndOffset(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 15))
	bufs := map[string][]byte{
		"random": randBytes(rng, 600+64),
		"ones":   bytes.Repeat([]byte{0xff}, 600+64),
		"zeros":  make([]byte, 600+64),
	}
	sumPaths(t, func(t *testing.T) {
		for name, buf := range bufs {
			for n := 0; n <= 600; n++ {
				for off := range 64 {
					b := buf[off : off+n]
					acc := testSeeds[(n+off)%len(testSeeds)]
					if got, want := Fold(Sum(b, acc)), refFoldedSum(b, acc); got != want {
						t.Fatalf("%s len %d offset %d seed %#x: Fold(Sum) %#04x, reference %#04x", name, n, off, acc, got, want)
					}
				}
			}
		}
	})
}

// TestSumRandom: random lengths up to 70000 (past 64 KB GSO packets), random offsets and
// random seeds, a third of them within 2^20 of 2^64.
func TestSumRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(70000, 1))
	buf := randBytes(rng, 70000+64)
	sumPaths(t, func(t *testing.T) {
		for range 300 {
			n, off := rng.IntN(70001), rng.IntN(64)
			b := buf[off : off+n]
			acc := rng.Uint64()
			switch rng.IntN(3) {
			case 0:
				acc = ^uint64(0) - rng.Uint64N(1<<20)
			case 1:
				acc = rng.Uint64N(1 << 20)
			}
			if got, want := Fold(Sum(b, acc)), refFoldedSum(b, acc); got != want {
				t.Fatalf("len %d offset %d seed %#x: Fold(Sum) %#04x, reference %#04x", n, off, acc, got, want)
			}
		}
	})
}

// TestSumChunked: with simdChunk forced small, the bulk is summed in several assembly
// calls and still agrees (the 1 GiB production chunk is too big to test directly).
func TestSumChunked(t *testing.T) {
	saved := simdChunk
	defer func() { simdChunk = saved }()
	rng := rand.New(rand.NewPCG(3, 4))
	buf := randBytes(rng, 5000)
	sumPaths(t, func(t *testing.T) {
		for _, chunk := range []int{32, 64, 96, 128, 160, 1000} {
			simdChunk = chunk
			for range 200 {
				n, off := rng.IntN(4900), rng.IntN(64)
				b, acc := buf[off:off+n], rng.Uint64()
				if got, want := Fold(Sum(b, acc)), refFoldedSum(b, acc); got != want {
					t.Fatalf("chunk %d len %d offset %d: Fold(Sum) %#04x, reference %#04x", chunk, n, off, got, want)
				}
				dst := make([]byte, n)
				if got, want := Fold(SumCopy(dst, b, acc)), refFoldedSum(b, acc); got != want || !bytes.Equal(dst, b) {
					t.Fatalf("chunk %d len %d offset %d: Fold(SumCopy) %#04x, reference %#04x (copy equal: %v)", chunk, n, off, got, want, bytes.Equal(dst, b))
				}
			}
		}
	})
}

// TestSumAsmEqualsGo: the two paths agree on every chained sum (even-length pieces, an
// odd last one), which is how callers use Sum (pseudo-header, header, payload).
func TestSumAsmEqualsGo(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2 on this CPU, or built with purego")
	}
	defer func() { useAVX2 = true }()
	rng := rand.New(rand.NewPCG(9, 9))
	for range 2000 {
		b := randBytes(rng, rng.IntN(3000))
		cuts := []int{0}
		for c := 0; c < len(b); {
			c = min(len(b), c+2*rng.IntN(400))
			if c == cuts[len(cuts)-1] {
				c = len(b)
			}
			cuts = append(cuts, c)
		}
		seed := rng.Uint64()
		var accs [2]uint64
		for i, avx := range []bool{true, false} {
			useAVX2 = avx
			acc := seed
			for k := 1; k < len(cuts); k++ {
				acc = Sum(b[cuts[k-1]:cuts[k]], acc)
			}
			accs[i] = acc
		}
		if Fold(accs[0]) != Fold(accs[1]) || Fold(accs[0]) != refFoldedSum(b, seed) {
			t.Fatalf("len %d cuts %v: asm %#04x, go %#04x, reference %#04x", len(b), cuts, Fold(accs[0]), Fold(accs[1]), refFoldedSum(b, seed))
		}
	}
}

// TestSumCopy: dst equals src afterwards, the bytes around dst[:len(src)] are untouched,
// and the sum is the reference's, for every length 0..600 at varied src and dst offsets.
func TestSumCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	src := randBytes(rng, 70000+64)
	const guard = 0xa5
	check := func(t *testing.T, n, soff, doff int, acc uint64) {
		t.Helper()
		s := src[soff : soff+n]
		mem := bytes.Repeat([]byte{guard}, doff+n+64)
		dst := mem[doff:] // longer than s: the tail must stay as it was
		got := Fold(SumCopy(dst, s, acc))
		if want := refFoldedSum(s, acc); got != want {
			t.Fatalf("len %d src offset %d dst offset %d seed %#x: Fold(SumCopy) %#04x, reference %#04x", n, soff, doff, acc, got, want)
		}
		if !bytes.Equal(dst[:n], s) {
			t.Fatalf("len %d src offset %d dst offset %d: dst differs from src", n, soff, doff)
		}
		for i, c := range mem {
			if (i < doff || i >= doff+n) && c != guard {
				t.Fatalf("len %d src offset %d dst offset %d: byte %d outside dst[:len(src)] changed to %#x", n, soff, doff, i-doff, c)
			}
		}
	}
	sumPaths(t, func(t *testing.T) {
		for n := 0; n <= 600; n++ {
			for soff := range 64 {
				doff := (soff*7 + n) % 64
				check(t, n, soff, doff, testSeeds[(n+soff)%len(testSeeds)])
			}
		}
		for range 200 {
			check(t, rng.IntN(70001), rng.IntN(64), rng.IntN(64), rng.Uint64())
		}
	})
}

func TestSumCopyShortDst(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("SumCopy into a too-short dst did not panic")
		}
	}()
	SumCopy(make([]byte, 99), make([]byte, 100), 0)
}

// TestSumAllocs: Sum and SumCopy allocate nothing.
func TestSumAllocs(t *testing.T) {
	src, dst := make([]byte, 1448), make([]byte, 1448)
	if n := testing.AllocsPerRun(100, func() { Sum(src, 0); SumCopy(dst, src, 0) }); n != 0 {
		t.Errorf("%v allocs per Sum+SumCopy", n)
	}
}

// FuzzSum compares Sum and SumCopy (on whatever path this CPU selects: the assembly on
// amd64 with AVX2) with the naive reference, at a fuzzed start offset and seed.
func FuzzSum(f *testing.F) {
	f.Add([]byte{}, uint8(0), uint64(0))
	f.Add([]byte{0xff}, uint8(0), ^uint64(0))
	f.Add(bytes.Repeat([]byte{0xff}, 200), uint8(3), ^uint64(0)-1)
	f.Add(bytes.Repeat([]byte{0x12, 0x34, 0x56}, 700), uint8(31), uint64(0x8000_0000_0000_0001))
	f.Fuzz(func(t *testing.T, data []byte, off uint8, acc uint64) {
		b := data[min(int(off), len(data)):]
		want := refFoldedSum(b, acc)
		if got := Fold(Sum(b, acc)); got != want {
			t.Fatalf("len %d: Fold(Sum) %#04x, reference %#04x", len(b), got, want)
		}
		dst := make([]byte, len(b)+1)
		dst[len(b)] = 0x5a
		if got := Fold(SumCopy(dst, b, acc)); got != want || !bytes.Equal(dst[:len(b)], b) || dst[len(b)] != 0x5a {
			t.Fatalf("len %d: Fold(SumCopy) %#04x, reference %#04x, or the copy is wrong", len(b), got, want)
		}
	})
}
