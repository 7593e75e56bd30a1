package coalescer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"tapgro/vnethdr"
)

const mss = 1448

// split re-segments an emitted GSO packet with vnethdr.Split (the software stand-in for
// the kernel's tcp_gso_segment/__udp_gso_segment).
// The returned segments are copies.
func split(t testing.TB, o outPkt) [][]byte {
	t.Helper()
	l, err := vnethdr.ParseLayout(o.frame)
	if err != nil || o.hdr.GSOSize == 0 {
		t.Fatalf("Split(%s, %d bytes): unparsable GSO packet: %v", o.hdr, len(o.frame), err)
	}
	// One buffer per segment: an aggregate of tiny segments can hold hundreds.
	nseg := max(1, (l.PayloadLen()+int(o.hdr.GSOSize)-1)/int(o.hdr.GSOSize))
	for len(splitOut) < nseg {
		splitOut = append(splitOut, nil)
	}
	for i := range nseg {
		if need := l.PayloadOff + int(o.hdr.GSOSize); len(splitOut[i]) < need {
			splitOut[i] = make([]byte, need)
		}
	}
	sizes := make([]int, nseg)
	n, err := vnethdr.Split(o.frame, &o.hdr, splitOut[:nseg], sizes)
	if err != nil {
		t.Fatalf("Split(%s, %d bytes): %v", o.hdr, len(o.frame), err)
	}
	segs := make([][]byte, n)
	for i := range n {
		segs[i] = append([]byte(nil), splitOut[i][:sizes[i]]...)
	}
	return segs
}

// splitOut is split's scratch space (tests in this package do not run in parallel).
var splitOut [][]byte

// checkGroups asserts that out is exactly one packet per group, in order: a group of one
// input is that input unchanged behind a zero header; a larger group is one GSO packet
// whose header fields are exact and which Split turns back into exactly those inputs.
func checkGroups(t *testing.T, in [][]byte, out []outPkt, groups [][]int) {
	t.Helper()
	if len(out) != len(groups) {
		for i, o := range out {
			t.Logf("out[%d]: %s, %d bytes", i, o.hdr, len(o.frame))
		}
		t.Fatalf("got %d packets, want %d (%v)", len(out), len(groups), groups)
	}
	for k, g := range groups {
		o := out[k]
		if len(g) == 1 {
			if o.hdr != (vnethdr.Hdr{}) {
				t.Errorf("out[%d]: header %s, want zero", k, o.hdr)
			}
			if !bytes.Equal(o.frame, in[g[0]]) {
				t.Errorf("out[%d]: frame differs from input %d", k, g[0])
			}
			continue
		}
		l, err := vnethdr.ParseLayout(in[g[0]])
		if err != nil {
			t.Fatal(err)
		}
		want := vnethdr.Hdr{
			Flags:     vnethdr.FlagNeedsCsum,
			HdrLen:    uint16(l.PayloadOff),
			GSOSize:   uint16(l.PayloadLen()),
			CsumStart: uint16(l.L4Off),
		}
		switch {
		case l.L4Proto == protoUDP:
			want.GSOType, want.CsumOffset = vnethdr.GSOUDPL4, 6
		case l.IPv6:
			want.GSOType, want.CsumOffset = vnethdr.GSOTCPv6, 16
		default:
			want.GSOType, want.CsumOffset = vnethdr.GSOTCPv4, 16
		}
		if l.L4Proto == protoTCP && in[g[0]][l.L4Off+13]&tcpCWR != 0 {
			want.GSOType |= vnethdr.GSOECN
		}
		if o.hdr != want {
			t.Errorf("out[%d]: header\n got %s\nwant %s", k, o.hdr, want)
		}
		// The checksum field holds the pseudo-header sum for the new L4 length.
		ol, err := vnethdr.ParseLayout(o.frame)
		if err != nil {
			t.Fatalf("out[%d]: %v", k, err)
		}
		gotSum := binary.BigEndian.Uint16(o.frame[ol.L4Off+int(want.CsumOffset):])
		if wantSum := vnethdr.Fold(ol.PseudoHeaderSum(o.frame, ol.End-ol.L4Off)); gotSum != wantSum {
			t.Errorf("out[%d]: L4 checksum field %#04x, want pseudo-header sum %#04x", k, gotSum, wantSum)
		}
		if !l.IPv6 && !ol.IPv4HeaderChecksumValid(o.frame) {
			t.Errorf("out[%d]: bad IPv4 header checksum", k)
		}
		segs := split(t, o)
		if len(segs) != len(g) {
			t.Fatalf("out[%d]: splits into %d segments, want %d", k, len(segs), len(g))
		}
		group := make([][]byte, len(g))
		for j, i := range g {
			group[j] = in[i]
		}
		for j, w := range resegmented(t, group) {
			if s := segs[j]; !bytes.Equal(s, w) {
				t.Errorf("out[%d] segment %d differs from input %d\n got %x\nwant %x", k, j, g[j], s[:min(80, len(s))], w[:min(80, len(w))])
			}
		}
	}
}

