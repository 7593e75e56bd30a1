package vnethdr

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// randGSO builds a random GSO super-frame: TCP over IPv4 or IPv6, or USO over either,
// with or without a VLAN tag, IPv4 options, IPv6 extension headers, TCP options and
// flags, link-layer padding, and either the partial checksum of NEEDS_CSUM or a full one.
func randGSO(r *rand.Rand) ([]byte, Hdr) {
	p := pkt{
		v6:    r.IntN(2) == 0,
		udp:   r.IntN(3) == 0,
		vlan:  r.IntN(4) == 0,
		ipID:  uint16(r.Uint32()),
		tos:   uint8(r.Uint32()),
		seq:   r.Uint32(),
		ack:   r.Uint32(),
		flags: tcpACK | uint8(r.Uint32())&(tcpFIN|tcpPSH|tcpCWR|tcpECE),
		pad:   r.IntN(3) * r.IntN(8),
	}
	if !p.v6 && r.IntN(3) == 0 {
		p.ipOpts = bytes.Repeat([]byte{1}, 4*(1+r.IntN(10))) // NOPs, up to 40 bytes
	}
	if p.v6 && r.IntN(3) == 0 {
		for range 1 + r.IntN(3) {
			p.ext6 = append(p.ext6, []uint8{ipv6ExtHopByHop, ipv6ExtDstOpts}[r.IntN(2)])
		}
	}
	if !p.udp && r.IntN(2) == 0 {
		p.tcpOpts = bytes.Repeat([]byte{1}, 4*(1+r.IntN(10))) // up to 40 bytes
	}
	mss := 1 + r.IntN(1500)
	if r.IntN(4) == 0 {
		mss = 1 + r.IntN(64) // small segments, odd sizes
	}
	n := 1 + r.IntN(min(MaxSegments*mss, 65000))
	if r.IntN(4) == 0 {
		n = mss * (1 + r.IntN(min(MaxSegments, 65000/mss))) // an exact multiple
	}
	p.payload = make([]byte, n)
	for i := range p.payload {
		p.payload[i] = byte(r.Uint32())
	}
	p.partial = r.IntN(4) != 0
	f, l3, l4, _ := p.build()
	h := gsoHdr(p, mss, l3, l4)
	if !p.partial {
		h.Flags &^= FlagNeedsCsum // a full checksum without NEEDS_CSUM: Split recomputes it anyway
	}
	return f, h
}

// Property: SplitHeaders' header slots, each followed by its payload view, are byte for
// byte what the copying Split produces (checksums included), for random frames; the
// payload views point into the input, which neither function modifies; and both refuse
// the same frames.
func TestSplitHeadersMatchesSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	out, sizes := outBufs(MaxSegments, 1500+256)
	hdrs, _ := outBufs(MaxSegments, 256)
	payloads := make([][]byte, MaxSegments)
	for iter := range 3000 {
		f, h := randGSO(r)
		in := bytes.Clone(f)
		n, err := Split(f, &h, out, sizes)
		m, err2 := SplitHeaders(f, &h, hdrs, payloads)
		if (err == nil) != (err2 == nil) || n != m {
			t.Fatalf("iter %d: Split = %d, %v; SplitHeaders = %d, %v", iter, n, err, m, err2)
		}
		if err != nil {
			if !errors.Is(err, ErrTooManySegments) && !errors.Is(err, ErrShortBuffer) {
				t.Fatalf("iter %d: %v on a valid frame", iter, err)
			}
			continue
		}
		if !bytes.Equal(f, in) {
			t.Fatalf("iter %d: input modified", iter)
		}
		l, _ := ParseLayout(f)
		for i := range n {
			got := append(bytes.Clone(hdrs[i][:l.PayloadOff]), payloads[i]...)
			if !bytes.Equal(got, out[i][:sizes[i]]) {
				t.Fatalf("iter %d segment %d of %d: header slot + payload differ from Split's segment", iter, i, n)
			}
			if len(payloads[i]) > 0 && (&payloads[i][0] != &f[l.PayloadOff+i*int(h.GSOSize)] || cap(payloads[i]) != len(payloads[i])) {
				t.Fatalf("iter %d segment %d: payload is not a capped view of the input", iter, i)
			}
		}
		checkSplit(t, f, int(h.GSOSize), out, sizes, n)
	}
}

// SplitHeaders refuses what Split refuses, writes nothing then, and checks its header
// slots.
func TestSplitHeadersErrors(t *testing.T) {
	p := pkt{payload: pattern(4000, 1), tcpOpts: []byte{1, 1, 1, 1}, partial: true}
	f, l3, l4, _ := p.build()
	h := gsoHdr(p, 1000, l3, l4)
	hdrs, _ := outBufs(4, 57) // headers are 14 + 20 + 24 = 58 bytes
	payloads := make([][]byte, 4)
	if n, err := SplitHeaders(f, &h, hdrs, payloads); n != 0 || !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("short header slots: %d, %v", n, err)
	}
	hdrs, _ = outBufs(3, 58)
	if n, err := SplitHeaders(f, &h, hdrs, payloads); n != 0 || !errors.Is(err, ErrTooManySegments) {
		t.Fatalf("too few slots: %d, %v", n, err)
	}
	for i := range hdrs {
		if !bytes.Equal(hdrs[i], bytes.Repeat([]byte{0xa5}, 58)) {
			t.Fatalf("hdrs[%d] written despite the error", i)
		}
	}
	bad := h
	bad.CsumOffset = 6
	hdrs, _ = outBufs(4, 58)
	if _, err := SplitHeaders(f, &bad, hdrs, payloads); !errors.Is(err, ErrBadHeader) {
		t.Fatalf("bad csum_offset: %v", err)
	}
}

func TestSplitHeadersAllocs(t *testing.T) {
	in, h, _ := maxTSO4()
	hdrs, _ := outBufs(64, 128)
	payloads := make([][]byte, 64)
	if a := testing.AllocsPerRun(50, func() {
		if _, err := SplitHeaders(in, &h, hdrs, payloads); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("SplitHeaders allocates %.1f per run", a)
	}
}

// BenchmarkSplitHeadersTCPv4 is BenchmarkSplitTCPv4 without the payload copy: what is
// left is the headers and the checksum pass over the payload.
func BenchmarkSplitHeadersTCPv4(b *testing.B) {
	in, h, _ := maxTSO4()
	hdrs, _ := outBufs(64, 128)
	payloads := make([][]byte, 64)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := SplitHeaders(in, &h, hdrs, payloads); err != nil {
			b.Fatal(err)
		}
	}
}
