package vnethdr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// outBufs returns n buffers of size bytes each (filled with a marker so untouched
// buffers can be recognised) and a sizes slice.
func outBufs(n, size int) ([][]byte, []int) {
	out := make([][]byte, n)
	for i := range out {
		out[i] = bytes.Repeat([]byte{0xa5}, size)
	}
	return out, make([]int, n)
}

// gsoHdr is the header the kernel produces for a frame (include/linux/virtio_net.h
// virtio_net_hdr_from_skb), with hdr_len set to garbage on purpose: Split must not use it.
func gsoHdr(p pkt, gsoSize int, l3, l4 int) Hdr {
	h := Hdr{Flags: FlagNeedsCsum, GSOSize: uint16(gsoSize), CsumStart: uint16(l4), HdrLen: 7}
	switch {
	case p.udp:
		h.GSOType, h.CsumOffset = GSOUDPL4, 6
	case p.v6:
		h.GSOType, h.CsumOffset = GSOTCPv6, 16
	default:
		h.GSOType, h.CsumOffset = GSOTCPv4, 16
	}
	return h
}

// maskMutable zeroes the header fields Split is allowed to change, so the rest of each
// segment's headers can be compared byte for byte with the original's.
func maskMutable(hdr []byte, l Layout) []byte {
	c := bytes.Clone(hdr)
	ip := c[l.L3Off:]
	if l.IPv6 {
		ip[4], ip[5] = 0, 0
	} else {
		clear(ip[2:6])
		ip[10], ip[11] = 0, 0
	}
	l4 := c[l.L4Off:]
	if l.L4Proto == ProtoTCP {
		clear(l4[4:8])
		l4[13] = 0
		l4[16], l4[17] = 0, 0
	} else {
		clear(l4[4:8])
	}
	return c
}

// checkSplit verifies the segments of in: each is a valid plain frame, headers equal the
// original apart from the rewritten fields, IDs/seqs progress, flags are distributed the
// Linux way, sizes are right and the payloads concatenate to the original payload.
func checkSplit(t *testing.T, in []byte, gsoSize int, out [][]byte, sizes []int, n int) {
	t.Helper()
	lin, err := ParseLayout(in)
	if err != nil {
		t.Fatal(err)
	}
	payload := in[lin.PayloadOff:lin.End]
	if want := (len(payload) + gsoSize - 1) / gsoSize; n != want {
		t.Fatalf("%d segments, want %d", n, want)
	}
	var joined []byte
	for i := range n {
		b := out[i][:sizes[i]]
		l := checkFrame(t, b)
		if l.L3Off != lin.L3Off || l.L4Off != lin.L4Off || l.PayloadOff != lin.PayloadOff {
			t.Fatalf("segment %d layout %+v differs from input %+v", i, l, lin)
		}
		seg := b[l.PayloadOff:]
		if i < n-1 && len(seg) != gsoSize || len(seg) > gsoSize || len(seg) == 0 {
			t.Errorf("segment %d of %d carries %d payload bytes (gso_size %d)", i, n, len(seg), gsoSize)
		}
		joined = append(joined, seg...)
		if !bytes.Equal(maskMutable(b[:l.PayloadOff], l), maskMutable(in[:lin.PayloadOff], lin)) {
			t.Errorf("segment %d headers differ beyond the mutable fields:\n% x\n% x", i, b[:l.PayloadOff], in[:lin.PayloadOff])
		}
		if !l.IPv6 {
			id0 := binary.BigEndian.Uint16(in[lin.L3Off+4:])
			if id := binary.BigEndian.Uint16(b[l.L3Off+4:]); id != id0+uint16(i) {
				t.Errorf("segment %d IPv4 ID %#x, want %#x", i, id, id0+uint16(i))
			}
		}
		if l.L4Proto == ProtoTCP {
			seq0 := binary.BigEndian.Uint32(in[lin.L4Off+4:])
			if seq := binary.BigEndian.Uint32(b[l.L4Off+4:]); seq != seq0+uint32(i*gsoSize) {
				t.Errorf("segment %d seq %d, want %d", i, seq, seq0+uint32(i*gsoSize))
			}
			f0, f := in[lin.L4Off+13], b[l.L4Off+13]
			want := f0
			if i != n-1 {
				want &^= tcpFIN | tcpPSH
			}
			if i != 0 {
				want &^= tcpCWR
			}
			if f != want {
				t.Errorf("segment %d flags %#02x, want %#02x (input %#02x)", i, f, want, f0)
			}
		}
	}
	if !bytes.Equal(joined, payload) {
		t.Errorf("concatenated payload (%d bytes) differs from the original (%d bytes)", len(joined), len(payload))
	}
}