// resegmented returns what re-segmenting the GSO packet built from group (two or more
// frames of one aggregate, in order) must give back: each frame's IP packet (Split drops
// link-layer padding), and, when every frame is IPv4 with the same ID, the IDs
// renumbered head+i with a fresh header checksum: virtio_net_hdr has no equivalent of
// Linux's SKB_GSO_TCP_FIXEDID, so the kernel's segmentation increments them.
func resegmented(t testing.TB, group [][]byte) [][]byte {
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

func seq(from, to int) []int {
	var r []int
	for i := from; i <= to; i++ {
		r = append(r, i)
	}
	return r
}

type tcase struct {
	name   string
	cfg    Config
	frames func() [][]byte
	groups [][]int
	flush  bool           // call Flush after the frames (default true; see run)
	noEnd  bool           // do not Flush at the end
	counts map[Reason]int // expected reason counters (only those listed)
}

func TestMatrix(t *testing.T) {
	cases := []tcase{
		{
			name: "same size",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1, 2, 3}},
			counts: map[Reason]int{ReasonMerged: 3, ReasonStarted: 1, ReasonBatchEnd: 1},
		},
		{
			name: "large then small then large",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(500), f.seg(mss)}
			},
			groups: [][]int{{0, 1, 2}, {3}},
			counts: map[Reason]int{ReasonShortSegment: 1},
		},
		{
			name: "small then large",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(500), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0}, {1, 2}},
			counts: map[Reason]int{ReasonLargerSegment: 1},
		},
		{
			name: "pure ACK flushes and keeps order",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(0, withAck(0x2000)), f.seg(mss, withAck(0x2000))}
			},
			groups: [][]int{{0, 1}, {2}, {3}},
			counts: map[Reason]int{ReasonPureAck: 1},
		},
		{
			name: "dup ACK",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(0)}
			},
			groups: [][]int{{0, 1}, {2}},
			counts: map[Reason]int{ReasonDupAck: 1},
		},
		{
			name: "PSH merges as last",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, orFlags(tcpPSH)), f.seg(mss)}
			},
			groups: [][]int{{0, 1, 2}, {3}},
			counts: map[Reason]int{ReasonPsh: 1, ReasonBatchEnd: 1},
		},
		{
			name: "PSH alone passes",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss, orFlags(tcpPSH)), f.seg(mss)}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonPsh: 1},
		},
		{
			name: "SYN",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(0, withFlags(tcpSYN|tcpACK))}
			},
			groups: [][]int{{0, 1}, {2}},
			counts: map[Reason]int{ReasonSyn: 1},
		},
		{
			name: "RST",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(0, withFlags(tcpRST|tcpACK))}
			},
			groups: [][]int{{0, 1}, {2}},
			counts: map[Reason]int{ReasonFinRstUrg: 1},
		},
		{
			name: "URG",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, orFlags(tcpURG)), f.seg(mss)}
			},
			groups: [][]int{{0, 1}, {2}, {3}},
			counts: map[Reason]int{ReasonFinRstUrg: 1},
		},
		{
			name: "FIN with data merges as last",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(100, orFlags(tcpFIN|tcpPSH))}
			},
			groups: [][]int{{0, 1, 2}},
			counts: map[Reason]int{ReasonFinRstUrg: 1},
			noEnd:  true,
		},
		{
			name: "bare FIN",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(0, orFlags(tcpFIN))}
			},
			groups: [][]int{{0, 1}, {2}},
			counts: map[Reason]int{ReasonFinRstUrg: 1},
		},
		{
			name: "CWR without ECN passes",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, orFlags(tcpCWR)), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1}, {2}, {3, 4}},
			counts: map[Reason]int{ReasonCWR: 1},
		},
		{
			name: "CWR with ECN starts an aggregate",
			cfg:  Config{ECN: true},
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, orFlags(tcpCWR)), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1}, {2, 3, 4}},
			counts: map[Reason]int{ReasonCWR: 1},
		},
		{
			name: "ECE on every segment merges",
			frames: func() [][]byte {
				f := newFlow("tcp4", func(s *spec) { s.flags |= 0x40 })
				return [][]byte{f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1}},
		},
		{
			name: "ECE change flushes",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss, orFlags(0x40))}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonFlagsChanged: 1},
		},
		{
			name: "bad checksum in the middle",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, badL4), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1}, {2}, {3, 4}},
			counts: map[Reason]int{ReasonBadChecksum: 1},
		},
		{
			name: "bad checksum first",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss, badL4), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0}, {1, 2}},
			counts: map[Reason]int{ReasonBadChecksum: 1},
		},
		{
			name: "bad IPv4 header checksum",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss, badIP), f.seg(mss)}
			},
			groups: [][]int{{0}, {1}, {2}},
			counts: map[Reason]int{ReasonBadChecksum: 1},
		},
		{
			name: "seq gap",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				a, b := f.seg(mss), f.seg(mss)
				f.seg(mss) // lost
				f.id--     // ...but the IDs stay consecutive: a pure seq gap
				return [][]byte{a, b, f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1}, {2, 3}},
			counts: map[Reason]int{ReasonOutOfOrder: 1},
		},
		{
			name: "retransmission (seq back)",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, withSeq(1000))}
			},
			groups: [][]int{{0, 1}, {2}},
			counts: map[Reason]int{ReasonOutOfOrder: 1},
		},
		{
			name: "timestamp change",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, withOpts(tsOpts(2))), f.seg(mss, withOpts(tsOpts(2)))}
			},
			groups: [][]int{{0, 1}, {2, 3}},
			counts: map[Reason]int{ReasonOptionsChanged: 1},
		},
		{
			name: "option length change",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss, withOpts(nil))}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonOptionsChanged: 1},
		},
		{
			name: "ack change",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss, withAck(0x1001))}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonAckChanged: 1},
		},
		{
			name: "ECN CE mark (TOS) change",
			frames: func() [][]byte {
				f := newFlow("tcp4", withTOS(0x02))
				return [][]byte{f.seg(mss), f.seg(mss, withTOS(0x03)), f.seg(mss, withTOS(0x03))}
			},
			groups: [][]int{{0}, {1, 2}},
			counts: map[Reason]int{ReasonTosTTLChanged: 1},
		},
		{
			name: "TTL change",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss, withTTL(63))}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonTosTTLChanged: 1},
		},
		{
			name: "DF change",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss, withDF(false))}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonTosTTLChanged: 1},
		},
		{
			name: "v6 traffic class change",
			frames: func() [][]byte {
				f := newFlow("tcp6")
				return [][]byte{f.seg(mss), f.seg(mss, withTOS(0x03))}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonTosTTLChanged: 1},
		},
		{
			name: "v6 hop limit change",
			frames: func() [][]byte {
				f := newFlow("tcp6")
				return [][]byte{f.seg(mss), f.seg(mss, withTTL(1))}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonTosTTLChanged: 1},
		},
		{
			name: "IPv4 options",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss, withIPOpt), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0}, {1}, {2, 3}},
			counts: map[Reason]int{ReasonIPOptions: 1},
		},
		{
			name: "IPv4 fragment",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss, withMF), f.seg(mss)}
			},
			groups: [][]int{{0}, {1}, {2}},
			counts: map[Reason]int{ReasonFragment: 1},
		},
		{
			// A chain that differs from the aggregate's (here: none vs one) flushes.
			name: "IPv6 extension header appears and goes",
			frames: func() [][]byte {
				f := newFlow("tcp6")
				return [][]byte{f.seg(mss), f.seg(mss, dstOpts), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0}, {1}, {2, 3}},
			counts: map[Reason]int{ReasonExtHeader: 2},
		},
		{
			// Linux ipv6_gro_receive pulls HBH/DSTOPTS/ROUTING and merges segments whose
			// chains are byte-identical.
			name: "IPv6 identical extension headers merge",
			frames: func() [][]byte {
				f := newFlow("tcp6", dstOpts)
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss), f.seg(100)}
			},
			groups: [][]int{{0, 1, 2, 3}},
			counts: map[Reason]int{ReasonExtHeader: 0, ReasonShortSegment: 1},
		},
		{
			name: "IPv6 identical two-header chains merge",
			frames: func() [][]byte {
				f := newFlow("tcp6", hbhDstOpts, withVLAN(7))
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1, 2}},
		},
		{
			name: "IPv6 extension header bytes differ",
			frames: func() [][]byte {
				f := newFlow("tcp6")
				return [][]byte{f.seg(mss, dstOptsPad(1)), f.seg(mss, dstOptsPad(1)), f.seg(mss, dstOptsPad(2)), f.seg(mss, dstOptsPad(2))}
			},
			groups: [][]int{{0, 1}, {2, 3}},
			counts: map[Reason]int{ReasonExtHeader: 1},
		},
		{
			name: "IPv6 extension header type differs, same bytes",
			frames: func() [][]byte {
				f := newFlow("tcp6")
				hbh := func(s *spec) { s.extType, s.ext = ipv6HopByHop, []byte{0, 0, 1, 4, 0, 0, 0, 0} }
				return [][]byte{f.seg(mss, dstOpts), f.seg(mss, hbh)}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonExtHeader: 1},
		},
		{
			name: "IPv6 routing header, no segments left, merges",
			frames: func() [][]byte {
				f := newFlow("tcp6", routingHdr(0))
				return [][]byte{f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1}},
		},
		{
			// The pseudo-header uses the final destination (RFC 8200 section 8.1), not
			// the IPv6 destination address the checksum is verified and re-seeded with.
			name: "IPv6 routing header with segments left passes",
			frames: func() [][]byte {
				f := newFlow("tcp6")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, routingHdr(1)), f.seg(mss, routingHdr(1))}
			},
			groups: [][]int{{0, 1}, {2}, {3}},
			counts: map[Reason]int{ReasonExtHeader: 2},
		},
		{
			name: "udp6 identical extension headers merge",
			cfg:  Config{UDP: true},
			frames: func() [][]byte {
				f := newFlow("udp6", dstOpts)
				return [][]byte{f.seg(1200), f.seg(1200), f.seg(5)}
			},
			groups: [][]int{{0, 1, 2}},
		},
		{
			name: "IPv6 fragment header",
			frames: func() [][]byte {
				f := newFlow("tcp6")
				return [][]byte{f.seg(mss), f.seg(mss, fragHdr), f.seg(mss)}
			},
			groups: [][]int{{0}, {1}, {2}},
			counts: map[Reason]int{ReasonFragment: 1},
		},
		{
			// Linux 6.18 tools/testing/selftests/net/gro.c "DF=0, Fixed - should
			// coalesce": inet_gro_flush no longer asks for DF on a fixed ID.
			name: "IP ID fixed without DF",
			frames: func() [][]byte {
				f := newFlow("tcp4", withDF(false))
				return [][]byte{f.seg(mss, withID(7)), f.seg(mss, withID(7)), f.seg(mss, withID(7))}
			},
			groups: [][]int{{0, 1, 2}},
			counts: map[Reason]int{ReasonIPIDChanged: 0, ReasonMerged: 2},
		},
		{
			name: "IP ID mixed without DF: +1 twice then fixed",
			frames: func() [][]byte {
				f := newFlow("tcp4", withDF(false))
				return [][]byte{f.seg(mss, withID(7)), f.seg(mss, withID(8)), f.seg(mss, withID(8)), f.seg(mss, withID(8))}
			},
			// The pattern is set by the second segment; the third breaks it and starts
			// an aggregate whose own second segment makes it fixed.
			groups: [][]int{{0, 1}, {2, 3}},
			counts: map[Reason]int{ReasonIPIDChanged: 1},
		},
		{
			name: "IP ID mixed without DF: fixed then +1",
			frames: func() [][]byte {
				f := newFlow("tcp4", withDF(false))
				return [][]byte{f.seg(mss, withID(7)), f.seg(mss, withID(7)), f.seg(mss, withID(8))}
			},
			groups: [][]int{{0, 1}, {2}},
			counts: map[Reason]int{ReasonIPIDChanged: 1},
		},
		{
			name: "IP ID fixed with DF",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss, withID(0)), f.seg(mss, withID(0)), f.seg(mss, withID(0))}
			},
			groups: [][]int{{0, 1, 2}},
		},
		{
			name: "udp4 IP ID fixed without DF",
			cfg:  Config{UDP: true},
			frames: func() [][]byte {
				f := newFlow("udp4", withDF(false))
				return [][]byte{f.seg(1200, withID(3)), f.seg(1200, withID(3)), f.seg(1200, withID(3))}
			},
			groups: [][]int{{0, 1, 2}},
		},
		{
			name: "IP ID incrementing without DF",
			frames: func() [][]byte {
				f := newFlow("tcp4", withDF(false))
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1, 2}},
		},
		{
			name: "IP ID mixed: +1 then fixed",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss, withID(7)), f.seg(mss, withID(8)), f.seg(mss, withID(8)), f.seg(mss, withID(9))}
			},
			groups: [][]int{{0, 1}, {2, 3}},
			counts: map[Reason]int{ReasonIPIDChanged: 1},
		},
		{
			name: "IP ID jump",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss, withID(7)), f.seg(mss, withID(9))}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonIPIDChanged: 1},
		},
		{
			name: "IPv6 flow label is part of the flow",
			frames: func() [][]byte {
				f := newFlow("tcp6", withLabel(0x12345))
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss, withLabel(0x54321))}
			},
			groups: [][]int{{0, 1}, {2}},
		},
		{
			name: "VLAN",
			frames: func() [][]byte {
				f := newFlow("tcp4", withVLAN(42))
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0, 1, 2}},
		},
		{
			name: "VLAN tag is part of the flow",
			frames: func() [][]byte {
				f := newFlow("tcp4", withVLAN(42))
				g := newFlow("tcp4", withVLAN(43))
				return [][]byte{f.seg(mss), g.seg(mss), f.seg(mss), g.seg(mss)}
			},
			groups: [][]int{{0, 2}, {1, 3}},
		},
		{
			name: "interleaved flows, v4/v6",
			frames: func() [][]byte {
				a := newFlow("tcp4")
				b := newFlow("tcp6")
				c := newFlow("tcp4", withPort(40001))
				return [][]byte{a.seg(mss), b.seg(1000), c.seg(mss), a.seg(mss), b.seg(1000), c.seg(mss), a.seg(mss), b.seg(10)}
			},
			groups: [][]int{{1, 4, 7}, {0, 3, 6}, {2, 5}},
		},
		{
			name: "table full evicts oldest",
			cfg:  Config{MaxFlows: 2},
			frames: func() [][]byte {
				a := newFlow("tcp4")
				b := newFlow("tcp4", withPort(2))
				c := newFlow("tcp4", withPort(3))
				return [][]byte{a.seg(mss), a.seg(mss), b.seg(mss), b.seg(mss), c.seg(mss), a.seg(mss)}
			},
			// c evicts a; a's next segment then evicts b.
			groups: [][]int{{0, 1}, {2, 3}, {4}, {5}},
			counts: map[Reason]int{ReasonEviction: 2},
		},
		{
			name: "65535 size cap",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				var fr [][]byte
				for range 47 {
					fr = append(fr, f.seg(mss))
				}
				return fr
			},
			// 20 + 32 + 45×1448 = 65212; one more segment would make 66660.
			groups: [][]int{seq(0, 44), {45, 46}},
			counts: map[Reason]int{ReasonOverSize: 1},
		},
		{
			// Linux skb_gro_receive: the IP length may reach 65535 exactly; a short tail
			// that fits is merged even when a full segment no longer would.
			name: "65535 size cap reached exactly by a short tail",
			frames: func() [][]byte {
				f := newFlow("tcp4", withOpts(nil))
				var fr [][]byte
				for range 8 {
					fr = append(fr, f.seg(8072))
				}
				return append(fr, f.seg(919), f.seg(100))
			},
			// 20 + 20 + 8×8072 + 919 = 65535; the short tail ends it.
			groups: [][]int{seq(0, 8), {9}},
			counts: map[Reason]int{ReasonOverSize: 0, ReasonShortSegment: 1},
		},
		{
			// 65495 = 5 × 13099: full segments fill it exactly, so it is emitted at once.
			name: "65535 size cap reached exactly by full segments",
			frames: func() [][]byte {
				f := newFlow("tcp4", withOpts(nil))
				var fr [][]byte
				for range 5 {
					fr = append(fr, f.seg(13099))
				}
				return fr
			},
			groups: [][]int{seq(0, 4)},
			noEnd:  true,
			counts: map[Reason]int{ReasonOverSize: 1, ReasonBatchEnd: 0},
		},
		{
			name: "65535 size cap: one byte over starts the next packet",
			frames: func() [][]byte {
				f := newFlow("tcp4", withOpts(nil))
				var fr [][]byte
				for range 8 {
					fr = append(fr, f.seg(8072))
				}
				return append(fr, f.seg(920))
			},
			groups: [][]int{seq(0, 7), {8}},
			counts: map[Reason]int{ReasonOverSize: 1},
		},
		{
			name: "65535 size cap, IPv6 with an extension header",
			frames: func() [][]byte {
				f := newFlow("tcp6", withOpts(nil), dstOpts)
				var fr [][]byte
				for range 8 {
					fr = append(fr, f.seg(8000))
				}
				// 40 + 8 + 20 + 64000 + 1467 = 65535.
				return append(fr, f.seg(1467), f.seg(1))
			},
			groups: [][]int{seq(0, 8), {9}},
			counts: map[Reason]int{ReasonShortSegment: 1},
		},
		{
			name: "huge head takes a tail",
			frames: func() [][]byte {
				f := newFlow("tcp4", withOpts(nil))
				return [][]byte{f.seg(64960), f.seg(535)}
			},
			groups: [][]int{{0, 1}},
		},
		{
			name: "full head passes",
			frames: func() [][]byte {
				f := newFlow("tcp4", withOpts(nil))
				return [][]byte{f.seg(65495), f.seg(10)}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonOverSize: 1},
		},
		{
			// No TCP segment count cap in Linux GRO by default: 65 segments of 1009
			// bytes plus a 919-byte tail fill one 65535-byte packet.
			name: "default segment cap does not bind before 65535",
			frames: func() [][]byte {
				f := newFlow("tcp4", withOpts(nil))
				var fr [][]byte
				for range 64 {
					fr = append(fr, f.seg(1009))
				}
				return append(fr, f.seg(919))
			},
			groups: [][]int{seq(0, 64)},
			counts: map[Reason]int{ReasonSegmentCap: 0, ReasonShortSegment: 1},
		},
		{
			name: "segment cap",
			cfg:  Config{MaxSegments: 4},
			frames: func() [][]byte {
				f := newFlow("tcp4")
				var fr [][]byte
				for range 6 {
					fr = append(fr, f.seg(100))
				}
				return fr
			},
			groups: [][]int{{0, 1, 2, 3}, {4, 5}},
			counts: map[Reason]int{ReasonSegmentCap: 1},
		},
		{
			name: "single segment emitted plain",
			frames: func() [][]byte {
				return [][]byte{newFlow("tcp4").seg(mss)}
			},
			groups: [][]int{{0}},
		},
		{
			name: "padded tiny segment emitted as received",
			frames: func() [][]byte {
				f := newFlow("tcp4", withOpts(nil))
				return [][]byte{f.seg(2, withPad(4))}
			},
			groups: [][]int{{0}},
		},
		{
			name: "padded head then more",
			frames: func() [][]byte {
				f := newFlow("tcp4", withOpts(nil))
				return [][]byte{f.seg(2, withPad(4)), f.seg(2, withPad(4)), f.seg(2, withPad(4))}
			},
			groups: [][]int{{0, 1, 2}},
		},
		{
			name: "tcp disabled",
			cfg:  Config{DisableTCP: true},
			frames: func() [][]byte {
				f := newFlow("tcp4")
				return [][]byte{f.seg(mss), f.seg(mss)}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonDisabled: 2},
		},
		{
			name: "tcp6",
			frames: func() [][]byte {
				f := newFlow("tcp6")
				return [][]byte{f.seg(mss), f.seg(mss), f.seg(mss), f.seg(7)}
			},
			groups: [][]int{{0, 1, 2, 3}},
		},
		{
			name: "udp4 on",
			cfg:  Config{UDP: true},
			frames: func() [][]byte {
				f := newFlow("udp4")
				return [][]byte{f.seg(1200), f.seg(1200), f.seg(1200)}
			},
			groups: [][]int{{0, 1, 2}},
		},
		{
			name: "udp6 short last",
			cfg:  Config{UDP: true},
			frames: func() [][]byte {
				f := newFlow("udp6")
				return [][]byte{f.seg(1200), f.seg(1200), f.seg(3), f.seg(1200)}
			},
			groups: [][]int{{0, 1, 2}, {3}},
			counts: map[Reason]int{ReasonShortSegment: 1},
		},
		{
			name: "udp larger flushes",
			cfg:  Config{UDP: true},
			frames: func() [][]byte {
				f := newFlow("udp4")
				return [][]byte{f.seg(100), f.seg(100), f.seg(200)}
			},
			groups: [][]int{{0, 1}, {2}},
			counts: map[Reason]int{ReasonLargerSegment: 1},
		},
		{
			name: "udp off",
			frames: func() [][]byte {
				f := newFlow("udp4")
				return [][]byte{f.seg(1200), f.seg(1200)}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonDisabled: 2},
		},
		{
			name: "udp zero checksum",
			cfg:  Config{UDP: true},
			frames: func() [][]byte {
				f := newFlow("udp4")
				return [][]byte{f.seg(1200), f.seg(1200, zeroUDP), f.seg(1200)}
			},
			groups: [][]int{{0}, {1}, {2}},
			counts: map[Reason]int{ReasonNoChecksum: 1},
		},
		{
			name: "udp bad checksum",
			cfg:  Config{UDP: true},
			frames: func() [][]byte {
				f := newFlow("udp6")
				return [][]byte{f.seg(1200), f.seg(1200), f.seg(1200, badL4)}
			},
			groups: [][]int{{0, 1}, {2}},
			counts: map[Reason]int{ReasonBadChecksum: 1},
		},
		{
			name: "udp segment cap is 64",
			cfg:  Config{UDP: true, MaxSegments: 100},
			frames: func() [][]byte {
				f := newFlow("udp4")
				var fr [][]byte
				for range 66 {
					fr = append(fr, f.seg(10))
				}
				return fr
			},
			groups: [][]int{seq(0, 63), {64, 65}},
		},
		{
			name: "tcp and udp of the same ports are different flows",
			cfg:  Config{UDP: true},
			frames: func() [][]byte {
				f, g := newFlow("tcp4"), newFlow("udp4")
				return [][]byte{f.seg(mss), g.seg(100), f.seg(mss), g.seg(100)}
			},
			groups: [][]int{{0, 2}, {1, 3}},
		},
		{
			name: "not TCP/UDP",
			frames: func() [][]byte {
				arp := append(append(append([]byte{}, macB...), macA...), 0x08, 0x06)
				arp = append(arp, make([]byte, 28)...)
				return [][]byte{arp, {1, 2, 3}}
			},
			groups: [][]int{{0}, {1}},
			counts: map[Reason]int{ReasonNotTCPUDP: 1, ReasonMalformed: 1},
		},
		{
			name: "truncated IP length passes untouched",
			frames: func() [][]byte {
				f := newFlow("tcp4")
				a := f.seg(mss)
				b := f.seg(mss)
				return [][]byte{a, b[:100]}
			},
			// Unparsable: passes at once (no flow to flush), ahead of held data.
			groups: [][]int{{1}, {0}},
			counts: map[Reason]int{ReasonMalformed: 1},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.cfg)
			in := tc.frames()
			for _, f := range in {
				h.add(f, nil)
			}
			if tc.noEnd && h.c.Held() != 0 {
				t.Errorf("Held() = %d before Flush, want 0", h.c.Held())
			}
			h.c.Flush()
			if h.c.Held() != 0 {
				t.Errorf("Held() = %d after Flush", h.c.Held())
			}
			checkGroups(t, in, h.out, tc.groups)
			st := h.c.Stats()
			if got := st.Segments.Load(); got != uint64(len(in)) {
				t.Errorf("Segments = %d, want %d", got, len(in))
			}
			if got := st.Packets.Load(); got != uint64(len(h.out)) {
				t.Errorf("Packets = %d, want %d", got, len(h.out))
			}
			var hist uint64
			for i := range st.SegsPerPacket {
				hist += st.SegsPerPacket[i].Load()
			}
			if hist != uint64(len(h.out)) {
				t.Errorf("histogram holds %d packets, want %d", hist, len(h.out))
			}
			for r, n := range tc.counts {
				if got := st.Reason(r).Load(); got != uint64(n) {
					t.Errorf("%s = %d, want %d", r, got, n)
				}
			}
		})
	}
}

