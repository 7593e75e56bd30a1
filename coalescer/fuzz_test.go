package coalescer

import (
	"bytes"
	"encoding/binary"
	"testing"

	"tapgro/vnethdr"
)

// Fuzz input: one config byte, then records [ctl][len16 LE][frame]. ctl bit 0: Flush
// after the frame; bits 1-2: arrival header none / DATA_VALID / NEEDS_CSUM / GSO TCPv4;
// bit 3: FlushExpired after the frame.

func fuzzRecord(ctl byte, frame []byte) []byte {
	return append([]byte{ctl, byte(len(frame)), byte(len(frame) >> 8)}, frame...)
}

func fuzzSeeds() [][]byte {
	var seeds [][]byte
	f := newFlow("tcp4")
	s := []byte{0x00}
	for range 4 {
		s = append(s, fuzzRecord(0, f.Seg(300))...)
	}
	s = append(s, fuzzRecord(1, f.Seg(0))...)
	seeds = append(seeds, s)

	g, u := newFlow("tcp6", withVLAN(3)), newFlow("udp6")
	s = []byte{0x03}
	for range 3 {
		s = append(s, fuzzRecord(0, g.Seg(200))...)
		s = append(s, fuzzRecord(2, u.Seg(100))...)
	}
	s = append(s, fuzzRecord(0, g.Seg(200, orFlags(tcpPSH)))...)
	seeds = append(seeds, s)

	f = newFlow("tcp4")
	s = []byte{0x10}
	s = append(s, fuzzRecord(4, f.Seg(100, partialL4))...)
	s = append(s, fuzzRecord(4, f.Seg(100, partialL4))...)
	s = append(s, fuzzRecord(6, f.Seg(300))...)
	s = append(s, fuzzRecord(8, f.Seg(100, withIPOpt))...)
	s = append(s, fuzzRecord(1, f.Seg(100, withPad(10)))...)
	seeds = append(seeds, s)

	// Fixed IDs without DF, IPv6 extension header chains (equal, changed, routed), and
	// segments beyond a 1500 MTU ending in a short tail. They are kept to 3 KB: with a
	// 64 KB seed the fuzzer barely executes (5 execs in 30 s here).
	f = newFlow("tcp4", withDF(false))
	e := newFlow("tcp6", hbhDstOpts)
	s = []byte{0x08}
	for range 3 {
		s = append(s, fuzzRecord(0, f.Seg(300, withID(9)))...)
		s = append(s, fuzzRecord(0, e.Seg(200))...)
	}
	s = append(s, fuzzRecord(0, e.Seg(200, dstOpts))...)
	s = append(s, fuzzRecord(0, e.Seg(200, routingHdr(1)))...)
	j := newFlow("tcp4", withOpts(nil))
	for range 3 {
		s = append(s, fuzzRecord(0, j.Seg(3000))...)
	}
	s = append(s, fuzzRecord(1, j.Seg(500))...)
	seeds = append(seeds, s)
	return seeds
}

// fuzzPayload is the L4 payload a frame carries, by vnethdr's independent parser.
func fuzzPayload(frame []byte) int {
	l, err := vnethdr.ParseLayout(frame)
	if err != nil || (!l.IsTCP() && !l.IsUDP()) {
		return 0
	}
	return l.PayloadLen()
}

func FuzzCoalesce(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(runFuzzBody)
}

func runFuzzBody(t *testing.T, data []byte) {
	{
		if len(data) < 1 {
			return
		}
		cb := data[0]
		cfg := Config{
			MaxFlows:    1 + int(cb&3),
			MaxSegments: []int{2, 3, 64, 100}[cb>>2&3],
			VnetHdrLen:  vnethdr.Len + 2*int(cb>>4&1),
			UDP:         cb&0x20 == 0,
			ECN:         cb&0x40 != 0,
			DisableTCP:  cb&0x80 != 0,
		}
		vl := cfg.VnetHdrLen
		var outPayload, packets int
		c := New(cfg, func(pkt []byte) {
			packets++
			if len(pkt) > vl+maxL2+maxIPLen {
				t.Fatalf("emitted %d bytes", len(pkt))
			}
			var h vnethdr.Hdr
			if err := h.Decode(pkt, vl); err != nil {
				t.Fatal(err)
			}
			frame := pkt[vl:]
			outPayload += fuzzPayload(frame)
			if h.IsGSO() && h.HdrLen != 0xffff { // our own GSO output (inputs use 0xffff)
				out := make([][]byte, 128)
				for i := range out {
					out[i] = make([]byte, int(h.HdrLen)+int(h.GSOSize))
				}
				if _, err := vnethdr.Split(frame, &h, out, make([]int, len(out))); err != nil {
					t.Fatalf("emitted GSO packet rejected by Split: %v (%s)", err, h)
				}
			}
		})
		var inPayload, frames int
		rest := data[1:]
		now := int64(0)
		for len(rest) >= 3 {
			ctl, n := rest[0], int(binary.LittleEndian.Uint16(rest[1:]))
			rest = rest[3:]
			n = min(n, len(rest))
			frame := rest[:n]
			rest = rest[n:]
			buf := make([]byte, vl+len(frame))
			copy(buf[vl:], frame)
			inPayload += fuzzPayload(frame)
			frames++
			var in *vnethdr.Hdr
			switch ctl >> 1 & 3 {
			case 1:
				in = &vnethdr.Hdr{Flags: vnethdr.FlagDataValid}
			case 2:
				in = &vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, CsumStart: 34, CsumOffset: 16}
			case 3:
				in = &vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOTCPv4, GSOSize: 100, HdrLen: 0xffff}
			}
			now += 10
			if ctl&16 != 0 {
				// AddSplit: a private prefix of n/(1+k) bytes, the rest in pieces of
				// k+1 bytes, k from the control byte's top bits.
				k := int(ctl >> 5)
				valid := n / (1 + k)
				var pieces [][]byte
				for off := valid; off < n; off += k + 1 {
					pieces = append(pieces, bytes.Clone(frame[off:min(n, off+k+1)]))
				}
				for i := vl + valid; i < len(buf); i++ {
					buf[i] = 0xdb
				}
				c.AddSplit(buf, valid, pieces, in, now)
			} else {
				c.Add(buf, in, now)
			}
			if ctl&1 != 0 {
				c.Flush()
			}
			if ctl&8 != 0 {
				c.FlushExpired(now, 15)
			}
		}
		c.Flush()
		if c.Held() != 0 {
			t.Fatalf("Held() = %d after Flush", c.Held())
		}
		if inPayload != outPayload {
			t.Fatalf("payload bytes: %d in, %d out", inPayload, outPayload)
		}
		st := c.Stats()
		if st.Segments.Load() != uint64(frames) || st.Packets.Load() != uint64(packets) {
			t.Fatalf("counters: %d segments, %d packets; saw %d frames, %d packets",
				st.Segments.Load(), st.Packets.Load(), frames, packets)
		}
	}
}
