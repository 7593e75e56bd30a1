package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

// The negotiated steps and the per-frame decisions are one rule (vnethdr
// Offloads.AcceptsFrame, which negotiate reaches through Offloads.Partition). These
// tests hold them to each other: for every combination of what the sender may produce
// and what the receiver accepts, a frame of each kind the sender may produce goes
// through the real pipeline, and what happened to it is compared with what negotiate
// said: passed whole exactly when it says passthrough (for that kind), split exactly
// when it says split, checksummed exactly when it says csum.

// outcome is what a pipeline did with one frame.
type outcome int

const (
	outDropped outcome = iota
	outWhole           // handed on with its GSO or partial-checksum header
	outSplit           // handed on as several plain, checksummed segments
	outCsum            // handed on as one plain frame, its checksum completed
)

func (o outcome) String() string {
	return [...]string{"dropped", "whole", "split", "csum"}[o]
}

// kindRecord builds a record (hl-byte vnet header, then an Ethernet frame) of kind k, as
// a sender that produces it would: GSO frames carry three segments' worth of payload.
func kindRecord(hl int, k *vnethdr.Kind) []byte {
	const mss = 1000
	payload := pattern(3*mss - 7)
	var rec []byte
	switch k.Hdr.GSOType &^ vnethdr.GSOECN {
	case vnethdr.GSONone: // a partial checksum: the TCP field holds the pseudo-header sum
		f := tcp4(1, 100, payload[:mss])
		tcp := f[34:]
		binary.BigEndian.PutUint16(tcp[16:], vnethdr.Fold(vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, f[26:30], f[30:34], len(tcp))))
		rec = make([]byte, hl+len(f))
		copy(rec[hl:], f)
		h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, HdrLen: 54, CsumStart: 34, CsumOffset: 16}
		h.Encode(rec, hl)
	case vnethdr.GSOTCPv4:
		rec = gsoTCP4(hl, payload, mss)
	case vnethdr.GSOTCPv6:
		rec = gsoFrame6(hl, false, payload, mss)
	case vnethdr.GSOUDPL4:
		rec = udpGSO4(hl, payload, mss)
	default:
		panic(fmt.Sprintf("no frame for kind %+v", k))
	}
	return withHdr(rec, hl, func(h *vnethdr.Hdr, _ int) { h.GSOType, h.Flags = k.Hdr.GSOType, k.Hdr.Flags })
}

// classify says what happened to one frame from the records the far side got (each
// behind an hl-byte header): whole (one record, its header still carrying an offload),
// split (several plain records) or csum (one plain record whose L4 checksum verifies).
func classify(t *testing.T, recs [][]byte, hl int) outcome {
	t.Helper()
	if len(recs) == 0 {
		return outDropped
	}
	var h vnethdr.Hdr
	if hl > 0 {
		if err := h.Decode(recs[0], hl); err != nil {
			t.Fatalf("record header: %v", err)
		}
	}
	if len(recs) == 1 && (h.IsGSO() || h.Flags&vnethdr.FlagNeedsCsum != 0) {
		return outWhole
	}
	for _, r := range recs {
		if hl > 0 {
			if h.Decode(r, hl); h.IsGSO() || h.Flags&vnethdr.FlagNeedsCsum != 0 {
				t.Fatalf("segment with header %v", h)
			}
		}
		f := r[hl:]
		l, err := vnethdr.ParseLayout(f)
		if err != nil {
			t.Fatal(err)
		}
		if got := vnethdr.Checksum(f[l.L4Off:l.End], l.PseudoHeaderSum(f, l.End-l.L4Off)); got != 0 {
			t.Fatalf("segment's L4 checksum does not verify (%#04x)", got)
		}
	}
	if len(recs) > 1 {
		return outSplit
	}
	return outCsum
}

// checkSteps compares what happened to the frames of each kind with steps, negotiate's
// steps for that direction, and with whole/refused, the kinds it planned them from.
// got[i] is the outcome for kinds[i], or -1 when the sender does not produce that kind.
func checkSteps(t *testing.T, what string, steps Step, whole, refused vnethdr.Offloads, got []outcome, extraSplit bool) {
	t.Helper()
	kinds := vnethdr.Kinds()
	var saw [4]bool
	for i, o := range got {
		if o < 0 {
			continue
		}
		saw[o] = true
		k := &kinds[i]
		var want outcome
		switch {
		case whole&k.Offload != 0 && refused&k.Offload == 0:
			want = outWhole
		case refused&k.Offload != 0 && whole&k.Offload == 0:
			want = outSplit
			if !k.Hdr.IsGSO() {
				want = outCsum
			}
		default: // TSO_ECN in both: this frame's IP version decides
			if o != outWhole && o != outSplit {
				t.Errorf("%s: kind %s %v: %v", what, k.Offload, k.Hdr.GSOType, o)
			}
			continue
		}
		if o != want {
			t.Errorf("%s: frame of kind %s (gso_type %#x) was %v; negotiation planned it %v", what, k.Offload, k.Hdr.GSOType, o, want)
		}
	}
	for _, c := range []struct {
		step Step
		saw  bool
	}{{StepPassthrough, saw[outWhole]}, {StepSplit, saw[outSplit] || extraSplit}, {StepCsum, saw[outCsum]}} {
		if (steps&c.step != 0) != c.saw {
			t.Errorf("%s: steps %v, but %v frames seen: %t", what, steps, c.step, c.saw)
		}
	}
	if saw[outDropped] {
		t.Errorf("%s: a frame the sender may produce was dropped", what)
	}
}

