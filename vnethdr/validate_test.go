package vnethdr

import (
	"bytes"
	"errors"
	"testing"
)

// TestValidatePeerAccepts: what a Linux TAP hands a reader (and so what a peer tapgro
// forwards) passes, and hdr_len comes back re-derived whatever the sender put there.
func TestValidatePeerAccepts(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    pkt
		gso  int
	}{
		{"tcp4", pkt{payload: pattern(65000, 1)}, 1448},
		{"tcp4 options", pkt{ipOpts: []byte{1, 1, 1, 0}, tcpOpts: []byte{1, 1, 1, 1, 1, 1, 1, 1}, payload: pattern(5000, 1)}, 1448},
		{"tcp4 vlan", pkt{vlan: true, payload: pattern(5000, 1)}, 1448},
		{"tcp6", pkt{v6: true, payload: pattern(60000, 2)}, 1428},
		{"tcp6 ext", pkt{v6: true, ext6: []uint8{ipv6ExtHopByHop, ipv6ExtDstOpts}, payload: pattern(5000, 2)}, 1400},
		{"uso4", pkt{udp: true, payload: pattern(14000, 3)}, 1400},
		{"uso6", pkt{v6: true, udp: true, payload: pattern(14000, 4)}, 1400},
		{"one full segment", pkt{payload: pattern(1448, 5)}, 1448},
		{"uso at the segment limit", pkt{udp: true, payload: pattern(MaxUSOSegments*100, 6)}, 100},
		{"tcp at the segment limit", pkt{payload: pattern(MaxSegments*60, 7)}, 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.p.partial = true
			frame, l3, l4, pay := tc.p.build()
			for _, hint := range []uint16{0, uint16(pay), uint16(len(frame)), 14} {
				h := gsoHdr(tc.p, tc.gso, l3, l4)
				h.HdrLen = hint
				if err := ValidatePeer(frame, &h); err != nil {
					t.Fatalf("hdr_len %d: %v", hint, err)
				}
				if int(h.HdrLen) != pay {
					t.Fatalf("hdr_len %d became %d, want the %d header bytes", hint, h.HdrLen, pay)
				}
				// What it admits, the software fallback can always split.
				out, sizes := outBufs(MaxSegments, pay+tc.gso)
				if _, err := Split(frame, &h, out, sizes); err != nil {
					t.Fatalf("admitted, but Split fails: %v", err)
				}
			}
			// The same frame with ECN (TCP) and without NEEDS_CSUM (TCP: the kernel
			// flow-dissects it instead) is still valid.
			if !tc.p.udp {
				h := gsoHdr(tc.p, tc.gso, l3, l4)
				h.HdrLen = 0
				h.GSOType |= GSOECN
				if err := ValidatePeer(frame, &h); err != nil {
					t.Errorf("with ECN: %v", err)
				}
				h.Flags = FlagDataValid
				if err := ValidatePeer(frame, &h); err != nil {
					t.Errorf("without NEEDS_CSUM: %v", err)
				}
			}
		})
	}

	// Partial checksums without GSO, and plain frames.
	tcp, _, l4, pay := pkt{payload: pattern(1000, 1), partial: true}.build()
	h := Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4), CsumOffset: 16, HdrLen: 3000}
	if err := ValidatePeer(tcp, &h); err == nil {
		t.Error("hdr_len past the frame accepted on a partial checksum")
	}
	h.HdrLen = 0
	if err := ValidatePeer(tcp, &h); err != nil || int(h.HdrLen) != pay {
		t.Errorf("partial TCP checksum: %v, hdr_len %d (want %d)", err, h.HdrLen, pay)
	}
	if err := CompleteChecksum(bytes.Clone(tcp), &h); err != nil {
		t.Errorf("admitted, but CompleteChecksum fails: %v", err)
	}
	udp, _, l4u, _ := pkt{udp: true, v6: true, payload: pattern(1000, 1), partial: true}.build()
	if err := ValidatePeer(udp, &Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4u), CsumOffset: 6}); err != nil {
		t.Errorf("partial UDP checksum: %v", err)
	}
	// The inner TCP checksum of a UDP tunnel: csum_start past the outer UDP header.
	inner := pkt{udp: true, payload: pattern(1000, 2), partial: true}
	vx, _, l4x, payx := inner.build()
	if err := ValidatePeer(vx, &Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(payx + 8 + 14 + 20), CsumOffset: 16}); err != nil {
		t.Errorf("inner checksum of a UDP tunnel: %v", err)
	}
	if err := ValidatePeer(vx, &Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4x + 2), CsumOffset: 4}); err == nil {
		t.Error("csum_start inside the UDP header accepted")
	}
	// A QinQ frame: ParseLayout does not look inside, the field must lie in the frame.
	qinq := bytes.Clone(tcp)
	qinq[12], qinq[13] = 0x88, 0xa8
	if err := ValidatePeer(qinq, &Hdr{Flags: FlagNeedsCsum, CsumStart: 40, CsumOffset: 16}); err != nil {
		t.Errorf("partial checksum on a frame that is not parsed: %v", err)
	}
	for _, p := range []Hdr{{}, {Flags: FlagDataValid}, {Flags: FlagDataValid, HdrLen: 60000, GSOSize: 7, CsumStart: 9999}} {
		hp := p
		if err := ValidatePeer([]byte{1, 2, 3}, &hp); err != nil || hp != p {
			t.Errorf("plain header %v: %v, became %v", p, err, hp)
		}
	}
}

