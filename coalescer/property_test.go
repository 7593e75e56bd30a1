package coalescer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"tapgro/vnethdr"
)

// genFlow produces the frames of one flow as the wire would deliver them: in-order
// segments of one MSS with short ones, PSH, pure ACKs, ack and timestamp changes, then
// loss, duplication, reordering and corruption applied on top. IPv4 flows have DF set
// or clear and incrementing or fixed IDs (a fixed-ID flow sometimes switches to
// incrementing); IPv6 flows may carry an extension header chain, now and then changed
// on one segment; jumbo segment sizes reach the 65535-byte cap.
func genFlow(rng *rand.Rand, kind string, port uint16) [][]byte {
	v6 := kind == "tcp6" || kind == "udp6"
	mods := []func(*spec){withPort(port), withDF(rng.IntN(2) == 0)}
	if rng.IntN(3) == 0 {
		mods = append(mods, withVLAN(uint16(port)))
	}
	if v6 {
		mods = append(mods, withLabel(uint32(port)*7))
		switch rng.IntN(4) {
		case 0:
			mods = append(mods, dstOpts)
		case 1:
			mods = append(mods, hbhDstOpts)
		}
	}
	fixedID := !v6 && rng.IntN(3) == 0
	f := newFlow(kind, mods...)
	udp := f.Spec.UDP
	sizes := []int{100, 536, 1200, 1448, 1448, 8072, 9000, 16000}
	m := sizes[rng.IntN(len(sizes))]
	// fill: sizes chosen so that runs of full segments plus one tail add up to exactly
	// 65535 IP bytes, the most Linux puts in one packet.
	fill := m >= 1448 && rng.IntN(2) == 0
	probe := f.Spec
	probe.N = 0
	pl, _ := vnethdr.ParseLayout(build(probe))
	capPayload := maxIPLen - (pl.PayloadOff - pl.L3Off)
	room := capPayload
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
				f.Spec.Ack += 1448
			}
			sm = append(sm, withOpts(tsOpts(ts)))
		}
		if fixedID {
			if rng.IntN(30) == 0 {
				fixedID = false // from now on incrementing: a pattern change
			} else {
				sm = append(sm, withID(7))
			}
		}
		if v6 && rng.IntN(25) == 0 {
			sm = append(sm, dstOptsPad(byte(1+rng.IntN(3)))) // a different chain
		}
		size := m
		if fill {
			size = min(m, room)
			if room -= size; room == 0 {
				room = capPayload
			}
		}
		switch r := rng.IntN(100); {
		case r < 6:
			// Short: anywhere below m, or small enough to fit behind jumbo segments
			// that have filled most of the 65535 bytes.
			size = 1 + rng.IntN([]int{m, min(m, 1500)}[rng.IntN(2)])
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
		out = append(out, f.Seg(size, sm...))
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
	var fixedAggs, extAggs, fullAggs, tailAggs int
	var vcalls, maxIov int
	var heldCopies uint64
	for iter := range 300 {
		rng := rand.New(rand.NewPCG(uint64(iter), 0x7a9))
		nflows := 1 + rng.IntN(len(kinds))
		cfg := Config{
			MaxFlows:    1 + rng.IntN(8),
			MaxSegments: []int{2, 4, 64, 0}[rng.IntN(4)],
			VnetHdrLen:  []int{10, 12}[rng.IntN(2)],
			UDP:         rng.IntN(4) != 0,
		}
		// rng2 drives what the original generator did not know about (timer flushes,
		// MaxRefs), so the frames generated stay those of rng's sequence.
		rng2 := rand.New(rand.NewPCG(uint64(iter), 0x71e))
		cfg.MaxRefs = []int{0, 1, 3, 40}[rng2.IntN(4)]
		cfg.RefMinPayload = []int{0, 0, 1000}[rng2.IntN(3)] // some aggregates by copy
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
			h.now++
			h.add(fr, nil)
			if rng.IntN(20) == 0 {
				h.c.Flush()
			}
			if rng2.IntN(10) == 0 {
				// Timer mode: what is older than a random age goes, the rest is held.
				h.c.FlushExpired(h.now, int64(1+rng2.IntN(40)))
			}
		}
		h.c.Flush()
		if h.pinned() {
			t.Fatalf("iter %d: a buffer is still referenced after Flush", iter)
		}

		// want[i] is what flow i's frames must come back as: the input frames, with the
		// IDs of each fixed-ID aggregate renumbered as GSO does (resegmented).
		got := make([][][]byte, nflows)
		want := make([][][]byte, nflows)
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
				segs := split(t, o)
				if g, tail := int(o.hdr.GSOSize), l.PayloadLen()%int(o.hdr.GSOSize); tail != 0 &&
					l.End-l.L3Off-tail+g > maxIPLen {
					tailAggs++ // a short tail joined after a full segment no longer fit
				}
				if l.End-l.L3Off == maxIPLen {
					fullAggs++
				}
				if l.IPv6 && l.L4Off != l.L3Off+ipv6HdrLen {
					extAggs++
				}
				if !l.IPv6 && len(segs) > 1 && binary.BigEndian.Uint16(segs[1][l.L3Off+4:]) == 7+1 &&
					binary.BigEndian.Uint16(o.frame[l.L3Off+4:]) == 7 {
					fixedAggs++ // renumbered 7, 8, ... from a fixed ID of 7
				}
				k := len(got[fi])
				if k+len(segs) > len(perFlow[fi]) {
					t.Fatalf("iter %d flow %d: more frames out than in", iter, fi)
				}
				got[fi] = append(got[fi], segs...)
				want[fi] = append(want[fi], resegmented(t, perFlow[fi][k:k+len(segs)])...)
			} else {
				if o.hdr != (vnethdr.Hdr{}) {
					t.Fatalf("iter %d: plain packet with header %s", iter, o.hdr)
				}
				if k := len(got[fi]); k < len(perFlow[fi]) {
					want[fi] = append(want[fi], perFlow[fi][k])
				}
				got[fi] = append(got[fi], o.frame)
			}
		}
		for i := range nflows {
			if len(got[i]) != len(perFlow[i]) {
				t.Fatalf("iter %d flow %d (%s): %d frames out, %d in", iter, i, kinds[i], len(got[i]), len(perFlow[i]))
			}
			for j := range got[i] {
				if !bytes.Equal(got[i][j], want[i][j]) {
					t.Fatalf("iter %d flow %d (%s): frame %d differs", iter, i, kinds[i], j)
				}
			}
		}
		st := h.c.Stats()
		vcalls, maxIov, heldCopies = vcalls+h.vcall, max(maxIov, h.iovs), heldCopies+st.HeldCopies.Load()
		gso += st.GSOOut.Load()
		merged += st.Coalesced.Load()
		if st.Segments.Load() != uint64(total) || st.Packets.Load() != uint64(len(h.out)) {
			t.Fatalf("iter %d: counters %d/%d, want %d/%d", iter, st.Segments.Load(), st.Packets.Load(), total, len(h.out))
		}
	}
	t.Logf("%d GSO packets, %d segments merged; %d fixed-ID, %d with IPv6 extension headers, %d of exactly 65535 IP bytes, %d with a tail past the last full segment's room",
		gso, merged, fixedAggs, extAggs, fullAggs, tailAggs)
	if gso == 0 || merged < gso {
		t.Fatal("the generator produced nothing coalescable")
	}
	if fixedAggs == 0 || extAggs == 0 || fullAggs == 0 || tailAggs == 0 {
		t.Fatal("the generator did not exercise every rule")
	}
	if harnessRing > 0 {
		t.Logf("by reference, ring of %d: %d vectored packets (up to %d iovecs), %d bytes copied on hold",
			harnessRing, vcalls, maxIov, heldCopies)
		if vcalls == 0 || heldCopies == 0 || maxIov < 2 {
			t.Fatal("the by-reference run did not exercise references, copies on hold and payload iovecs")
		}
	}
}