// TestGSOHeaderExact spells out the header of the basic case by hand rather than
// deriving it, for TCPv4, TCPv6 with VLAN, and UDP.
func TestGSOHeaderExact(t *testing.T) {
	for _, tc := range []struct {
		kind string
		mods []func(*spec)
		cfg  Config
		want vnethdr.Hdr
	}{
		{"tcp4", nil, Config{}, vnethdr.Hdr{Flags: 1, GSOType: 1, HdrLen: 14 + 20 + 32, GSOSize: 1000, CsumStart: 34, CsumOffset: 16}},
		{"tcp6", []func(*spec){withVLAN(5)}, Config{VnetHdrLen: 12}, vnethdr.Hdr{Flags: 1, GSOType: 4, HdrLen: 18 + 40 + 32, GSOSize: 1000, CsumStart: 58, CsumOffset: 16}},
		{"udp4", nil, Config{UDP: true}, vnethdr.Hdr{Flags: 1, GSOType: 5, HdrLen: 14 + 20 + 8, GSOSize: 1000, CsumStart: 34, CsumOffset: 6}},
		// IPv6 extension headers lie between the IP and L4 headers: csum_start and
		// hdr_len count them (Linux tcp_gso_segment needs csum_start at the TCP header).
		{"tcp6", []func(*spec){dstOpts}, Config{}, vnethdr.Hdr{Flags: 1, GSOType: 4, HdrLen: 14 + 40 + 8 + 32, GSOSize: 1000, CsumStart: 62, CsumOffset: 16}},
		{"tcp6", []func(*spec){hbhDstOpts, withVLAN(5)}, Config{}, vnethdr.Hdr{Flags: 1, GSOType: 4, HdrLen: 18 + 40 + 24 + 32, GSOSize: 1000, CsumStart: 82, CsumOffset: 16}},
		{"udp6", []func(*spec){dstOpts}, Config{UDP: true}, vnethdr.Hdr{Flags: 1, GSOType: 5, HdrLen: 14 + 40 + 8 + 8, GSOSize: 1000, CsumStart: 62, CsumOffset: 6}},
	} {
		t.Run(fmt.Sprintf("%s/%d", tc.kind, tc.want.HdrLen), func(t *testing.T) {
			h := newHarness(t, tc.cfg)
			f := newFlow(tc.kind, tc.mods...)
			for range 3 {
				h.add(f.seg(1000), nil)
			}
			h.add(f.seg(10), nil)
			if len(h.out) != 1 {
				t.Fatalf("%d packets, want 1", len(h.out))
			}
			o := h.out[0]
			if o.hdr != tc.want {
				t.Errorf("header\n got %s\nwant %s", o.hdr, tc.want)
			}
			if want := int(tc.want.HdrLen) + 3010; len(o.frame) != want {
				t.Errorf("frame %d bytes, want %d", len(o.frame), want)
			}
			l3 := 14
			if o.frame[12] == 0x81 {
				l3 = 18
			}
			if tc.kind == "tcp6" || tc.kind == "udp6" {
				// The payload length covers the extension headers too.
				if got, want := int(binary.BigEndian.Uint16(o.frame[l3+4:])), len(o.frame)-l3-40; got != want {
					t.Errorf("IPv6 payload length %d, want %d", got, want)
				}
			} else if got := binary.BigEndian.Uint16(o.frame[l3+2:]); int(got) != len(o.frame)-l3 {
				t.Errorf("IPv4 total length %d, want %d", got, len(o.frame)-l3)
			}
			if tc.kind == "udp4" || tc.kind == "udp6" {
				if got := binary.BigEndian.Uint16(o.frame[tc.want.CsumStart+4:]); got != 8+3010 {
					t.Errorf("UDP length %d, want %d", got, 8+3010)
				}
			}
		})
	}
}

