package grotest

import (
	"bytes"
	"encoding/binary"
	"testing"

	"tapgro/vnethdr"
)

// Engine is the engine configuration a case needs; the zero value is the default
// engine (TCP on, UDP off, no ECN merging, the default flow table and segment cap).
// Each runner maps it onto its own engine and skips cases it cannot configure.
type Engine struct {
	UDP         bool // coalesce UDP too
	ECN         bool // merge across CWR as RFC 3168 ECN allows (GSO_ECN)
	DisableTCP  bool // TCP coalescing off
	MaxFlows    int  // flow table size (0: default)
	MaxSegments int  // segments per aggregate (0: default)
}

// Case is one entry of the suite: the frames, in arrival order, and the packets they
// must produce.
type Case struct {
	Name   string
	Engine Engine
	Frames func() [][]byte
	// Groups lists, per output packet in order, the input frames it is made of: a group
	// of one is that frame passed through untouched, a larger group one GSO packet.
	Groups [][]int
	// NoEnd: every aggregate must already have left before the end-of-batch flush.
	NoEnd bool
	// Counts are reason counters (by coalescer.Reason name) the engine must show;
	// only those listed are checked.
	Counts map[string]int
}

// Out is one packet an engine emitted: its virtio-net header and frame.
type Out struct {
	Hdr   vnethdr.Hdr
	Frame []byte
}

// Seq returns from, from+1, …, to.
func Seq(from, to int) []int {
	var r []int
	for i := from; i <= to; i++ {
		r = append(r, i)
	}
	return r
}

// CheckGroups asserts that out is exactly one packet per group, in order: a group of one
// input is that input unchanged behind a zero header; a larger group is one GSO packet
// whose header fields are exact and which Split turns back into exactly those inputs.
func CheckGroups(t testing.TB, in [][]byte, out []Out, groups [][]int) {
	t.Helper()
	if len(out) != len(groups) {
		for i, o := range out {
			t.Logf("out[%d]: %s, %d bytes", i, o.Hdr, len(o.Frame))
		}
		t.Fatalf("got %d packets, want %d (%v)", len(out), len(groups), groups)
	}
	for k, g := range groups {
		o := out[k]
		if len(g) == 1 {
			if o.Hdr != (vnethdr.Hdr{}) {
				t.Errorf("out[%d]: header %s, want zero", k, o.Hdr)
			}
			if !bytes.Equal(o.Frame, in[g[0]]) {
				t.Errorf("out[%d]: frame differs from input %d", k, g[0])
			}
			continue
		}
		want, ok := GSOHeader(t, in[g[0]])
		if !ok {
			continue
		}
		if o.Hdr != want {
			t.Errorf("out[%d]: header\n got %s\nwant %s", k, o.Hdr, want)
		}
		// The checksum field holds the pseudo-header sum for the new L4 length.
		ol, err := vnethdr.ParseLayout(o.Frame)
		if err != nil {
			t.Fatalf("out[%d]: %v", k, err)
		}
		gotSum := binary.BigEndian.Uint16(o.Frame[ol.L4Off+int(want.CsumOffset):])
		if wantSum := vnethdr.Fold(ol.PseudoHeaderSum(o.Frame, ol.End-ol.L4Off)); gotSum != wantSum {
			t.Errorf("out[%d]: L4 checksum field %#04x, want pseudo-header sum %#04x", k, gotSum, wantSum)
		}
		if !ol.IPv6 && !ol.IPv4HeaderChecksumValid(o.Frame) {
			t.Errorf("out[%d]: bad IPv4 header checksum", k)
		}
		segs := Split(t, o)
		if len(segs) != len(g) {
			t.Fatalf("out[%d]: splits into %d segments, want %d", k, len(segs), len(g))
		}
		group := make([][]byte, len(g))
		for j, i := range g {
			group[j] = in[i]
		}
		for j, w := range Resegmented(t, group) {
			if s := segs[j]; !bytes.Equal(s, w) {
				t.Errorf("out[%d] segment %d differs from input %d\n got %x\nwant %x", k, j, g[j], s[:min(80, len(s))], w[:min(80, len(w))])
			}
		}
	}
}