// TestByReference runs the table and property tests again with every frame added by
// reference (AddRef) from a ring of buffers that are released and poisoned before reuse:
// a ring of 1 releases every held aggregate before each frame (everything is copied on
// hold, mixed with references), 3 some, 64 almost none. Output and counters must be
// exactly those of the copying path.
func TestByReference(t *testing.T) {
	defer func() { harnessRing = 0 }()
	for _, ring := range []int{1, 3, 64} {
		harnessRing = ring
		t.Run(fmt.Sprintf("ring%d", ring), func(t *testing.T) {
			t.Run("Matrix", TestMatrix)
			t.Run("GSOHeaderExact", TestGSOHeaderExact)
			t.Run("WindowAndFlags", TestWindowAndFlags)
			t.Run("FixedID", TestFixedID)
			t.Run("SizeCapPayload", TestSizeCapPayload)
			t.Run("GSOInput", TestGSOInput)
			t.Run("TrustedChecksums", TestTrustedChecksums)
			t.Run("Trace", TestTrace)
			t.Run("PropertyResegmentation", TestPropertyResegmentation)
		})
	}
}

// TestSplit runs the table and property tests again with every frame added through
// AddSplit, its private prefix and its pieces drawn per frame (three seeds): output and
// counters must be exactly those of Add.
func TestSplit(t *testing.T) {
	defer func() { harnessSplit = nil }()
	for seed := range uint64(3) {
		harnessSplit = rand.New(rand.NewPCG(seed, 7))
		t.Run(fmt.Sprintf("seed%d", seed), func(t *testing.T) {
			t.Run("Matrix", TestMatrix)
			t.Run("GSOHeaderExact", TestGSOHeaderExact)
			t.Run("WindowAndFlags", TestWindowAndFlags)
			t.Run("FixedID", TestFixedID)
			t.Run("SizeCapPayload", TestSizeCapPayload)
			t.Run("GSOInput", TestGSOInput)
			t.Run("TrustedChecksums", TestTrustedChecksums)
			t.Run("Trace", TestTrace)
			t.Run("PropertyResegmentation", TestPropertyResegmentation)
		})
	}
}