// TestWindowAndFlags: the merged packet carries the last segment's window and PSH.
func TestWindowAndFlags(t *testing.T) {
	h := newHarness(t, Config{})
	f := newFlow("tcp4")
	h.add(f.seg(mss), nil)
	h.add(f.seg(mss, func(s *spec) { s.win = 600 }), nil)
	h.add(f.seg(mss, func(s *spec) { s.win = 700; s.flags |= tcpPSH }), nil)
	if len(h.out) != 1 {
		t.Fatalf("%d packets, want 1", len(h.out))
	}
	th := h.out[0].frame[34:]
	if w := binary.BigEndian.Uint16(th[14:]); w != 700 {
		t.Errorf("window %d, want the last segment's 700", w)
	}
	if th[13] != tcpACK|tcpPSH {
		t.Errorf("flags %#x, want ACK|PSH", th[13])
	}
}

// TestFixedID: a constant ID merges with DF set or clear (Linux 6.18 inet_gro_flush;
// its GRO selftest "DF=0, Fixed - should coalesce"); GSO then renumbers the IDs (virtio
// has no FIXEDID), which is the only byte difference after re-segmentation.
func TestFixedID(t *testing.T) {
	for _, df := range []bool{true, false} {
		t.Run(fmt.Sprintf("DF=%t", df), func(t *testing.T) {
			h := newHarness(t, Config{})
			f := newFlow("tcp4", withDF(df))
			var in [][]byte
			for range 3 {
				in = append(in, f.seg(mss, withID(0)))
			}
			for _, fr := range in {
				h.add(fr, nil)
			}
			h.c.Flush()
			if len(h.out) != 1 {
				t.Fatalf("%d packets, want 1", len(h.out))
			}
			for i, s := range split(t, h.out[0]) {
				want := append([]byte(nil), in[i]...)
				binary.BigEndian.PutUint16(want[18:], uint16(i))
				want[24], want[25] = 0, 0
				binary.BigEndian.PutUint16(want[24:], vnethdr.Checksum(want[14:34], 0))
				if !bytes.Equal(s, want) {
					t.Errorf("segment %d differs", i)
				}
			}
		})
	}
}