// TestValidatePeerRejects: every header the kernel's write path refuses (tun_get_user,
// virtio_net_hdr_to_skb), and every one that contradicts its frame, is rejected, with h
// left as it was.
func TestValidatePeerRejects(t *testing.T) {
	tcp4, l3, l4, _ := pkt{payload: pattern(5000, 1), partial: true}.build()
	tcp6, _, l4v6, _ := pkt{v6: true, payload: pattern(5000, 1), partial: true}.build()
	udp4, _, l4u, _ := pkt{udp: true, payload: pattern(5000, 1), partial: true}.build()
	ack4, _, _, _ := pkt{partial: true}.build()
	frag4, _, _, _ := pkt{ipFrag: 0x2000, payload: pattern(5000, 1), partial: true}.build()
	padded, _, _, _ := pkt{payload: pattern(5000, 1), partial: true, pad: 6}.build()
	routed, _, l4r, _ := pkt{v6: true, ext6: []uint8{ipv6ExtRouting}, segsLeft: 1, payload: pattern(5000, 1), partial: true}.build()
	// gsoHdr's hdr_len is garbage on purpose; here it would hide every other reason.
	ok4 := gsoHdr(pkt{}, 1448, l3, l4)
	ok6 := gsoHdr(pkt{v6: true}, 1448, 0, l4v6)
	oku := gsoHdr(pkt{udp: true}, 1400, 0, l4u)
	ok4.HdrLen, ok6.HdrLen, oku.HdrLen = 0, 0, 0
	partial := Hdr{Flags: FlagNeedsCsum, CsumStart: uint16(l4), CsumOffset: 16}
	with := func(h Hdr, f func(*Hdr)) Hdr { f(&h); return h }
	for _, tc := range []struct {
		name  string
		frame []byte
		h     Hdr
		want  error
	}{
		// The records of issue 12 item 4: the kernel answers EINVAL.
		{"tcp4 hdr_len past the frame", tcp4, with(ok4, func(h *Hdr) { h.HdrLen = uint16(len(tcp4) + 1) }), ErrBadHeader},
		{"tcp4 gso_size 0xffff", tcp4, with(ok4, func(h *Hdr) { h.GSOSize = 0xffff }), ErrBadHeader},
		{"tcp6 hdr_len past the frame", tcp6, with(ok6, func(h *Hdr) { h.HdrLen = 0xffff }), ErrBadHeader},
		{"tcp6 gso_size 0xffff", tcp6, with(ok6, func(h *Hdr) { h.GSOSize = 0xffff }), ErrBadHeader},
		{"uso hdr_len past the frame", udp4, with(oku, func(h *Hdr) { h.HdrLen = uint16(len(udp4) + 100) }), ErrBadHeader},
		{"uso gso_size 0xffff", udp4, with(oku, func(h *Hdr) { h.GSOSize = 0xffff }), ErrBadHeader},
		// tun_get_user
		{"hdr_len below an Ethernet header", tcp4, with(ok4, func(h *Hdr) { h.HdrLen = 13 }), ErrBadHeader},
		// virtio_net_hdr_to_skb and the segmenters
		{"gso_size 0", tcp4, with(ok4, func(h *Hdr) { h.GSOSize = 0 }), ErrBadHeader},
		{"gso_size past the payload", tcp4, with(ok4, func(h *Hdr) { h.GSOSize = 5001 }), ErrBadHeader},
		{"zero payload", ack4, with(ok4, func(h *Hdr) { h.GSOSize = 1 }), ErrBadHeader},
		{"too many tcp segments", tcp4, with(ok4, func(h *Hdr) { h.GSOSize = 4 }), ErrBadHeader},
		{"too many uso segments", udp4, with(oku, func(h *Hdr) { h.GSOSize = 30 }), ErrBadHeader},
		{"unknown gso type", tcp4, with(ok4, func(h *Hdr) { h.GSOType = 2 }), ErrUnsupportedGSO},
		{"ufo", udp4, with(oku, func(h *Hdr) { h.GSOType = GSOUDP }), ErrUnsupportedGSO},
		{"udp tunnel", tcp4, with(ok4, func(h *Hdr) { h.GSOType = 0x20 | GSOTCPv4 }), ErrUnsupportedGSO},
		{"ecn alone", tcp4, with(partial, func(h *Hdr) { h.GSOType = GSOECN }), ErrBadHeader},
		{"ecn on uso", udp4, with(oku, func(h *Hdr) { h.GSOType |= GSOECN }), ErrBadHeader},
		{"uso without needs_csum", udp4, with(oku, func(h *Hdr) { h.Flags = 0 }), ErrBadHeader},
		{"tcpv4 on ipv6", tcp6, with(ok6, func(h *Hdr) { h.GSOType = GSOTCPv4 }), ErrBadHeader},
		{"tcpv6 on ipv4", tcp4, with(ok4, func(h *Hdr) { h.GSOType = GSOTCPv6 }), ErrBadHeader},
		{"tso on udp", udp4, with(oku, func(h *Hdr) { h.GSOType = GSOTCPv4; h.CsumOffset = 16 }), ErrBadHeader},
		{"uso on tcp", tcp4, with(ok4, func(h *Hdr) { h.GSOType = GSOUDPL4; h.CsumOffset = 6 }), ErrBadHeader},
		{"csum_start off by one", tcp4, with(ok4, func(h *Hdr) { h.CsumStart++ }), ErrBadHeader},
		{"csum_start at the IP header", tcp4, with(ok4, func(h *Hdr) { h.CsumStart = uint16(l3) }), ErrBadHeader},
		{"csum_offset 6 on tcp", tcp4, with(ok4, func(h *Hdr) { h.CsumOffset = 6 }), ErrBadHeader},
		{"csum_offset 16 on uso", udp4, with(oku, func(h *Hdr) { h.CsumOffset = 16 }), ErrBadHeader},
		{"rsc_info", tcp4, with(ok4, func(h *Hdr) { h.Flags |= FlagRSCInfo }), ErrBadHeader},
		{"unknown flag", tcp4, with(ok4, func(h *Hdr) { h.Flags |= 0x40 }), ErrBadHeader},
		{"fragment", frag4, ok4, ErrBadHeader},
		{"padding after a gso frame", padded, ok4, ErrBadHeader},
		{"routed ipv6", routed, with(ok6, func(h *Hdr) { h.CsumStart = uint16(l4r) }), ErrUnsupportedGSO},
		{"truncated headers", tcp4[:40], ok4, ErrMalformed},
		{"not ip", bytes.Repeat([]byte{0xff}, 100), ok4, ErrBadHeader},
		// Partial checksums without GSO.
		{"partial csum_start past the frame", tcp4, with(partial, func(h *Hdr) { h.CsumStart = 0xfff0 }), ErrBadHeader},
		{"partial field past the frame", tcp4, with(partial, func(h *Hdr) { h.CsumOffset = uint16(len(tcp4)) }), ErrBadHeader},
		{"partial field in the padding", padded, with(partial, func(h *Hdr) { h.CsumStart = uint16(len(padded) - 4); h.CsumOffset = 0 }), ErrBadHeader},
		{"partial csum_start in the IP header", tcp4, with(partial, func(h *Hdr) { h.CsumStart = uint16(l3) }), ErrBadHeader},
		{"partial tcp not at the tcp checksum", tcp4, with(partial, func(h *Hdr) { h.CsumOffset = 6 }), ErrBadHeader},
		{"partial hdr_len past the frame", tcp4, with(partial, func(h *Hdr) { h.HdrLen = 0xffff }), ErrBadHeader},
		{"partial with rsc_info", tcp4, with(partial, func(h *Hdr) { h.Flags |= FlagRSCInfo }), ErrBadHeader},
		{"partial on truncated headers", tcp4[:40], partial, ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.h
			err := ValidatePeer(tc.frame, &h)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ValidatePeer(%v) = %v, want %v", tc.h, err, tc.want)
			}
			t.Log(err)
			if h != tc.h {
				t.Errorf("header changed on error: %v, was %v", h, tc.h)
			}
		})
	}
}