func TestSplit(t *testing.T) {
	tsOpt := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	for _, tc := range []struct {
		name    string
		p       pkt
		gsoSize int
		ecn     bool
		noCsum  bool // GSO without NEEDS_CSUM (tolerated: every checksum is recomputed anyway)
	}{
		{"tcp4 short tail", pkt{payload: pattern(5000, 1), flags: tcpACK | tcpPSH}, 1448, false, false},
		{"tcp4 exact multiple", pkt{payload: pattern(4*1448, 2)}, 1448, false, false},
		{"tcp4 64KiB", pkt{payload: pattern(65535-40, 3), seq: 0xfffff000, ipID: 0xfffe}, 1448, false, false},
		{"tcp4 FIN PSH last only", pkt{payload: pattern(3000, 4), flags: tcpACK | tcpPSH | tcpFIN}, 1000, false, false},
		{"tcp4 ECN CWR first only", pkt{payload: pattern(3000, 5), flags: tcpACK | tcpCWR | tcpECE, tos: 0x02}, 1000, true, false},
		{"tcp4 vlan", pkt{vlan: true, payload: pattern(4000, 6)}, 1448, false, false},
		{"tcp4 options", pkt{ipOpts: []byte{1, 1, 1, 0}, tcpOpts: tsOpt, payload: pattern(2897, 7)}, 1436, false, false},
		{"tcp4 one segment", pkt{payload: pattern(1000, 8), flags: tcpACK | tcpPSH | tcpFIN}, 1448, false, false},
		{"tcp4 one byte", pkt{payload: pattern(1, 8)}, 1448, false, false},
		{"tcp4 odd sizes", pkt{payload: pattern(1001, 9)}, 333, false, false},
		{"tcp4 padded input", pkt{payload: pattern(11, 9), pad: 20}, 4, false, false},
		{"tcp4 no NEEDS_CSUM", pkt{payload: pattern(3000, 10)}, 1448, false, true},
		{"tcp4 bogus partial sum", pkt{payload: pattern(3000, 11)}, 1448, false, false}, // built with a full csum, not the pseudo sum
		{"tcp6", pkt{v6: true, payload: pattern(6000, 12), flags: tcpACK | tcpPSH}, 1428, false, false},
		{"tcp6 ext headers vlan", pkt{v6: true, vlan: true, ext6: []uint8{ipv6ExtHopByHop, ipv6ExtDstOpts}, tcpOpts: tsOpt, payload: pattern(5000, 13)}, 1400, false, false},
		{"tcp6 ECN", pkt{v6: true, payload: pattern(3000, 14), flags: tcpACK | tcpCWR}, 1000, true, false},
		{"uso4", pkt{udp: true, payload: pattern(4000, 15), ipID: 0xffff}, 1472, false, false},
		{"uso4 vlan one segment", pkt{udp: true, vlan: true, payload: pattern(100, 16)}, 1472, false, false},
		{"uso6", pkt{v6: true, udp: true, payload: pattern(5001, 17)}, 1452, false, false},
		{"uso6 ext", pkt{v6: true, udp: true, ext6: []uint8{ipv6ExtDstOpts}, payload: pattern(3000, 18)}, 1000, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.partial = tc.name != "tcp4 bogus partial sum"
			in, l3, l4, _ := tc.p.build()
			orig := bytes.Clone(in)
			h := gsoHdr(tc.p, tc.gsoSize, l3, l4)
			if tc.ecn {
				h.GSOType |= GSOECN
			}
			if tc.noCsum {
				h.Flags, h.CsumStart, h.CsumOffset = 0, 0, 0
			}
			out, sizes := outBufs(64, 1600)
			n, err := Split(in, &h, out, sizes)
			if err != nil {
				t.Fatalf("Split: %v", err)
			}
			if !bytes.Equal(in, orig) {
				t.Errorf("Split modified its input")
			}
			checkSplit(t, in, tc.gsoSize, out, sizes, n)
			if n < len(out) && out[n][0] != 0xa5 {
				t.Errorf("Split wrote to out[%d] beyond its %d segments", n, n)
			}
		})
	}
}