// TestSizeCapPayload: when a flow's segments add up exactly, Linux (skb_gro_receive:
// p->len + len must stay below gro_max_size, 65536 by default) puts 65535 - 40 = 65495
// TCP payload bytes in one IPv4 packet (20-byte IP and TCP headers) and 65535 - 60 =
// 65475 in one IPv6 packet; the rest starts the next packet.
func TestSizeCapPayload(t *testing.T) {
	for _, tc := range []struct {
		kind string
		want int
	}{{"tcp4", 65495}, {"tcp6", 65475}} {
		for _, mssz := range []int{1009, 1448, 2018, 8072, 9000, 16000} {
			t.Run(fmt.Sprintf("%s/%d", tc.kind, mssz), func(t *testing.T) {
				h := newHarness(t, Config{})
				f := newFlow(tc.kind, withOpts(nil))
				// Full segments up to the cap, then a tail that fills it exactly, then
				// more full segments.
				left := tc.want
				for left > 0 {
					n := min(mssz, left)
					h.add(f.seg(n), nil)
					left -= n
				}
				for range 3 {
					h.add(f.seg(mssz), nil)
				}
				h.c.Flush()
				if len(h.out) < 2 {
					t.Fatalf("%d packets, want at least 2", len(h.out))
				}
				l, err := vnethdr.ParseLayout(h.out[0].frame)
				if err != nil {
					t.Fatal(err)
				}
				if got := l.PayloadLen(); got != tc.want {
					t.Errorf("first packet carries %d payload bytes, want %d", got, tc.want)
				}
				if got := l.End - l.L3Off; got != 65535 {
					t.Errorf("first packet IP length %d, want 65535", got)
				}
				if l, _ = vnethdr.ParseLayout(h.out[1].frame); l.PayloadLen() != 3*mssz && mssz*3 <= tc.want {
					t.Errorf("second packet carries %d payload bytes, want %d", l.PayloadLen(), 3*mssz)
				}
			})
		}
	}
}

