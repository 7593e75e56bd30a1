//go:build linux

package vhostnet

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// rxTCP is an IPv4/TCP frame toward the guest (tapPfx's address → guestIP) with
// complete checksums, as the host stack hands it to a TAP without offloads.
func rxTCP(e *env, sport uint16, seq uint32, fl uint8, id uint16, payload []byte) []byte {
	f, _ := tcpSeg(gMAC, e.mac, tapPfx.Addr(), guestIP, sport, 5001, seq, 1, fl, id, payload, false)
	return f
}

// TestRSCToGuest: with the TAP's offloads capped to none (--offload off) and a guest
// that acked GUEST_TSO4, MTU TCP segments from the TAP reach the guest as GSO packets
// (NEEDS_CSUM, TCPV4) whose re-segmentation gives back exactly the input, per flow and
// in order, with a pure ACK and a non-TCP frame in the middle passing untouched; the
// TAP hands nothing whole. Without GUEST_TSO4 acked (only TSO6), IPv4 is never merged.
func TestRSCToGuest(t *testing.T) {
	off := vnethdr.Choice{}
	for _, tc := range []struct {
		name  string
		mask  uint64
		merge bool
		timer bool
	}{
		{"tso4", 0, true, false},
		{"tso4-nomrg", 1 << virtio.NetMrgRxbuf, true, false},
		{"tso6-only", 1 << virtio.NetGuestTSO4, false, false},
		// Aggregates may be held across read batches (rsc.go); the output is the same.
		{"tso4-timer", 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvCfg(t, vhostusertest.Options{AckMask: tc.mask},
				Config{GRO: true, Offload: &off, TimerFlush: tc.timer, RSCInterval: 300 * time.Microsecond})
			if o := e.n.State().TapOffloads; o != 0 {
				t.Fatalf("TAP offloads %s with --offload off", o)
			}
			if !e.n.rscMode {
				t.Fatal("RSC mode is off")
			}
			testRSCToGuest(t, e, tc.merge, tc.mask&(1<<virtio.NetMrgRxbuf) == 0)
		})
	}
}

