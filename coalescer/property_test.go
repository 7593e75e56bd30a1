package coalescer

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"tapgro/vnethdr"
)

// genFlow produces the frames of one flow as the wire would deliver them: in-order
// segments of one MSS with short ones, PSH, pure ACKs, ack and timestamp changes, then
// loss, duplication, reordering and corruption applied on top.
func genFlow(rng *rand.Rand, kind string, port uint16) [][]byte {
	mods := []func(*spec){withPort(port)}
	if kind == "udp4" || kind == "udp6" {
		// Keep IDs meaningful: with DF a duplicated datagram right after its original
		// has the same ID and would merge under the fixed-ID rule, after which GSO
		// renumbers it; DF=0 makes every re-segmented byte predictable.
		mods = append(mods, withDF(false))
	}
	if rng.IntN(3) == 0 {
		mods = append(mods, withVLAN(uint16(port)))
	}
	if kind == "tcp6" || kind == "udp6" {
		mods = append(mods, withLabel(uint32(port)*7))
	}
	f := newFlow(kind, mods...)
	udp := f.s.udp
	sizes := []int{100, 536, 1200, 1448}
	m := sizes[rng.IntN(len(sizes))]
	n := 10 + rng.IntN(70)
	var out [][]byte
	ts := uint32(1)
	for range n {
		var sm []func(*spec)
		if !udp {
			if rng.IntN(12) == 0 {
				ts++
			}
			if rng.IntN(20) == 0 {
				f.s.ack += 1448
			}
			sm = append(sm, withOpts(tsOpts(ts)))
		}
		size := m
		switch r := rng.IntN(100); {
		case r < 6:
			size = 1 + rng.IntN(m)
		case r < 10 && !udp:
			size = 0 // pure ACK
		case r < 13 && !udp:
			sm = append(sm, orFlags(tcpPSH))
		case r < 15:
			sm = append(sm, badL4)
		}
		if size == 0 && udp {
			size = 1
		}
		out = append(out, f.seg(size, sm...))
	}
	// Loss, duplication and reordering.
	var res [][]byte
	for i := 0; i < len(out); i++ {
		switch r := rng.IntN(100); {
		case r < 5: // lost
		case r < 10: // duplicated, maybe a little later
			res = append(res, out[i])
			if i+1 < len(out) && rng.IntN(2) == 0 {
				res = append(res, out[i+1])
				i++
			}
			res = append(res, out[i])
		case r < 15 && i+1 < len(out): // swapped with the next
			res = append(res, out[i+1], out[i])
			i++
		default:
			res = append(res, out[i])
		}
	}
	return res
}

func TestPropertyResegmentation(t *testing.T) {
	kinds := []string{"tcp4", "tcp6", "udp4", "udp6", "tcp4", "tcp6", "tcp4", "udp4"}
	var gso, merged uint64
	for iter := range 300 {
		rng := rand.New(rand.NewPCG(uint64(iter), 0x7a9))
		nflows := 1 + rng.IntN(len(kinds))
		cfg := Config{
			MaxFlows:    1 + rng.IntN(8),
			MaxSegments: []int{2, 4, 64}[rng.IntN(3)],
			VnetHdrLen:  []int{10, 12}[rng.IntN(2)],
			UDP:         rng.IntN(4) != 0,
		}
		h := newHarness(t, cfg)

		perFlow := make([][][]byte, nflows)
		next := make([]int, nflows)
		total := 0
		for i := range nflows {
			perFlow[i] = genFlow(rng, kinds[i], uint16(1000+i))
			total += len(perFlow[i])
		}
		// Random interleaving that keeps each flow's own order; random batch ends.
		var inBytes int
		for fed := 0; fed < total; {
			i := rng.IntN(nflows)
			if next[i] == len(perFlow[i]) {
				continue
			}
			fr := perFlow[i][next[i]]
			next[i]++
			fed++
			inBytes += len(fr)
			h.add(fr, nil)
			if rng.IntN(20) == 0 {
				h.c.Flush()
			}
		}
		h.c.Flush()

		got := make([][][]byte, nflows)
		for _, o := range h.out {
			if len(o.frame) > maxL2+maxIPLen {
				t.Fatalf("iter %d: %d-byte packet", iter, len(o.frame))
			}
			l, err := vnethdr.ParseLayout(o.frame)
			if err != nil {
				t.Fatalf("iter %d: output unparsable: %v", iter, err)
			}
			fi := int(binary.BigEndian.Uint16(o.frame[l.L4Off:])) - 1000
			if fi < 0 || fi >= nflows {
				t.Fatalf("iter %d: output of unknown flow %d", iter, fi)
			}
			if o.hdr.IsGSO() {
				if o.hdr.GSOType == vnethdr.GSOUDPL4 && !cfg.UDP {
					t.Fatalf("iter %d: UDP coalesced with UDP off", iter)
				}
				got[fi] = append(got[fi], split(t, o)...)
			} else {
				if o.hdr != (vnethdr.Hdr{}) {
					t.Fatalf("iter %d: plain packet with header %s", iter, o.hdr)
				}
				got[fi] = append(got[fi], o.frame)
			}
		}
		for i := range nflows {
			if len(got[i]) != len(perFlow[i]) {
				t.Fatalf("iter %d flow %d (%s): %d frames out, %d in", iter, i, kinds[i], len(got[i]), len(perFlow[i]))
			}
			for j := range got[i] {
				if !bytes.Equal(got[i][j], perFlow[i][j]) {
					t.Fatalf("iter %d flow %d (%s): frame %d differs", iter, i, kinds[i], j)
				}
			}
		}
		st := h.c.Stats()
		gso += st.GSOOut.Load()
		merged += st.Coalesced.Load()
		if st.Segments.Load() != uint64(total) || st.Packets.Load() != uint64(len(h.out)) {
			t.Fatalf("iter %d: counters %d/%d, want %d/%d", iter, st.Segments.Load(), st.Packets.Load(), total, len(h.out))
		}
	}
	t.Logf("%d GSO packets, %d segments merged", gso, merged)
	if gso == 0 || merged < gso {
		t.Fatal("the generator produced nothing coalescable")
	}
}