// TestGSOInput: a GSO frame flushes its flow and passes through with its own header.
func TestGSOInput(t *testing.T) {
	h := newHarness(t, Config{VnetHdrLen: 12})
	f := newFlow("tcp4")
	a, b := f.seg(mss), f.seg(mss)
	big := f.seg(3 * mss)
	gso := &vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOTCPv4, HdrLen: 66, GSOSize: mss, CsumStart: 34, CsumOffset: 16, NumBuffers: 3}
	h.add(a, nil)
	h.add(b, nil)
	h.add(big, gso)
	if len(h.out) != 2 {
		t.Fatalf("%d packets, want 2", len(h.out))
	}
	checkGroups(t, [][]byte{a, b}, h.out[:1], [][]int{{0, 1}})
	want := *gso
	want.NumBuffers = 0
	if h.out[1].hdr != want || !bytes.Equal(h.out[1].frame, big) {
		t.Errorf("GSO frame: header %s, want %s; frame equal %t", h.out[1].hdr, want, bytes.Equal(h.out[1].frame, big))
	}
	if n := h.c.Stats().GSOInput.Load(); n != 1 {
		t.Errorf("GSOInput = %d", n)
	}
}

// TestTrustedChecksums: NEEDS_CSUM frames (partial checksum) and DATA_VALID frames are
// merged without verification; a lone NEEDS_CSUM head keeps its header.
func TestTrustedChecksums(t *testing.T) {
	partial := &vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, CsumStart: 34, CsumOffset: 16}
	valid := &vnethdr.Hdr{Flags: vnethdr.FlagDataValid}

	h := newHarness(t, Config{})
	f := newFlow("tcp4")
	g := newFlow("tcp4")
	var in, ref [][]byte
	for range 3 {
		in = append(in, f.seg(mss, partialL4))
		ref = append(ref, g.seg(mss))
	}
	for _, fr := range in {
		h.add(fr, partial)
	}
	h.c.Flush()
	checkGroups(t, ref, h.out, [][]int{{0, 1, 2}})

	h = newHarness(t, Config{})
	lone := newFlow("tcp4").seg(mss, partialL4)
	h.add(lone, partial)
	h.c.Flush()
	if len(h.out) != 1 || h.out[0].hdr != *partial || !bytes.Equal(h.out[0].frame, lone) {
		t.Errorf("lone NEEDS_CSUM frame not emitted as received with its header")
	}

	// DATA_VALID: a (deliberately) wrong checksum is trusted, as the kernel would.
	h = newHarness(t, Config{})
	f = newFlow("tcp4")
	h.add(f.seg(mss), valid)
	h.add(f.seg(mss, badL4), valid)
	h.c.Flush()
	if len(h.out) != 1 || h.out[0].hdr.GSOType != vnethdr.GSOTCPv4 {
		t.Errorf("DATA_VALID frames not merged: %d packets", len(h.out))
	}
}