func testRSCToGuest(t *testing.T, e *env, merge, mrg bool) {
	hl := e.s.HdrLen()
	rx := e.s.RX(0)
	bufLen, pieces := 4096, 1
	if !mrg {
		bufLen, pieces = 65536+200, 17
	}
	rx.PostRX(rx.Free()/pieces, bufLen, pieces)
	rx.KickNow()
	// The input, per flow (sport), in order; each burst interleaves the two flows.
	want := map[uint16][][]byte{}
	next := map[uint16]uint32{41000: 1000, 41001: 5000}
	ids := map[uint16]uint16{41000: 1, 41001: 900}
	markers := 0
	inject := func(sport uint16, n int, fl uint8) {
		f := rxTCP(e, sport, next[sport], fl, ids[sport], streamBytes(int(sport), int(next[sport]), n))
		next[sport] += uint32(n)
		ids[sport]++
		want[sport] = append(want[sport], f)
		if err := e.injectTAP(f); err != nil {
			t.Fatal(err)
		}
	}
	got := map[uint16][][]byte{}
	gotMarkers, gso, packets := 0, 0, 0
	reap := func() {
		for _, fr := range rx.ReapRX(hl, mrg) {
			f := fr.Frame
			packets++
			if len(f) >= 14 && binary.BigEndian.Uint16(f[12:]) == etherTest {
				gotMarkers++
				continue
			}
			if len(f) < 54 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != unix.IPPROTO_TCP {
				continue // the kernel's own (IPv6 is off in the namespace; ARP)
			}
			var h vnethdr.Hdr
			h.Decode(fr.Hdr, hl)
			sport := binary.BigEndian.Uint16(f[34:])
			if !h.IsGSO() {
				if h.Flags != 0 {
					t.Errorf("a lone segment with header %s", h)
				}
				got[sport] = append(got[sport], bytes.Clone(f))
				continue
			}
			gso++
			if !merge || h.GSOType != vnethdr.GSOTCPv4 || h.Flags != vnethdr.FlagNeedsCsum || h.CsumStart != 34 || h.CsumOffset != 16 {
				t.Fatalf("guest got GSO header %s (merge %v)", h, merge)
			}
			if err := vnethdr.ValidatePeer(f, &h); err != nil {
				t.Fatalf("GSO packet the kernel would refuse: %v (%s)", err, h)
			}
			out := make([][]byte, 64)
			for i := range out {
				out[i] = make([]byte, 1600)
			}
			sizes := make([]int, 64)
			k, err := vnethdr.Split(f, &h, out, sizes)
			if err != nil {
				t.Fatalf("re-split: %v (%s, %d bytes)", err, h, len(f))
			}
			for i := range k {
				got[sport] = append(got[sport], bytes.Clone(out[i][:sizes[i]]))
			}
		}
		if k := rx.Free() / pieces; k > 0 {
			rx.PostRX(k, bufLen, pieces)
			rx.KickNow()
		}
	}
	total := 0
	for burst := range 10 {
		for i := range 40 {
			sport := uint16(41000 + i%2)
			switch {
			case burst == 4 && i == 13:
				inject(sport, 0, tcpACK) // pure ACK of flow 1 mid-flow
			case burst == 6 && i == 20:
				if err := e.injectTAP(testFrame(gMAC, e.mac, 300, uint32(markers), 5)); err != nil {
					t.Fatal(err)
				}
				markers++
			case i >= 38:
				inject(sport, 500, tcpACK|tcpPSH)
			default:
				inject(sport, mss, tcpACK)
			}
			total++
		}
		reap()
		time.Sleep(time.Millisecond)
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(got[41000]) < len(want[41000]) || len(got[41001]) < len(want[41001]) || gotMarkers < markers {
		if time.Now().After(deadline) {
			t.Fatalf("guest got %d+%d of %d+%d segments, %d of %d markers (stats %v)",
				len(got[41000]), len(got[41001]), len(want[41000]), len(want[41001]), gotMarkers, markers, e.stats())
		}
		rx.WaitCall(10 * time.Millisecond)
		reap()
	}
	for _, sport := range []uint16{41000, 41001} {
		if len(got[sport]) != len(want[sport]) {
			t.Fatalf("flow %d: %d segments, want %d", sport, len(got[sport]), len(want[sport]))
		}
		for i := range want[sport] {
			if !bytes.Equal(got[sport][i], want[sport][i]) {
				t.Fatalf("flow %d: segment %d of %d differs after re-segmentation (%d vs %d bytes)", sport, i, len(want[sport]), len(got[sport][i]), len(want[sport][i]))
			}
		}
	}
	r := &e.n.Stats().RSC
	st := e.n.Stats()
	t.Logf("%d frames injected → %d packets to the guest, %d GSO; RSC segments %d packets %d coalesced %d; stats %v",
		total, packets, gso, r.Segments.Load(), r.Packets.Load(), r.Coalesced.Load(), e.stats())
	if merge && (gso == 0 || r.GSOOut.Load() == 0) {
		t.Errorf("nothing coalesced toward the guest")
	}
	if !merge && (gso != 0 || r.Segments.Load() != uint64(markers)) {
		// Only the non-IP markers enter the engine (and pass through it).
		t.Errorf("IPv4 coalesced for a guest without GUEST_TSO4: %d GSO packets, engine saw %d", gso, r.Segments.Load())
	}
	if st.RXGSO.Load() != 0 {
		t.Errorf("the TAP handed %d GSO frames with no offloads", st.RXGSO.Load())
	}
	for d := range NumDrops {
		if v := st.Drops[d].Load(); v != 0 {
			t.Errorf("drop %s = %d", d.String(), v)
		}
	}
}