func TestSplitUDPZeroChecksum(t *testing.T) {
	// Make the first segment's UDP checksum compute to 0: it must go out as 0xffff.
	p := pkt{udp: true, payload: make([]byte, 200), partial: true}
	in, l3, l4, pay := p.build()
	seg := bytes.Clone(in[:pay+100])
	binary.BigEndian.PutUint16(seg[l4+4:], 108)
	seg[l4+6], seg[l4+7] = 0, 0
	c := refChecksum(append(refPseudo(false, ProtoUDP, 108), seg[l4:]...))
	binary.BigEndian.PutUint16(in[pay:], c) // payload word = checksum → sum becomes 0xffff
	h := gsoHdr(p, 100, l3, l4)
	out, sizes := outBufs(4, 1600)
	n, err := Split(in, &h, out, sizes)
	if err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint16(out[0][l4+6:]); got != 0xffff {
		t.Errorf("zero UDP checksum sent as %#04x, want 0xffff", got)
	}
	checkSplit(t, in, 100, out, sizes, n)
}

func TestSplitErrors(t *testing.T) {
	tcp4, l3, l4, _ := pkt{payload: pattern(3000, 1), partial: true}.build()
	tcp6, _, l4v6, _ := pkt{v6: true, payload: pattern(3000, 1), partial: true}.build()
	udp4, _, _, _ := pkt{udp: true, payload: pattern(3000, 1), partial: true}.build()
	ack4, _, _, _ := pkt{partial: true}.build()
	frag4, _, _, _ := pkt{ipFrag: 0x2000, payload: pattern(3000, 1)}.build()
	routed, _, l4r, _ := pkt{v6: true, ext6: []uint8{ipv6ExtRouting}, segsLeft: 1, payload: pattern(3000, 1)}.build()
	ok4 := gsoHdr(pkt{}, 1000, l3, l4)
	with := func(h Hdr, f func(*Hdr)) Hdr { f(&h); return h }
	for _, tc := range []struct {
		name   string
		frame  []byte
		h      Hdr
		nOut   int
		outLen int
		want   error
	}{
		{"gso_size 0", tcp4, with(ok4, func(h *Hdr) { h.GSOSize = 0 }), 8, 1600, ErrBadHeader},
		{"csum_start off by one", tcp4, with(ok4, func(h *Hdr) { h.CsumStart++ }), 8, 1600, ErrBadHeader},
		{"csum_start at IP header", tcp4, with(ok4, func(h *Hdr) { h.CsumStart = uint16(l3) }), 8, 1600, ErrBadHeader},
		{"csum_offset udp on tcp", tcp4, with(ok4, func(h *Hdr) { h.CsumOffset = 6 }), 8, 1600, ErrBadHeader},
		{"rsc_info with needs_csum", tcp4, with(ok4, func(h *Hdr) { h.Flags |= FlagRSCInfo }), 8, 1600, ErrBadHeader},
		{"too few buffers", tcp4, ok4, 2, 1600, ErrTooManySegments},
		{"too few buffers gso 1", tcp4, with(ok4, func(h *Hdr) { h.GSOSize = 1 }), 64, 1600, ErrTooManySegments},
		{"short buffer", tcp4, ok4, 8, 1000, ErrShortBuffer},
		{"ufo", udp4, with(ok4, func(h *Hdr) { h.GSOType = GSOUDP; h.CsumOffset = 6 }), 8, 1600, ErrUnsupportedGSO},
		{"unknown gso type", tcp4, with(ok4, func(h *Hdr) { h.GSOType = 2 }), 8, 1600, ErrUnsupportedGSO},
		{"not gso", tcp4, with(ok4, func(h *Hdr) { h.GSOType = GSONone }), 8, 1600, ErrBadHeader},
		{"tcpv4 on ipv6", tcp6, with(ok4, func(h *Hdr) { h.CsumStart = uint16(l4v6) }), 8, 1600, ErrBadHeader},
		{"tcpv6 on ipv4", tcp4, with(ok4, func(h *Hdr) { h.GSOType = GSOTCPv6 }), 8, 1600, ErrBadHeader},
		{"uso on tcp", tcp4, with(ok4, func(h *Hdr) { h.GSOType = GSOUDPL4; h.CsumOffset = 6 }), 8, 1600, ErrBadHeader},
		{"tso on udp", udp4, ok4, 8, 1600, ErrBadHeader},
		{"uso with ecn", udp4, with(ok4, func(h *Hdr) { h.GSOType = GSOUDPL4 | GSOECN; h.CsumOffset = 6 }), 8, 1600, ErrBadHeader},
		{"zero payload", ack4, ok4, 8, 1600, ErrBadHeader},
		{"fragment", frag4, with(ok4, func(h *Hdr) { h.Flags = 0 }), 8, 1600, ErrBadHeader},
		{"routed ipv6", routed, with(ok4, func(h *Hdr) { h.GSOType = GSOTCPv6; h.CsumStart = uint16(l4r) }), 8, 1600, ErrUnsupportedGSO},
		{"malformed frame", tcp4[:30], ok4, 8, 1600, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, sizes := outBufs(tc.nOut, tc.outLen)
			h := tc.h
			n, err := Split(tc.frame, &h, out, sizes)
			if !errors.Is(err, tc.want) || n != 0 {
				t.Fatalf("Split = %d, %v; want 0, %v", n, err, tc.want)
			}
			t.Log(err)
			for i := range out {
				if !bytes.Equal(out[i], bytes.Repeat([]byte{0xa5}, tc.outLen)) {
					t.Fatalf("out[%d] written despite the error", i)
				}
			}
			// Plan makes every check Split makes but the ones about the caller's buffers
			// (and holds segments to MaxSegments).
			pl, perr := Plan(tc.frame, &h)
			buffers := errors.Is(err, ErrTooManySegments) || errors.Is(err, ErrShortBuffer)
			if buffers && pl.Segments > MaxSegments || buffers != (perr == nil) && !errors.Is(perr, ErrTooManySegments) {
				t.Errorf("Plan = %v where Split = %v", perr, err)
			}
		})
	}
}

