package gsowrite

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"

	"tapgro/vnethdr"
)

var probeKinds = []struct {
	name    string
	gsoType uint8
	ipv6    bool
	off     vnethdr.Offloads
}{
	{"tcp4", vnethdr.GSOTCPv4, false, vnethdr.OffloadTSO4},
	{"tcp4 ecn", vnethdr.GSOTCPv4 | vnethdr.GSOECN, false, vnethdr.OffloadTSO4 | vnethdr.OffloadTSOECN},
	{"tcp6", vnethdr.GSOTCPv6, true, vnethdr.OffloadTSO6},
	{"tcp6 ecn", vnethdr.GSOTCPv6 | vnethdr.GSOECN, true, vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN},
	{"uso4", vnethdr.GSOUDPL4, false, vnethdr.OffloadUSO},
	{"uso6", vnethdr.GSOUDPL4, true, vnethdr.OffloadUSO},
}

// Every probe kind is a frame the kernel's write-side rules (vnethdr.ValidatePeer)
// admit, of its kind and IP version, that Splitter cuts into its two segments, built
// without allocating into a buffer of ProbeCap bytes.
func TestProbeFramesOfEveryKind(t *testing.T) {
	var sp Splitter
	for _, hl := range []int{10, 12} {
		buf := make([]byte, 0, ProbeCap(hl))
		for _, k := range probeKinds {
			pkt := AppendProbe(buf[:0], hl, k.gsoType, k.ipv6)
			if len(pkt) > ProbeCap(hl) {
				t.Fatalf("%s: %d bytes, more than ProbeCap %d", k.name, len(pkt), ProbeCap(hl))
			}
			var h vnethdr.Hdr
			h.Decode(pkt, hl)
			if h.GSOType != k.gsoType || Offload(&h) != k.off {
				t.Errorf("%s: gso_type %#x, offload %s", k.name, h.GSOType, Offload(&h))
			}
			f := pkt[hl:]
			if lay, err := vnethdr.ParseLayout(f); err != nil || lay.IPv6 != k.ipv6 {
				t.Errorf("%s: layout %+v, %v", k.name, lay, err)
			}
			hv := h
			if err := vnethdr.ValidatePeer(f, &hv); err != nil || hv.HdrLen != h.HdrLen {
				t.Errorf("%s: ValidatePeer: %v (hdr_len %d, built with %d)", k.name, err, hv.HdrLen, h.HdrLen)
			}
			var segs [][]byte
			if err := sp.Split(f, &h, hl, func(s []byte) { segs = append(segs, bytes.Clone(s)) }); err != nil || len(segs) != 2 {
				t.Errorf("%s: Split = %d segments, %v; want 2", k.name, len(segs), err)
			}
			for _, s := range segs {
				var sh vnethdr.Hdr
				if sh.Decode(s, hl) != nil || sh.IsGSO() || sh.Flags != 0 {
					t.Errorf("%s: a segment's header is %+v, want zero", k.name, sh)
				}
			}
			if a := testing.AllocsPerRun(20, func() { AppendProbe(buf[:0], hl, k.gsoType, k.ipv6) }); a != 0 {
				t.Errorf("%s: %v allocations", k.name, a)
			}
		}
	}
}

// KindRefused writes one probe of the frame's kind and reports EINVAL only.
func TestKindRefused(t *testing.T) {
	frame := AppendProbe(nil, 12, vnethdr.GSOTCPv6, true)
	var h vnethdr.Hdr
	h.Decode(frame, 12)
	var p Prober
	for _, c := range []struct {
		err  error
		want bool
	}{{nil, false}, {unix.EINVAL, true}, {unix.EIO, false}} {
		var got []byte
		refused := p.KindRefused(func(pkt []byte) error { got = bytes.Clone(pkt); return c.err }, 10, frame[12:], &h)
		if refused != c.want {
			t.Errorf("write answering %v: refused %v, want %v", c.err, refused, c.want)
		}
		var gh vnethdr.Hdr
		if gh.Decode(got, 10) != nil || gh.GSOType != vnethdr.GSOTCPv6 {
			t.Errorf("the probe written is not a TCPv6 GSO frame behind 10 bytes: %+v", gh)
		}
	}
}
