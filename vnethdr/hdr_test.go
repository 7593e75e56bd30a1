package vnethdr

import (
	"bytes"
	"errors"
	"testing"
)

func TestHdrRoundTrip(t *testing.T) {
	h := Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv6 | GSOECN, HdrLen: 0x1234, GSOSize: 1448,
		CsumStart: 54, CsumOffset: 16, NumBuffers: 3}
	for _, n := range []int{Len, LenMrgRxbuf, 20} {
		b := bytes.Repeat([]byte{0xaa}, 24)
		if err := h.Encode(b, n); err != nil {
			t.Fatalf("Encode(n=%d): %v", n, err)
		}
		// Explicit little-endian: hdr_len 0x1234 is 34 12 at offset 2.
		if b[2] != 0x34 || b[3] != 0x12 || b[4] != 0xa8 || b[5] != 0x05 {
			t.Errorf("n=%d: not little-endian: % x", n, b[:6])
		}
		for i := LenMrgRxbuf; i < n; i++ {
			if b[i] != 0 {
				t.Errorf("n=%d: byte %d past num_buffers is %#x, want 0", n, i, b[i])
			}
		}
		if b[n] != 0xaa {
			t.Errorf("n=%d: Encode wrote past the header (byte %d = %#x)", n, n, b[n])
		}
		var got Hdr
		if err := got.Decode(b, n); err != nil {
			t.Fatalf("Decode(n=%d): %v", n, err)
		}
		want := h
		if n < LenMrgRxbuf {
			want.NumBuffers = 0
			if b[10] != 0xaa {
				t.Errorf("n=10: Encode touched byte 10")
			}
		}
		if got != want {
			t.Errorf("n=%d: round trip\n got %v\nwant %v", n, got, want)
		}
	}
}

func TestHdrDecodeClearsNumBuffers(t *testing.T) {
	h := Hdr{NumBuffers: 9}
	if err := h.Decode(make([]byte, 10), Len); err != nil || h.NumBuffers != 0 {
		t.Errorf("Decode(10) kept num_buffers %d (err %v)", h.NumBuffers, err)
	}
}

func TestHdrShort(t *testing.T) {
	var h Hdr
	for _, tc := range []struct{ buf, n int }{{9, 10}, {11, 12}, {20, 9}, {0, 0}} {
		if err := h.Decode(make([]byte, tc.buf), tc.n); !errors.Is(err, ErrShortHeader) {
			t.Errorf("Decode(len %d, n %d) = %v, want ErrShortHeader", tc.buf, tc.n, err)
		}
		if err := h.Encode(make([]byte, tc.buf), tc.n); !errors.Is(err, ErrShortHeader) {
			t.Errorf("Encode(len %d, n %d) = %v, want ErrShortHeader", tc.buf, tc.n, err)
		}
	}
}

func TestZeroAndIsGSO(t *testing.T) {
	b := bytes.Repeat([]byte{1}, 12)
	Zero(b, 12)
	if !bytes.Equal(b, make([]byte, 12)) {
		t.Errorf("Zero left % x", b)
	}
	for _, tc := range []struct {
		t    uint8
		want bool
	}{{GSONone, false}, {GSOECN, false}, {GSOTCPv4, true}, {GSOTCPv6 | GSOECN, true}, {GSOUDPL4, true}, {GSOUDP, true}} {
		if got := (&Hdr{GSOType: tc.t}).IsGSO(); got != tc.want {
			t.Errorf("IsGSO(%#x) = %t", tc.t, got)
		}
	}
}

func TestOffloads(t *testing.T) {
	if s := (OffloadCSUM | OffloadTSO4 | OffloadUSO).String(); s != "csum,tso4,uso4,uso6" {
		t.Errorf("String = %q", s)
	}
	if s := Offloads(0).String(); s != "none" {
		t.Errorf("String(0) = %q", s)
	}
	all := OffloadCSUM | OffloadTSO4 | OffloadTSO6 | OffloadTSOECN | OffloadUSO
	for _, tc := range []struct {
		o    Offloads
		h    Hdr
		want bool
	}{
		{0, Hdr{}, true},
		{0, Hdr{Flags: FlagNeedsCsum}, false},
		{OffloadCSUM, Hdr{Flags: FlagNeedsCsum}, true},
		{OffloadCSUM | OffloadTSO4, Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv4}, true},
		{OffloadCSUM | OffloadTSO4, Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv6}, false},
		{OffloadCSUM | OffloadTSO4, Hdr{Flags: FlagNeedsCsum, GSOType: GSOTCPv4 | GSOECN}, false},
		{OffloadCSUM | OffloadUSO4, Hdr{Flags: FlagNeedsCsum, GSOType: GSOUDPL4}, false},
		{all, Hdr{Flags: FlagNeedsCsum, GSOType: GSOUDPL4}, true},
		{all | OffloadUFO, Hdr{Flags: FlagNeedsCsum, GSOType: GSOUDP}, false},
	} {
		if got := tc.o.AcceptsFrame(&tc.h); got != tc.want {
			t.Errorf("%v accepts %v = %t, want %t", tc.o, tc.h, got, tc.want)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{1, 1, 54, 0, 0xa8, 5, 34, 0, 16, 0, 1, 0}, 12)
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 10)
	f.Add([]byte{0xff, 0x85, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8}, 20)
	f.Add([]byte{1, 2, 3}, 10)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		var h Hdr
		if err := h.Decode(b, n); err != nil {
			if !errors.Is(err, ErrShortHeader) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		out := make([]byte, n)
		if err := h.Encode(out, n); err != nil {
			t.Fatal(err)
		}
		m := Len
		if n >= LenMrgRxbuf {
			m = LenMrgRxbuf
		}
		if !bytes.Equal(out[:m], b[:m]) {
			t.Fatalf("re-encode differs: % x vs % x", out[:m], b[:m])
		}
		if !bytes.Equal(out[m:], make([]byte, n-m)) {
			t.Fatalf("bytes past num_buffers not zeroed: % x", out[m:])
		}
		var h2 Hdr
		if err := h2.Decode(out, n); err != nil || h2 != h {
			t.Fatalf("second decode %v (%v), want %v", h2, err, h)
		}
	})
}