func TestValidatePeerAllocs(t *testing.T) {
	p := pkt{v6: true, ext6: []uint8{ipv6ExtHopByHop}, payload: pattern(65000, 1), partial: true}
	frame, l3, l4, _ := p.build()
	h := gsoHdr(p, 1448, l3, l4)
	h.HdrLen = 0
	if a := testing.AllocsPerRun(100, func() {
		hh := h
		if err := ValidatePeer(frame, &hh); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("ValidatePeer allocates %.1f per run", a)
	}
}

// FuzzValidatePeer: whatever ValidatePeer admits, the rest of the package can handle —
// Split with MaxSegments buffers for GSO, CompleteChecksum for a partial checksum —
// and the header it leaves fits the frame.
func FuzzValidatePeer(f *testing.F) {
	for _, tc := range []struct {
		p   pkt
		gso int
	}{
		{pkt{payload: pattern(300, 1)}, 128},
		{pkt{v6: true, vlan: true, ext6: []uint8{ipv6ExtHopByHop}, payload: pattern(200, 2)}, 70},
		{pkt{udp: true, payload: pattern(100, 3)}, 30},
		{pkt{ipOpts: []byte{1, 1, 1, 0}, tcpOpts: []byte{1, 1, 1, 1}, payload: pattern(64, 5)}, 7},
	} {
		tc.p.partial = true
		b, l3, l4, _ := tc.p.build()
		h := gsoHdr(tc.p, tc.gso, l3, l4)
		f.Add(b, h.Flags, h.GSOType, h.HdrLen, h.GSOSize, h.CsumStart, h.CsumOffset)
	}
	out, sizes := make([][]byte, MaxSegments), make([]int, MaxSegments)
	f.Fuzz(func(t *testing.T, frame []byte, flags, gsoType uint8, hdrLen, gsoSize, csumStart, csumOffset uint16) {
		h := Hdr{Flags: flags, GSOType: gsoType, HdrLen: hdrLen, GSOSize: gsoSize, CsumStart: csumStart, CsumOffset: csumOffset}
		if ValidatePeer(frame, &h) != nil {
			return
		}
		if h.GSOType == GSONone && h.Flags&FlagNeedsCsum == 0 {
			return
		}
		if int(h.HdrLen) > len(frame) || h.HdrLen < 14 {
			t.Fatalf("admitted with hdr_len %d for a %d-byte frame", h.HdrLen, len(frame))
		}
		if !h.IsGSO() {
			if err := CompleteChecksum(bytes.Clone(frame), &h); err != nil {
				t.Fatalf("admitted, but CompleteChecksum fails: %v", err)
			}
			return
		}
		l, err := ParseLayout(frame)
		if err != nil {
			t.Fatalf("admitted a GSO frame ParseLayout rejects: %v", err)
		}
		nseg := (l.PayloadLen() + int(h.GSOSize) - 1) / int(h.GSOSize)
		for i := range nseg {
			out[i] = make([]byte, int(h.HdrLen)+int(h.GSOSize))
		}
		if _, err := Split(frame, &h, out[:nseg], sizes[:nseg]); err != nil {
			t.Fatalf("admitted %v, but Split fails: %v", h, err)
		}
	})
}
