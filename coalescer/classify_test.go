package coalescer

import (
	"bytes"
	"testing"

	"tapgro/vnethdr"
)

// TestClassify: a caller that looks at a prefix only (vhostnet) gets Add's decisions.
// Data segments are candidates; a pure ACK of a flow with a held aggregate flushes it and
// is left to the caller, counted as Add would count it; a prefix that ends inside the
// headers says "copy it" rather than guess; a GSO frame flushes its flow.
func TestClassify(t *testing.T) {
	h := newHarness(t, Config{VnetHdrLen: 12})
	f := newFlow("tcp4")
	a, b := f.Seg(mss), f.Seg(mss)
	ack := f.Seg(0)
	const prefix = 128
	classify := func(fr []byte, valid int, in *vnethdr.Hdr) bool {
		// Bytes past the prefix are garbage: Classify must not read them.
		g := bytes.Clone(fr)
		for i := valid; i < len(g); i++ {
			g[i] = 0xa5
		}
		return h.c.Classify(g, min(valid, len(g)), in)
	}
	for _, s := range [][]byte{a, b} {
		if !classify(s, prefix, nil) {
			t.Fatal("data segment not a candidate")
		}
		h.add(s, nil)
	}
	if h.c.Held() != 1 || len(h.out) != 0 {
		t.Fatalf("held %d, out %d", h.c.Held(), len(h.out))
	}
	if classify(ack, prefix, nil) {
		t.Fatal("pure ACK is a candidate")
	}
	if h.c.Held() != 0 || len(h.out) != 1 {
		t.Fatalf("the ACK did not flush its flow first: held %d, out %d", h.c.Held(), len(h.out))
	}
	checkGroups(t, [][]byte{a, b}, h.out, [][]int{{0, 1}})
	st := h.c.Stats()
	if st.Segments.Load() != 3 || st.Packets.Load() != 2 || st.Reason(ReasonPureAck).Load()+st.Reason(ReasonDupAck).Load() != 1 {
		t.Errorf("segments %d packets %d acks %d", st.Segments.Load(), st.Packets.Load(), st.Reason(ReasonPureAck).Load()+st.Reason(ReasonDupAck).Load())
	}
	// A prefix shorter than the headers: copy and Add.
	if !classify(ack, 40, nil) {
		t.Error("a 40-byte prefix of an IPv4/TCP ACK decided without its TCP header")
	}
	// An IPv6 extension header chain past the prefix: undecidable.
	f6 := newFlow("tcp6", hbhDstOpts)
	ack6 := f6.Seg(0)
	if !classify(ack6, 60, nil) {
		t.Error("an IPv6 ACK decided from a prefix ending in its extension headers")
	}
	if classify(ack6, prefix, nil) {
		t.Error("IPv6 ACK with a short chain is a candidate")
	}
	// GSO input flushes its flow and is the caller's.
	c, d := f.Seg(mss), f.Seg(mss)
	h.add(c, nil)
	h.add(d, nil)
	big := f.Seg(3 * mss)
	gso := &vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOTCPv4, HdrLen: 66, GSOSize: mss, CsumStart: 34, CsumOffset: 16}
	n := len(h.out)
	if classify(big, prefix, gso) || h.c.Held() != 0 || len(h.out) != n+1 {
		t.Errorf("GSO frame: held %d, out %d (want %d)", h.c.Held(), len(h.out), n+1)
	}
	if h.c.FlushOne() {
		t.Error("FlushOne with nothing held")
	}
	h.add(f.Seg(mss), nil)
	if !h.c.FlushOne() || h.c.FlushOne() || h.c.Held() != 0 {
		t.Error("FlushOne does not emit exactly the one held aggregate")
	}
}

func TestClassifyAllocs(t *testing.T) {
	h := newHarness(t, Config{VnetHdrLen: 12})
	ack := newFlow("tcp4").Seg(0)
	if n := testing.AllocsPerRun(100, func() { h.c.Classify(ack, len(ack), nil) }); n != 0 {
		t.Errorf("%v allocations per Classify", n)
	}
}