// TestTimer covers FlushExpired and Oldest.
func TestTimer(t *testing.T) {
	h := newHarness(t, Config{})
	a, b := newFlow("tcp4"), newFlow("tcp4", withPort(9))
	if _, ok := h.c.Oldest(); ok {
		t.Fatal("Oldest reports an aggregate on an empty engine")
	}
	h.c.Add(withHeadroom(a.seg(mss)), nil, 100)
	h.c.Add(withHeadroom(b.seg(mss)), nil, 200)
	h.c.Add(withHeadroom(a.seg(mss)), nil, 300)
	if got, ok := h.c.Oldest(); !ok || got != 100 {
		t.Fatalf("Oldest = %d, %t; want 100", got, ok)
	}
	h.c.FlushExpired(250, 100) // a (100) expired, b (200) not
	if len(h.out) != 1 || h.out[0].hdr.GSOType != vnethdr.GSOTCPv4 || h.c.Held() != 1 {
		t.Fatalf("after FlushExpired: %d packets, %d held", len(h.out), h.c.Held())
	}
	if got, _ := h.c.Oldest(); got != 200 {
		t.Errorf("Oldest = %d, want 200", got)
	}
	h.c.FlushExpired(300, 100)
	if h.c.Held() != 0 || h.c.Stats().Timer.Load() != 2 {
		t.Errorf("held %d, timer flushes %d", h.c.Held(), h.c.Stats().Timer.Load())
	}
}

