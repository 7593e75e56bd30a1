package vnethdr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

func TestParseLayoutValid(t *testing.T) {
	tsOpt := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	for _, tc := range []struct {
		name string
		p    pkt
		want Layout
	}{
		{"tcp4", pkt{payload: pattern(100, 1)},
			Layout{EtherType: EtherTypeIPv4, L4Proto: ProtoTCP, L3Off: 14, L4Off: 34, PayloadOff: 54, End: 154}},
		{"tcp4 vlan ipopts tcpopts", pkt{vlan: true, ipOpts: []byte{1, 1, 1, 0}, tcpOpts: tsOpt, payload: pattern(10, 1)},
			Layout{EtherType: EtherTypeIPv4, VLAN: true, L4Proto: ProtoTCP, L3Off: 18, L4Off: 42, PayloadOff: 74, End: 84}},
		{"tcp4 padded", pkt{payload: pattern(2, 1), pad: 4},
			Layout{EtherType: EtherTypeIPv4, L4Proto: ProtoTCP, L3Off: 14, L4Off: 34, PayloadOff: 54, End: 56}},
		{"udp4 empty", pkt{udp: true},
			Layout{EtherType: EtherTypeIPv4, L4Proto: ProtoUDP, L3Off: 14, L4Off: 34, PayloadOff: 42, End: 42}},
		{"tcp6", pkt{v6: true, payload: pattern(1000, 1)},
			Layout{EtherType: EtherTypeIPv6, IPv6: true, L4Proto: ProtoTCP, L3Off: 14, L4Off: 54, PayloadOff: 74, End: 1074}},
		{"udp6 hbh+dstopts+routing(0 left)", pkt{v6: true, udp: true, ext6: []uint8{ipv6ExtHopByHop, ipv6ExtDstOpts, ipv6ExtRouting}, payload: pattern(3, 1)},
			Layout{EtherType: EtherTypeIPv6, IPv6: true, L4Proto: ProtoUDP, L3Off: 14, L4Off: 78, PayloadOff: 86, End: 89}},
		{"tcp6 routed", pkt{v6: true, ext6: []uint8{ipv6ExtRouting}, segsLeft: 2, payload: pattern(3, 1)},
			Layout{EtherType: EtherTypeIPv6, IPv6: true, Routed: true, L4Proto: ProtoTCP, L3Off: 14, L4Off: 62, PayloadOff: 82, End: 85}},
		{"tcp6 fragment", pkt{v6: true, ext6: []uint8{ipv6ExtFragment}, payload: pattern(3, 1)},
			Layout{EtherType: EtherTypeIPv6, IPv6: true, Fragment: true, L4Proto: ProtoTCP, L3Off: 14, L4Off: 62, PayloadOff: 62, End: 85}},
		{"tcp4 MF fragment", pkt{ipFrag: 0x2000, payload: pattern(3, 1)},
			Layout{EtherType: EtherTypeIPv4, Fragment: true, L4Proto: ProtoTCP, L3Off: 14, L4Off: 34, PayloadOff: 34, End: 57}},
		{"tcp4 offset fragment", pkt{ipFrag: 0x0001, payload: pattern(3, 1)},
			Layout{EtherType: EtherTypeIPv4, Fragment: true, L4Proto: ProtoTCP, L3Off: 14, L4Off: 34, PayloadOff: 34, End: 57}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _, _, _ := tc.p.build()
			got, err := ParseLayout(f)
			if err != nil {
				t.Fatalf("ParseLayout: %v", err)
			}
			if got != tc.want {
				t.Fatalf("\n got %+v\nwant %+v", got, tc.want)
			}
			if !got.IPv6 && !got.IPv4HeaderChecksumValid(f) {
				t.Errorf("IPv4HeaderChecksumValid false on a valid header")
			}
			if got.HdrLen() != got.PayloadOff || got.PayloadLen() != got.End-got.PayloadOff {
				t.Errorf("HdrLen/PayloadLen inconsistent")
			}
			// Every truncation that cuts into the IP packet must be reported, not misparsed.
			for n := range got.End {
				if _, err := ParseLayout(f[:n]); err == nil {
					t.Fatalf("prefix of %d bytes (packet ends at %d) parsed without error", n, got.End)
				}
			}
		})
	}
}

func TestParseLayoutOtherProtocols(t *testing.T) {
	f, _, _, _ := pkt{payload: pattern(8, 1)}.build()
	f[14+9] = 1 // ICMP: L4 header not examined.
	l, err := ParseLayout(f)
	if err != nil || l.L4Proto != 1 || l.PayloadOff != l.L4Off || l.IsTCP() || l.IsUDP() {
		t.Errorf("ICMP: %+v, %v", l, err)
	}
	f6, _, _, _ := pkt{v6: true, payload: pattern(8, 1)}.build()
	f6[14+6] = 59 // No Next Header
	if l, err := ParseLayout(f6); err != nil || l.L4Proto != 59 || l.L4Off != 54 {
		t.Errorf("IPv6 no-next-header: %+v, %v", l, err)
	}
}