func TestCompleteChecksum(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    pkt
	}{
		{"tcp4", pkt{payload: pattern(1400, 1)}},
		{"tcp4 odd", pkt{payload: pattern(1401, 2)}},
		{"tcp4 vlan options", pkt{vlan: true, ipOpts: []byte{1, 1, 1, 0}, tcpOpts: []byte{1, 1, 1, 1}, payload: pattern(99, 3)}},
		{"tcp6", pkt{v6: true, payload: pattern(1000, 4)}},
		{"udp4", pkt{udp: true, payload: pattern(513, 5)}},
		{"udp6 ext", pkt{v6: true, udp: true, ext6: []uint8{ipv6ExtDstOpts}, payload: pattern(64, 6)}},
		{"udp4 empty", pkt{udp: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			full, _, _, _ := tc.p.build()
			tc.p.partial = true
			f, _, l4, _ := tc.p.build()
			h := Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4), CsumOffset: 16}
			if tc.p.udp {
				h.CsumOffset = 6
			}
			if err := CompleteChecksum(f, &h); err != nil {
				t.Fatal(err)
			}
			checkFrame(t, f)
			if !bytes.Equal(f, full) {
				t.Errorf("completed frame differs from the fully checksummed one")
			}
		})
	}
}

func TestCompleteChecksumZeroBecomesFFFF(t *testing.T) {
	p := pkt{udp: true, payload: make([]byte, 10), partial: true}
	f, _, l4, pay := p.build()
	full := bytes.Clone(f)
	full[l4+6], full[l4+7] = 0, 0
	c := refChecksum(append(refPseudo(false, ProtoUDP, len(f)-l4), full[l4:]...))
	binary.BigEndian.PutUint16(f[pay:], c) // now the data sums to 0xffff: computed checksum 0
	h := Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4), CsumOffset: 6}
	if err := CompleteChecksum(f, &h); err != nil {
		t.Fatal(err)
	}
	if got := binary.BigEndian.Uint16(f[l4+6:]); got != 0xffff {
		t.Errorf("checksum %#04x, want 0xffff", got)
	}
	checkFrame(t, f)
}

