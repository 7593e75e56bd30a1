//go:build linux

package vhostnet

import (
	"bytes"
	"encoding/binary"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"tapgro/tapdev/taptest"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/vnethdr"
)

// TestGSOWriteRefused: the TAP refuses the guest's TSO4 frames with EINVAL, as a kernel
// with a GSO bug would (package gsowrite). Each frame reaches the TAP all the same, as
// plain segments carrying its bytes. If the kernel refuses tapgro's own probe of the
// kind too, TSO4 is off for good: the next frame is cut before any write, GRO stops.
// If it takes the probe, the refusal was about that frame and nothing is turned off.
func TestGSOWriteRefused(t *testing.T) {
	for _, probeRefused := range []bool{true, false} {
		name := map[bool]string{true: "kernel-bug", false: "one-frame"}[probeRefused]
		t.Run(name, func(t *testing.T) {
			var refusals, probes atomic.Int64
			e := newEnvCfg(t, vhostusertest.Options{}, Config{GRO: true}, func(tap *taptest.TAP) {
				tap.Refuse = func(pkt []byte) error {
					var h vnethdr.Hdr
					if h.Decode(pkt, tap.VnetHdrLen()) != nil || !h.IsGSO() {
						return nil
					}
					if len(pkt) < 200 { // a probe: two 8-byte segments
						probes.Add(1)
						if !probeRefused {
							return nil
						}
					}
					refusals.Add(1)
					return unix.EINVAL
				}
			})
			const frames, segs = 2, 3
			for range frames {
				f, h := tso4(e.mac, gMAC, segs*1448)
				e.send(h, f, nil, false)
				e.waitTXDone()
			}
			hl := e.fake.VnetHdrLen()
			var payload []byte
			n := 0
			for _, p := range e.fake.Written() {
				var h vnethdr.Hdr
				h.Decode(p, hl)
				f := p[hl:]
				if len(f) < 54 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != unix.IPPROTO_TCP ||
					binary.BigEndian.Uint16(f[34:]) != 40000 {
					continue // a probe
				}
				if h.IsGSO() || len(f) > 14+20+20+1448 {
					t.Fatalf("a GSO frame reached the TAP: %+v, %d bytes", h, len(f))
				}
				if err := vnethdr.ValidatePeer(f, &h); err != nil {
					t.Errorf("segment %d: %v", n, err)
				}
				payload = append(payload, f[54:]...)
				n++
			}
			want := make([]byte, segs*1448)
			for i := range want {
				want[i] = byte(i)
			}
			if n != frames*segs || !bytes.Equal(payload, append(want, want...)) {
				t.Fatalf("%d segments carrying %d bytes at the TAP, want %d carrying both frames' %d", n, len(payload), frames*segs, 2*len(want))
			}
			st := e.n.Stats()
			killed := e.n.TapKilled()&vnethdr.OffloadTSO4 != 0
			t.Logf("refusals %d, probes %d, fallbacks %d, split before the write %d, killed %s, gro active %v",
				refusals.Load(), probes.Load(), st.GSOFallback.Load(), st.TXSplit.Load(), e.n.TapKilled(), e.n.GROActive())
			if st.TXFrames.Load() != frames || st.Drops[DropTXTAP].Load() != 0 {
				t.Errorf("TXFrames %d, tx_tap drops %d", st.TXFrames.Load(), st.Drops[DropTXTAP].Load())
			}
			if probeRefused {
				if !killed || e.n.GROActive() || st.GSOFallback.Load() != 1 || st.TXSplit.Load() != 1 || refusals.Load() != 2 {
					t.Errorf("a kernel that refuses the probe: TSO4 killed %v, GRO active %v, fallbacks %d, split before the write %d, refusals %d; want true, false, 1, 1, 2",
						killed, e.n.GROActive(), st.GSOFallback.Load(), st.TXSplit.Load(), refusals.Load())
				}
				return
			}
			if killed || !e.n.GROActive() || st.GSOFallback.Load() != frames || st.TXSplit.Load() != 0 || probes.Load() != frames {
				t.Errorf("a kernel that takes the probe: TSO4 killed %v, GRO active %v, fallbacks %d, split before the write %d, probes %d; want false, true, %d, 0, %d",
					killed, e.n.GROActive(), st.GSOFallback.Load(), st.TXSplit.Load(), probes.Load(), frames, frames)
			}
		})
	}
}