func TestParseLayoutErrors(t *testing.T) {
	base, _, _, _ := pkt{payload: pattern(30, 1)}.build() // 50 bytes of TCP
	base6, _, _, _ := pkt{v6: true, ext6: []uint8{ipv6ExtDstOpts}, payload: pattern(40, 1)}.build()
	mut := func(b []byte, f func([]byte)) []byte { c := bytes.Clone(b); f(c); return c }
	arp := mut(base, func(b []byte) { binary.BigEndian.PutUint16(b[12:], 0x0806) })
	qinq := append(append(bytes.Clone(base[:12]), 0x88, 0xa8, 0, 1, 0x81, 0x00, 0, 2), base[12:]...)
	for _, tc := range []struct {
		name string
		f    []byte
		want error
		et   uint16
	}{
		{"empty", nil, ErrMalformed, 0},
		{"arp", arp, ErrNotIP, 0x0806},
		{"qinq", qinq, ErrNotIP, EtherTypeVLAN},
		{"v4 version 6", mut(base, func(b []byte) { b[14] = 0x65 }), ErrMalformed, 0},
		{"v4 ihl 4", mut(base, func(b []byte) { b[14] = 0x44 }), ErrMalformed, 0},
		{"v4 ihl beyond total", mut(base, func(b []byte) { b[14] = 0x4f; binary.BigEndian.PutUint16(b[16:], 40) }), ErrMalformed, 0},
		{"v4 total > frame", mut(base, func(b []byte) { binary.BigEndian.PutUint16(b[16:], uint16(len(b))) }), ErrMalformed, 0},
		{"v4 total 0", mut(base, func(b []byte) { binary.BigEndian.PutUint16(b[16:], 0) }), ErrMalformed, 0},
		{"tcp doff 4", mut(base, func(b []byte) { b[34+12] = 0x40 }), ErrMalformed, 0},
		{"tcp doff 15 > left", mut(base, func(b []byte) { b[34+12] = 0xf0 }), ErrMalformed, 0},
		{"tcp hdr cut by total", mut(base, func(b []byte) { binary.BigEndian.PutUint16(b[16:], 30) }), ErrMalformed, 0},
		{"v6 version 4", mut(base6, func(b []byte) { b[14] = 0x40 }), ErrMalformed, 0},
		{"v6 plen > frame", mut(base6, func(b []byte) { binary.BigEndian.PutUint16(b[18:], 1000) }), ErrMalformed, 0},
		{"v6 ext len overrun", mut(base6, func(b []byte) { b[54+1] = 200 }), ErrMalformed, 0},
		{"v6 jumbo plen 0", mut(base6, func(b []byte) { binary.BigEndian.PutUint16(b[18:], 0) }), ErrMalformed, 0},
		{"vlan short", mut(base[:16], func(b []byte) { binary.BigEndian.PutUint16(b[12:], EtherTypeVLAN) }), ErrMalformed, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := ParseLayout(tc.f)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.et != 0 && l.EtherType != tc.et {
				t.Errorf("EtherType %#x, want %#x", l.EtherType, tc.et)
			}
			t.Log(err)
		})
	}
}

func TestParseLayoutAllocs(t *testing.T) {
	f, _, _, _ := pkt{v6: true, vlan: true, ext6: []uint8{ipv6ExtHopByHop}, payload: pattern(1400, 1)}.build()
	arp := bytes.Clone(f)
	binary.BigEndian.PutUint16(arp[16:], 0x0806)
	if a := testing.AllocsPerRun(100, func() {
		if _, err := ParseLayout(f); err != nil {
			t.Fatal(err)
		}
		if _, err := ParseLayout(arp); err != ErrNotIP {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("ParseLayout allocates %.1f per run", a)
	}
}

func FuzzParseLayout(f *testing.F) {
	for _, p := range []pkt{
		{payload: pattern(20, 1)},
		{vlan: true, udp: true, payload: pattern(9, 2)},
		{ipOpts: []byte{7, 4, 0, 0}, tcpOpts: []byte{2, 4, 5, 0xb4}},
		{v6: true, ext6: []uint8{ipv6ExtHopByHop, ipv6ExtRouting, ipv6ExtDstOpts}, segsLeft: 1, payload: pattern(5, 3)},
		{v6: true, udp: true, ext6: []uint8{ipv6ExtFragment}},
		{ipFrag: 0x2001, udp: true, pad: 6},
	} {
		b, _, _, _ := p.build()
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := ParseLayout(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrNotIP) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		if !(l.L3Off == 14 || l.L3Off == 18) || l.L3Off >= l.L4Off || l.L4Off > l.PayloadOff || l.PayloadOff > l.End || l.End > len(b) {
			t.Fatalf("inconsistent layout %+v for %d bytes", l, len(b))
		}
		if l.IsTCP() && l.PayloadOff-l.L4Off < 20 || l.IsUDP() && l.PayloadOff-l.L4Off != 8 {
			t.Fatalf("L4 header size wrong: %+v", l)
		}
	})
}
