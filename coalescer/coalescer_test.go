package coalescer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"tapgro/coalescer/grotest"
	"tapgro/vnethdr"
)

const mss = 1448

// split, checkGroups, resegmented and seq are package grotest's checks on this
// package's recorded output.
func split(t testing.TB, o outPkt) [][]byte {
	return grotest.Split(t, grotest.Out{Hdr: o.hdr, Frame: o.frame})
}

func checkGroups(t testing.TB, in [][]byte, out []outPkt, groups [][]int) {
	t.Helper()
	g := make([]grotest.Out, len(out))
	for i, o := range out {
		g[i] = grotest.Out{Hdr: o.hdr, Frame: o.frame}
	}
	grotest.CheckGroups(t, in, g, groups)
}

var (
	resegmented = grotest.Resegmented
	seq         = grotest.Seq
)

// engineConfig is the Config a grotest case asks for.
func engineConfig(e grotest.Engine) Config {
	return Config{UDP: e.UDP, ECN: e.ECN, DisableTCP: e.DisableTCP, MaxFlows: e.MaxFlows, MaxSegments: e.MaxSegments}
}

// reasonByName maps grotest's counter names back to Reasons.
func reasonByName(t testing.TB, name string) Reason {
	for r := Reason(0); r < numReasons; r++ {
		if r.String() == name {
			return r
		}
	}
	t.Fatalf("no reason %q", name)
	return 0
}