func TestCompleteChecksumErrors(t *testing.T) {
	f, _, _, _ := pkt{udp: true, payload: pattern(10, 1), partial: true}.build()
	n := len(f)
	for _, tc := range []struct {
		name string
		h    Hdr
	}{
		{"start at end", Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(n), CsumOffset: 0}},
		{"field past end", Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(n - 4), CsumOffset: 3}},
		{"huge", Hdr{Flags: FlagNeedsCsum, CsumStart: 0xffff, CsumOffset: 0xffff}},
		{"gso", Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv4, GSOSize: 100, CsumStart: 34, CsumOffset: 16}},
		{"rsc", Hdr{Flags: FlagNeedsCsum | FlagRSCInfo, CsumStart: 34, CsumOffset: 6}},
	} {
		c := bytes.Clone(f)
		if err := CompleteChecksum(c, &tc.h); !errors.Is(err, ErrBadHeader) {
			t.Errorf("%s: err %v, want ErrBadHeader", tc.name, err)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
		if !bytes.Equal(c, f) {
			t.Errorf("%s: frame modified despite error", tc.name)
		}
	}
	// Last legal position: field ends exactly at the frame end.
	c := bytes.Clone(f)
	if err := CompleteChecksum(c, &Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(n - 2), CsumOffset: 0}); err != nil {
		t.Errorf("field at the very end: %v", err)
	}
	// Without NEEDS_CSUM nothing happens.
	c = bytes.Clone(f)
	if err := CompleteChecksum(c, &Hdr{CsumStart: 0xffff}); err != nil || !bytes.Equal(c, f) {
		t.Errorf("no NEEDS_CSUM: err %v, modified %t", err, !bytes.Equal(c, f))
	}
}