// GSOHeader is the exact header of the GSO packet an engine builds with first as its
// first segment (ok false, and the test failed, if first does not parse).
func GSOHeader(t testing.TB, first []byte) (h vnethdr.Hdr, ok bool) {
	t.Helper()
	l, err := vnethdr.ParseLayout(first)
	if err != nil {
		t.Errorf("first segment does not parse: %v", err)
		return h, false
	}
	h = vnethdr.Hdr{
		Flags:     vnethdr.FlagNeedsCsum,
		HdrLen:    uint16(l.PayloadOff),
		GSOSize:   uint16(l.PayloadLen()),
		CsumStart: uint16(l.L4Off),
	}
	switch {
	case l.L4Proto == ProtoUDP:
		h.GSOType, h.CsumOffset = vnethdr.GSOUDPL4, 6
	case l.IPv6:
		h.GSOType, h.CsumOffset = vnethdr.GSOTCPv6, 16
	default:
		h.GSOType, h.CsumOffset = vnethdr.GSOTCPv4, 16
	}
	if l.L4Proto == ProtoTCP && first[l.L4Off+13]&TCPCWR != 0 {
		h.GSOType |= vnethdr.GSOECN
	}
	return h, true
}

// Split re-segments an emitted GSO packet with vnethdr.Split (the software stand-in for
// the kernel's tcp_gso_segment/__udp_gso_segment). The returned segments are copies.
func Split(t testing.TB, o Out) [][]byte {
	t.Helper()
	l, err := vnethdr.ParseLayout(o.Frame)
	if err != nil || o.Hdr.GSOSize == 0 {
		t.Fatalf("Split(%s, %d bytes): unparsable GSO packet: %v", o.Hdr, len(o.Frame), err)
	}
	// One buffer per segment: an aggregate of tiny segments can hold hundreds.
	nseg := max(1, (l.PayloadLen()+int(o.Hdr.GSOSize)-1)/int(o.Hdr.GSOSize))
	bufs := make([][]byte, nseg)
	for i := range bufs {
		bufs[i] = make([]byte, l.PayloadOff+int(o.Hdr.GSOSize))
	}
	sizes := make([]int, nseg)
	n, err := vnethdr.Split(o.Frame, &o.Hdr, bufs, sizes)
	if err != nil {
		t.Fatalf("Split(%s, %d bytes): %v", o.Hdr, len(o.Frame), err)
	}
	segs := make([][]byte, n)
	for i := range n {
		segs[i] = bufs[i][:sizes[i]]
	}
	return segs
}

// Resegmented returns what re-segmenting the GSO packet built from group (two or more
// frames of one aggregate, in order) must give back: each frame's IP packet (Split drops
// link-layer padding), and, when every frame is IPv4 with the same ID, the IDs
// renumbered head+i with a fresh header checksum: virtio_net_hdr has no equivalent of
// Linux's SKB_GSO_TCP_FIXEDID, so the kernel's segmentation increments them.
func Resegmented(t testing.TB, group [][]byte) [][]byte {
	t.Helper()
	want := make([][]byte, len(group))
	fixed := len(group) > 1
	var id0 uint16
	for j, fr := range group {
		l, err := vnethdr.ParseLayout(fr)
		if err != nil {
			t.Fatal(err)
		}
		want[j] = append([]byte(nil), fr[:l.End]...)
		if l.IPv6 {
			fixed = false
			continue
		}
		id := binary.BigEndian.Uint16(fr[l.L3Off+4:])
		if j == 0 {
			id0 = id
		} else if id != id0 {
			fixed = false
		}
	}
	if !fixed {
		return want
	}
	for j, w := range want {
		l, _ := vnethdr.ParseLayout(w)
		ip := w[l.L3Off:l.L4Off]
		binary.BigEndian.PutUint16(ip[4:], id0+uint16(j))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip, 0))
	}
	return want
}