// recPort is a Port that records what it is sent.
type recPort struct {
	port.Port // nil: only the methods below are used
	hl        int
	accepts   vnethdr.Offloads
	got       [][]byte
}

func (p *recPort) VnetHdrLen() int           { return p.hl }
func (p *recPort) Accepts() vnethdr.Offloads { return p.accepts }
func (p *recPort) Close() error              { return nil }
func (p *recPort) WriteBatch(f [][]byte) (int, error) {
	for _, b := range f {
		p.got = append(p.got, bytes.Clone(b))
	}
	return len(f), nil
}

// offloadSets is every subset of bits.
func offloadSets(bits vnethdr.Offloads) []vnethdr.Offloads {
	sets := []vnethdr.Offloads{0}
	for b := vnethdr.Offloads(1); b != 0 && b <= bits; b <<= 1 {
		if bits&b != 0 {
			for _, s := range sets {
				sets = append(sets, s|b)
			}
		}
	}
	return sets
}

const allOffloads = vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN |
	vnethdr.OffloadUFO | vnethdr.OffloadUSO

// TAP→port: every TAP read offload choice × every port Accepts (with and without a vnet
// header), each kind of frame the TAP then hands us, through tapToPort.process.
func TestStepsMatchFramesTapToPort(t *testing.T) {
	tap := taptest.New(false)
	b := testBridge(tap, false)
	p := newTapToPort(b)
	kinds := vnethdr.Kinds()
	recs := make([][]byte, len(kinds))
	for i := range kinds {
		recs[i] = kindRecord(10, &kinds[i])
	}
	for _, choice := range offloadSets(AutoOffloads) {
		for _, phl := range []int{0, 12} {
			for _, acc := range offloadSets(allOffloads) {
				n := negotiate(negInput{TapProbed: allOffloads, TapHdrLen: 10, TapWrite: b.tapWrite(),
					Choice: vnethdr.Choice{Set: choice}, Port: port.Caps{HdrLen: phl, Accepts: acc}})
				what := fmt.Sprintf("tap %s, port hdr %d accepts %s", n.TapOffloads, phl, acc)
				pt := &recPort{hl: phl, accepts: acc}
				b.port.Store(newPortRef(pt))
				got := make([]outcome, len(kinds))
				for i := range kinds {
					got[i] = -1
					if !n.TapOffloads.Sends(&kinds[i]) {
						continue
					}
					pt.got = pt.got[:0]
					p.sizes[0] = copy(p.bufs[0], recs[i])
					p.process(1)
					got[i] = classify(t, pt.got, phl)
				}
				whole, refused := portAccepts(phl, acc).Partition(n.TapOffloads)
				checkSteps(t, what, n.T2P&^StepHdrConvert, whole, refused, got, false)
			}
		}
	}
	if b.t2p.Drops[DropMalformed].Load()+b.t2p.Drops[DropPortError].Load() != 0 {
		t.Errorf("drops: malformed %d, port error %d", b.t2p.Drops[DropMalformed].Load(), b.t2p.Drops[DropPortError].Load())
	}
}

// Port→TAP: every port Emits × every TAP write set (offloads the kernel takes on write,
// minus those it refused since), each kind of frame the port then sends us, through
// addWithHeaders, the GRO engine and tapWriter.write. The TAP takes partial checksums
// whatever the set, so nothing is checksummed on this side.
func TestStepsMatchFramesPortToTap(t *testing.T) {
	const phl = 12
	tap := taptest.New(true)
	b := testBridge(tap, false)
	p := newPortToTap(b, phl, nil)
	coal := b.coalescerFor()
	b.coalWriter.hdrPort = true
	kinds := vnethdr.Kinds()
	recs := make([][]byte, len(kinds))
	for i := range kinds {
		recs[i] = kindRecord(phl, &kinds[i])
	}
	ufo := withHdr(recs[len(recs)-1], phl, func(h *vnethdr.Hdr, _ int) { h.GSOType = vnethdr.GSOUDP })
	send := func(rec []byte) [][]byte {
		tap.Forget()
		p.sizes[0] = copy(p.views[0], rec)
		p.addWithHeaders(coal, 1, time.Now().UnixNano())
		coal.Flush()
		return tap.Written()
	}
	for _, write := range offloadSets(AutoOffloads) {
		b.cfg.tapAccepts = write
		coal.SetConfig(b.coalescerConfig())
		for _, emits := range offloadSets(allOffloads) {
			n := negotiate(negInput{TapHdrLen: 10, TapWrite: write, Port: port.Caps{HdrLen: phl, Emits: emits}})
			what := fmt.Sprintf("port emits %s, tap write %s", emits, write)
			got := make([]outcome, len(kinds))
			for i := range kinds {
				got[i] = -1
				if emits.Sends(&kinds[i]) {
					got[i] = classify(t, send(recs[i]), 10)
				}
			}
			whole, refused := tapTakes(write).Partition(emits)
			// UFO is announced as split (negotiate) but the frame is dropped as
			// unsupported (vnethdr.ValidatePeer): no kernel builds one.
			hasUFO := emits&vnethdr.OffloadUFO != 0
			checkSteps(t, what, n.P2T&^(StepHdrConvert|StepGRO|StepUDPGRO), whole, refused, got, hasUFO)
			if hasUFO {
				before := b.p2t.Drops[DropMalformed].Load()
				if o := classify(t, send(ufo), 10); o != outDropped || b.p2t.Drops[DropMalformed].Load() != before+1 {
					t.Errorf("%s: UFO frame %v, not dropped as malformed", what, o)
				}
			}
		}
	}
}