// Plan says beforehand what Split then does: as many segments, none longer than SegCap,
// each repeating HdrLen header bytes; and it refuses more than MaxSegments.
func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    pkt
		mss  int
	}{
		{"tcp4 3 segments", pkt{payload: pattern(4000, 3)}, 1448},
		{"tcp4 exact", pkt{payload: pattern(2896, 4)}, 1448},
		{"tcp4 one segment", pkt{payload: pattern(100, 5)}, 1448},
		{"tcp6 vlan ext", pkt{v6: true, vlan: true, ext6: []uint8{ipv6ExtDstOpts}, payload: pattern(3000, 6)}, 1000},
		{"udp4", pkt{udp: true, payload: pattern(3001, 7)}, 1472},
		{"tcp4 options padded", pkt{ipOpts: []byte{1, 1, 1, 0}, tcpOpts: []byte{1, 1, 1, 1}, payload: pattern(999, 8), pad: 3}, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.partial = true
			f, l3, l4, _ := tc.p.build()
			h := gsoHdr(tc.p, tc.mss, l3, l4)
			pl, err := Plan(f, &h)
			if err != nil {
				t.Fatal(err)
			}
			l, _ := ParseLayout(f)
			if pl.HdrLen != l.PayloadOff || pl.SegCap != l.PayloadOff+tc.mss || pl.Segments != (l.PayloadLen()+tc.mss-1)/tc.mss {
				t.Fatalf("plan %+v for %d payload bytes behind %d header bytes at mss %d", pl, l.PayloadLen(), l.PayloadOff, tc.mss)
			}
			out, sizes := outBufs(pl.Segments, pl.SegCap)
			n, err := Split(f, &h, out, sizes)
			if err != nil || n != pl.Segments {
				t.Fatalf("Split into the planned buffers = %d, %v; plan %+v", n, err, pl)
			}
			checkSplit(t, f, tc.mss, out, sizes, n)
		})
	}

	p := pkt{payload: pattern(MaxSegments+1, 9), partial: true}
	f, l3, l4, _ := p.build()
	h := gsoHdr(p, 1, l3, l4)
	if pl, err := Plan(f, &h); !errors.Is(err, ErrTooManySegments) {
		t.Errorf("%d segments: plan %+v, %v; want ErrTooManySegments", MaxSegments+1, pl, err)
	}
	h.GSOSize = 2
	if pl, err := Plan(f, &h); err != nil || pl.Segments != (MaxSegments+2)/2 {
		t.Errorf("%d segments: plan %+v, %v", (MaxSegments+2)/2, pl, err)
	}
	if _, err := Plan(f, &Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4), CsumOffset: 16}); !errors.Is(err, ErrBadHeader) {
		t.Errorf("Plan of a frame without GSO: %v, want ErrBadHeader", err)
	}
}

// maxTSO4 is the largest TCP/IPv4 TSO frame (MSS 1448, partial checksum) with its
// header, and the L4 offset, for the allocation tests and benchmarks.
func maxTSO4() ([]byte, Hdr, int) {
	p := pkt{payload: pattern(65535-40, 1), partial: true}
	in, l3, l4, _ := p.build()
	return in, gsoHdr(p, 1448, l3, l4), l4
}