// TestMatrix runs the GRO suite (package grotest) against the engine.
func TestMatrix(t *testing.T) {
	cases := grotest.Matrix()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			h := newHarness(t, engineConfig(tc.Engine))
			in := tc.Frames()
			for _, f := range in {
				h.add(f, nil)
			}
			if tc.NoEnd && h.c.Held() != 0 {
				t.Errorf("Held() = %d before Flush, want 0", h.c.Held())
			}
			h.c.Flush()
			if h.c.Held() != 0 {
				t.Errorf("Held() = %d after Flush", h.c.Held())
			}
			checkGroups(t, in, h.out, tc.Groups)
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
			for name, n := range tc.Counts {
				if got := st.Reason(reasonByName(t, name)).Load(); got != uint64(n) {
					t.Errorf("%s = %d, want %d", name, got, n)
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
				h.add(f.Seg(1000), nil)
			}
			h.add(f.Seg(10), nil)
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
	h.add(f.Seg(mss), nil)
	h.add(f.Seg(mss, func(s *spec) { s.Win = 600 }), nil)
	h.add(f.Seg(mss, func(s *spec) { s.Win = 700; s.Flags |= tcpPSH }), nil)
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
				in = append(in, f.Seg(mss, withID(0)))
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
					h.add(f.Seg(n), nil)
					left -= n
				}
				for range 3 {
					h.add(f.Seg(mssz), nil)
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
	a, b := f.Seg(mss), f.Seg(mss)
	big := f.Seg(3 * mss)
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
	if n := h.c.Stats().Reason(ReasonGSOInput).Load(); n != 1 {
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
		in = append(in, f.Seg(mss, partialL4))
		ref = append(ref, g.Seg(mss))
	}
	for _, fr := range in {
		h.add(fr, partial)
	}
	h.c.Flush()
	checkGroups(t, ref, h.out, [][]int{{0, 1, 2}})

	h = newHarness(t, Config{})
	lone := newFlow("tcp4").Seg(mss, partialL4)
	h.add(lone, partial)
	h.c.Flush()
	if len(h.out) != 1 || h.out[0].hdr != *partial || !bytes.Equal(h.out[0].frame, lone) {
		t.Errorf("lone NEEDS_CSUM frame not emitted as received with its header")
	}

	// DATA_VALID: a (deliberately) wrong checksum is trusted, as the kernel would.
	h = newHarness(t, Config{})
	f = newFlow("tcp4")
	h.add(f.Seg(mss), valid)
	h.add(f.Seg(mss, badL4), valid)
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
	h.c.Add(withHeadroom(a.Seg(mss)), nil, 100)
	h.c.Add(withHeadroom(b.Seg(mss)), nil, 200)
	h.c.Add(withHeadroom(a.Seg(mss)), nil, 300)
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
	if h.c.Held() != 0 || h.c.Stats().Reason(ReasonTimer).Load() != 2 {
		t.Errorf("held %d, timer flushes %d", h.c.Held(), h.c.Stats().Reason(ReasonTimer).Load())
	}
}

// TestFlushOneExpired: the one-at-a-time timer flush emits only an expired oldest
// aggregate, one per call, counted as timer.
func TestFlushOneExpired(t *testing.T) {
	h := newHarness(t, Config{})
	a, b := newFlow("tcp4"), newFlow("tcp4", withPort(9))
	h.c.Add(withHeadroom(a.Seg(mss)), nil, 100)
	h.c.Add(withHeadroom(b.Seg(mss)), nil, 100) // same start: one batch's clock
	if h.c.FlushOneExpired(150, 100) {
		t.Fatal("flushed an aggregate younger than maxAge")
	}
	if !h.c.FlushOneExpired(200, 100) || len(h.out) != 1 || h.c.Held() != 1 {
		t.Fatalf("first expired flush: %d packets, %d held", len(h.out), h.c.Held())
	}
	if !h.c.FlushOneExpired(200, 100) || h.c.FlushOneExpired(200, 100) || h.c.Held() != 0 {
		t.Fatalf("second expired flush: %d packets, %d held", len(h.out), h.c.Held())
	}
	if n := h.c.Stats().Reason(ReasonTimer).Load(); n != 2 {
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
	h.add(f.Seg(mss), nil)
	h.add(f.Seg(mss), nil)
	h.c.SetConfig(Config{VnetHdrLen: vnethdr.Len, MaxFlows: 8, DisableTCP: true})
	if len(h.out) != 1 || h.c.Held() != 0 {
		t.Fatalf("SetConfig did not flush: %d packets, %d held", len(h.out), h.c.Held())
	}
	h.add(f.Seg(mss), nil)
	h.add(f.Seg(mss), nil)
	if len(h.out) != 3 {
		t.Fatalf("TCP disabled: %d packets, want 3", len(h.out))
	}
	h.c.SetConfig(Config{VnetHdrLen: vnethdr.Len, MaxFlows: 8})
	for p := range 8 {
		g := newFlow("tcp4", withPort(uint16(p)))
		h.add(g.Seg(mss), nil)
		h.add(g.Seg(mss), nil)
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
	h.add(f.Seg(mss), nil)
	h.add(f.Seg(mss), nil)
	h.add(f.Seg(0), nil)
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
		bufs[i] = withHeadroom(f.Seg(mss))
	}
	ack := withHeadroom(f.Seg(0))
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

// TestAllocsRef: AddRef, Release (copy on hold), FlushExpired and Flush allocate nothing
// either; nothing stays referenced after Flush.
func TestAllocsRef(t *testing.T) {
	const ring = 16
	c := New(Config{VnetHdrLen: vnethdr.Len, UDP: true, RefTags: ring}, func([]byte) {})
	c.SetEmitV(func([][]byte) {})
	f, g := newFlow("tcp4"), newFlow("tcp4", withPort(7))
	bufs := make([][]byte, ring)
	for i := range bufs {
		if i%4 == 3 {
			bufs[i] = withHeadroom(g.Seg(mss))
		} else {
			bufs[i] = withHeadroom(f.Seg(mss))
		}
	}
	var now int64
	n := testing.AllocsPerRun(100, func() {
		for k, b := range bufs {
			now++
			c.Release(k)
			c.AddRef(b, nil, now, k)
			c.Release((k + ring/2) % ring)
		}
		c.FlushExpired(now, 4)
		c.Flush()
	})
	if n != 0 {
		t.Errorf("%v allocations per batch, want 0", n)
	}
	for k := range ring {
		if c.Pinned(k) {
			t.Errorf("tag %d pinned after Flush", k)
		}
	}
	if c.Stats().GSOOut.Load() == 0 || c.Stats().HeldCopies.Load() == 0 {
		t.Error("no GSO packet, or no copy on hold")
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