// TestFlushOneExpired: the one-at-a-time timer flush emits only an expired oldest
// aggregate, one per call, counted as timer.
func TestFlushOneExpired(t *testing.T) {
	h := newHarness(t, Config{})
	a, b := newFlow("tcp4"), newFlow("tcp4", withPort(9))
	h.c.Add(withHeadroom(a.seg(mss)), nil, 100)
	h.c.Add(withHeadroom(b.seg(mss)), nil, 100) // same start: one batch's clock
	if h.c.FlushOneExpired(150, 100) {
		t.Fatal("flushed an aggregate younger than maxAge")
	}
	if !h.c.FlushOneExpired(200, 100) || len(h.out) != 1 || h.c.Held() != 1 {
		t.Fatalf("first expired flush: %d packets, %d held", len(h.out), h.c.Held())
	}
	if !h.c.FlushOneExpired(200, 100) || h.c.FlushOneExpired(200, 100) || h.c.Held() != 0 {
		t.Fatalf("second expired flush: %d packets, %d held", len(h.out), h.c.Held())
	}
	if n := h.c.Stats().Timer.Load(); n != 2 {
		t.Errorf("timer flushes %d, want 2", n)
	}
}

func withHeadroom(f []byte) []byte {
	return append(make([]byte, vnethdr.Len), f...)
}

// TestSetConfig: toggling flushes; growing the table reallocates; the engine keeps
// working.
func TestSetConfig(t *testing.T) {
	h := newHarness(t, Config{MaxFlows: 1})
	f := newFlow("tcp4")
	h.add(f.seg(mss), nil)
	h.add(f.seg(mss), nil)
	h.c.SetConfig(Config{VnetHdrLen: vnethdr.Len, MaxFlows: 8, DisableTCP: true})
	if len(h.out) != 1 || h.c.Held() != 0 {
		t.Fatalf("SetConfig did not flush: %d packets, %d held", len(h.out), h.c.Held())
	}
	h.add(f.seg(mss), nil)
	h.add(f.seg(mss), nil)
	if len(h.out) != 3 {
		t.Fatalf("TCP disabled: %d packets, want 3", len(h.out))
	}
	h.c.SetConfig(Config{VnetHdrLen: vnethdr.Len, MaxFlows: 8})
	for p := range 8 {
		g := newFlow("tcp4", withPort(uint16(p)))
		h.add(g.seg(mss), nil)
		h.add(g.seg(mss), nil)
	}
	if h.c.Held() != 8 {
		t.Errorf("Held = %d, want 8", h.c.Held())
	}
	h.c.Flush()
	if len(h.out) != 11 {
		t.Errorf("%d packets, want 11", len(h.out))
	}
}

// TestTrace: the hook sees every decision.
func TestTrace(t *testing.T) {
	var got []string
	h := newHarness(t, Config{Trace: func(r Reason, n int) { got = append(got, fmt.Sprintf("%s:%d", r, n)) }})
	f := newFlow("tcp4")
	h.add(f.seg(mss), nil)
	h.add(f.seg(mss), nil)
	h.add(f.seg(0), nil)
	want := []string{"started:1514", "merged:1514", "dup_ack:66"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("trace %v, want %v", got, want)
	}
}

func TestReasonNames(t *testing.T) {
	var s Stats
	seen := map[string]bool{}
	for r := range numReasons {
		name := r.String()
		if name == "" || name == "unknown" || seen[name] {
			t.Errorf("reason %d: name %q", r, name)
		}
		seen[name] = true
		s.Reason(r).Add(uint64(r) + 1)
	}
	// Every reason maps to its own counter.
	for r := range numReasons {
		if got := s.Reason(r).Load(); got != uint64(r)+1 {
			t.Errorf("%s counter shared (%d)", r, got)
		}
	}
	if len(Reasons()) != int(numReasons)-2 {
		t.Errorf("Reasons() has %d entries", len(Reasons()))
	}
}

func TestHistBucket(t *testing.T) {
	for n, want := range map[int]int{1: 0, 2: 1, 3: 2, 4: 2, 5: 3, 8: 3, 9: 4, 33: 6, 64: 6, 65: 7, 1000: 7} {
		if got := histBucket(n); got != want {
			t.Errorf("histBucket(%d) = %d, want %d", n, got, want)
		}
	}
}

func TestSumCopy(t *testing.T) {
	src := make([]byte, 3000)
	for i := range src {
		src[i] = byte(i*131 + i>>3)
	}
	for n := 0; n <= len(src); n += 1 + n/16 {
		for _, fill := range []byte{0x00, 0xff} {
			s := src[:n]
			if fill == 0xff {
				s = bytes.Repeat([]byte{0xff}, n)
			}
			dst := make([]byte, n+8)
			got := sumCopy(dst, s)
			if want := vnethdr.Fold(vnethdr.Sum(s, 0)); got != want {
				t.Fatalf("n=%d: sumCopy %#04x, Sum %#04x", n, got, want)
			}
			if !bytes.Equal(dst[:n], s) {
				t.Fatalf("n=%d: copy differs", n)
			}
		}
	}
}

// TestAllocs: steady state allocates nothing.
func TestAllocs(t *testing.T) {
	c := New(Config{VnetHdrLen: vnethdr.Len, UDP: true}, func([]byte) {})
	f := newFlow("tcp4")
	bufs := make([][]byte, 44)
	for i := range bufs {
		bufs[i] = withHeadroom(f.seg(mss))
	}
	ack := withHeadroom(f.seg(0))
	n := testing.AllocsPerRun(100, func() {
		for _, b := range bufs {
			c.Add(b, nil, 0)
		}
		c.Add(ack, nil, 0)
		c.Flush()
	})
	if n != 0 {
		t.Errorf("%v allocations per batch, want 0", n)
	}
	if c.Stats().GSOOut.Load() == 0 {
		t.Error("no GSO packet emitted")
	}
}

func TestSumCopyFused(t *testing.T) {
	src := make([]byte, 2000)
	for i := range src {
		src[i] = byte(i*37 + 11)
	}
	for n := range len(src) {
		dst := make([]byte, n)
		if got, want := sumCopyFused(dst, src[:n]), vnethdr.Fold(vnethdr.Sum(src[:n], 0)); got != want || !bytes.Equal(dst, src[:n]) {
			t.Fatalf("n=%d: %#04x, want %#04x", n, got, want)
		}
	}
}