func TestAllocs(t *testing.T) {
	in, h, l4 := maxTSO4()
	out, sizes := outBufs(64, 1600)
	if a := testing.AllocsPerRun(50, func() {
		if _, err := Split(in, &h, out, sizes); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("Split allocates %.1f per run", a)
	}
	if a := testing.AllocsPerRun(50, func() {
		if _, err := Plan(in, &h); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("Plan allocates %.1f per run", a)
	}
	f := out[0][:sizes[0]]
	hc := Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4), CsumOffset: 16}
	if a := testing.AllocsPerRun(50, func() {
		if err := CompleteChecksum(f, &hc); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("CompleteChecksum allocates %.1f per run", a)
	}
}

func BenchmarkSplitTCPv4(b *testing.B) {
	in, h, _ := maxTSO4()
	out, sizes := outBufs(64, 1600)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Split(in, &h, out, sizes); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompleteChecksum1500(b *testing.B) {
	p := pkt{payload: pattern(1460, 1), partial: true}
	f, _, l4, _ := p.build()
	h := Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4), CsumOffset: 16}
	b.SetBytes(int64(len(f)))
	b.ReportAllocs()
	for b.Loop() {
		// Re-seed the field so every iteration does the real work on a partial frame.
		binary.BigEndian.PutUint16(f[l4+16:], 0x1234)
		if err := CompleteChecksum(f, &h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseLayout(b *testing.B) {
	f, _, _, _ := pkt{v6: true, vlan: true, payload: pattern(1400, 1)}.build()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseLayout(f); err != nil {
			b.Fatal(err)
		}
	}
}

var (
	fuzzOut, fuzzSizes = outBufs(64, 4096)
	fuzzHdrs, _        = outBufs(64, 4096)
	fuzzPayloads       = make([][]byte, 64)
)

func FuzzSplit(f *testing.F) {
	for _, tc := range []struct {
		p   pkt
		gso int
	}{
		// Small payloads: the fuzzer minimises every new interesting input (up to 60 s
		// by default), which is quadratic-ish in its size.
		{pkt{payload: pattern(300, 1), flags: tcpACK | tcpPSH | tcpFIN | tcpCWR}, 128},
		{pkt{v6: true, vlan: true, ext6: []uint8{ipv6ExtHopByHop}, payload: pattern(200, 2)}, 70},
		{pkt{udp: true, payload: pattern(100, 3)}, 30},
		{pkt{v6: true, udp: true, payload: pattern(77, 4)}, 1452},
		{pkt{ipOpts: []byte{1, 1, 1, 0}, tcpOpts: []byte{1, 1, 1, 1}, payload: pattern(64, 5), pad: 3}, 7},
	} {
		tc.p.partial = true
		b, l3, l4, _ := tc.p.build()
		h := gsoHdr(tc.p, tc.gso, l3, l4)
		f.Add(b, h.Flags, h.GSOType, h.GSOSize, h.CsumStart, h.CsumOffset)
	}
	f.Add([]byte{}, uint8(1), uint8(1), uint16(1), uint16(34), uint16(16))
	f.Fuzz(func(t *testing.T, frame []byte, flags, gsoType uint8, gsoSize, csumStart, csumOffset uint16) {
		h := Hdr{Flags: flags, GSOType: gsoType, GSOSize: gsoSize, CsumStart: csumStart, CsumOffset: csumOffset}
		// CompleteChecksum (which writes in place) must not panic either.
		nh := h
		nh.GSOType = GSONone
		_ = CompleteChecksum(bytes.Clone(frame), &nh)
		// Plan must agree with Split wherever the fuzz buffers are big enough.
		pl, perr := Plan(frame, &h)
		fits := perr == nil && pl.Segments <= len(fuzzOut) && pl.SegCap <= len(fuzzOut[0])

		in := bytes.Clone(frame)
		n, err := Split(frame, &h, fuzzOut, fuzzSizes)
		if !bytes.Equal(in, frame) {
			t.Fatalf("Split modified its input")
		}
		if fits && (err != nil || n != pl.Segments) || perr != nil && err == nil {
			t.Fatalf("Plan %+v, %v but Split %d, %v", pl, perr, n, err)
		}
		if err != nil {
			if n != 0 {
				t.Fatalf("n = %d with error %v", n, err)
			}
			for _, s := range []error{ErrBadHeader, ErrUnsupportedGSO, ErrTooManySegments, ErrShortBuffer} {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("error %v wraps no sentinel", err)
		}
		l, perr := ParseLayout(frame)
		if perr != nil {
			t.Fatalf("Split succeeded on a frame ParseLayout rejects: %v", perr)
		}
		total := 0
		for i := range n {
			if fuzzSizes[i] > len(fuzzOut[i]) || fuzzSizes[i] <= l.PayloadOff {
				t.Fatalf("sizes[%d] = %d (buffer %d, headers %d)", i, fuzzSizes[i], len(fuzzOut[i]), l.PayloadOff)
			}
			total += fuzzSizes[i] - l.PayloadOff
		}
		if total != l.PayloadLen() {
			t.Fatalf("segments carry %d payload bytes, input has %d", total, l.PayloadLen())
		}
		checkSplit(t, frame, int(gsoSize), fuzzOut, fuzzSizes, n)
		// SplitHeaders' header slots and payload views are Split's segments.
		m, err := SplitHeaders(frame, &h, fuzzHdrs, fuzzPayloads)
		if err != nil || m != n {
			t.Fatalf("SplitHeaders = %d, %v where Split = %d", m, err, n)
		}
		for i := range n {
			seg := fuzzOut[i][:fuzzSizes[i]]
			if !bytes.Equal(fuzzHdrs[i][:l.PayloadOff], seg[:l.PayloadOff]) || !bytes.Equal(fuzzPayloads[i], seg[l.PayloadOff:]) {
				t.Fatalf("SplitHeaders segment %d differs from Split's", i)
			}
		}
	})
}
