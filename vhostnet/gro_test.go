//go:build linux

package vhostnet

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/coalescer"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// tcpSeg is an IPv4/TCP frame from src to dst (ports sport → dport) with payload, TCP
// flags fl and IPv4 ID id. partial: the checksum field holds the pseudo-header sum and
// the header says NEEDS_CSUM (a guest with checksum offload); else the checksum is
// complete and the header zero.
func tcpSeg(dmac, smac net.HardwareAddr, sip, dip netip.Addr, sport, dport uint16, seq, ack uint32, fl uint8, id uint16, payload []byte, partial bool) ([]byte, vnethdr.Hdr) {
	f := make([]byte, 14+20+20+len(payload))
	copy(f, dmac)
	copy(f[6:], smac)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(40+len(payload)))
	binary.BigEndian.PutUint16(ip[4:], id)
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, unix.IPPROTO_TCP
	copy(ip[12:16], sip.AsSlice())
	copy(ip[16:20], dip.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip[:20], 0))
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = 5 << 4
	tcp[13] = fl
	binary.BigEndian.PutUint16(tcp[14:], 1000)
	copy(tcp[20:], payload)
	ps := vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, ip[12:16], ip[16:20], 20+len(payload))
	if partial {
		binary.BigEndian.PutUint16(tcp[16:], vnethdr.Fold(ps))
		return f, vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, CsumStart: 34, CsumOffset: 16}
	}
	binary.BigEndian.PutUint16(tcp[16:], vnethdr.Checksum(tcp, ps))
	return f, vnethdr.Hdr{}
}

const (
	tcpACK = 0x10
	tcpPSH = 0x08
	mss    = 1448
)

// streamByte is byte i of flow's test stream.
func streamByte(flow int, i int) byte { return byte(i*131 + i>>9 + flow*17) }

func streamBytes(flow, from, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = streamByte(flow, from+i)
	}
	return b
}

// tcpStreams reassembles what the TAP sees of the test flows (IPv4/TCP to farIP, by
// source port): every frame must continue its flow exactly (no reordering, no gap, no
// duplicate), and its payload must be the stream's bytes.
type tcpStreams struct {
	t       *testing.T
	next    map[uint16]int // flow → next expected stream offset
	frames  map[uint16]int
	maxLen  int
	largest int
}

func (s *tcpStreams) add(f []byte) {
	s.t.Helper()
	if len(f) < 54 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != unix.IPPROTO_TCP {
		return
	}
	ip := f[14:]
	tot := int(binary.BigEndian.Uint16(ip[2:]))
	if tot > len(ip) {
		s.t.Fatalf("IP length %d, frame %d", tot, len(f))
	}
	tcp := ip[20:tot]
	sport := binary.BigEndian.Uint16(tcp)
	doff := int(tcp[12]>>4) * 4
	seq := int(binary.BigEndian.Uint32(tcp[4:]))
	pay := tcp[doff:]
	flow := int(sport) - 40000
	if seq != s.next[sport] {
		s.t.Fatalf("flow %d: frame at seq %d, want %d (reordered or lost)", flow, seq, s.next[sport])
	}
	if !bytes.Equal(pay, streamBytes(flow, seq, len(pay))) {
		s.t.Fatalf("flow %d: %d payload bytes at seq %d differ", flow, len(pay), seq)
	}
	s.next[sport] += len(pay)
	s.frames[sport]++
	s.largest = max(s.largest, len(f))
}

// TestGROToTAP: MTU TCP segments from the guest, of two interleaved flows (one with
// complete checksums, one NEEDS_CSUM as a guest with checksum offload sends them), reach
// the TAP as GSO packets, byte-exact and in order, while frames the engine does not
// merge — a guest GSO frame in the middle of a flow, a pure ACK, a non-TCP frame — are
// written whole and never overtake their flow's held data. Both header lengths (the
// engine's header is re-encoded for a 10-byte TAP).
func TestGROToTAP(t *testing.T) {
	for _, tc := range []struct {
		name string
		mask uint64
	}{{"hdr12", 0}, {"hdr10", 1<<virtio.NetMrgRxbuf | 1<<virtio.Version1}} {
		for _, mode := range []string{"batch", "timer"} {
			t.Run(tc.name+"/"+mode, func(t *testing.T) {
				testGROToTAP(t, tc.mask, mode == "timer")
			})
		}
	}
}

func testGROToTAP(t *testing.T, mask uint64, timer bool) {
	e := newEnvCfg(t, vhostusertest.Options{AckMask: mask},
		Config{GRO: true, TimerFlush: timer, RSCInterval: 200 * time.Microsecond})
	hl := e.s.HdrLen()
	const rounds, perRound = 12, 48
	sent := map[uint16]int{40000: 0, 40001: 0}
	segs, markers := 0, 0
	tx := e.s.TX(0)
	push := func(f []byte, h vnethdr.Hdr) {
		data := make([]byte, hl+len(f))
		h.Encode(data, hl)
		copy(data[hl:], f)
		for tx.Free() < 4 {
			e.reapTX(time.Second)
		}
		tx.SendFrame(data, []int{hl}, false)
		segs++
	}
	seg := func(flow uint16, n int, fl uint8) {
		off := sent[flow]
		f, h := tcpSeg(e.mac, gMAC, guestIP, farIP, flow, 5001, uint32(off), 1, fl, uint16(off/mss), streamBytes(int(flow-40000), off, n), flow == 40001)
		push(f, h)
		sent[flow] += n
	}
	for r := range rounds {
		for i := range perRound {
			flow := uint16(40000 + i%2)
			switch {
			case r == 3 && i == 20:
				// A guest GSO frame of flow 0 mid-flow: passed whole, after the held data.
				off := sent[40000]
				f, h := tso4(e.mac, gMAC, 3*mss)
				tcp := f[34:]
				binary.BigEndian.PutUint32(tcp[4:], uint32(off))
				binary.BigEndian.PutUint32(tcp[8:], 1)
				binary.BigEndian.PutUint16(tcp[14:], 1000)
				copy(tcp[20:], streamBytes(0, off, 3*mss))
				binary.BigEndian.PutUint16(tcp[16:], vnethdr.Fold(vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, f[26:30], f[30:34], 20+3*mss)))
				push(f, h)
				sent[40000] += 3 * mss
			case r == 5 && i == 11:
				seg(flow, 0, tcpACK) // pure ACK of flow 1 mid-flow
			case r == 7 && i == 30:
				push(testFrame(e.mac, gMAC, 200, uint32(markers), 9), vnethdr.Hdr{})
				markers++
			case i == perRound-1:
				seg(flow, 700, tcpACK|tcpPSH)
			default:
				seg(flow, mss, tcpACK)
			}
		}
		tx.KickNow()
		e.waitTXDone()
	}
	s := &tcpStreams{t: t, next: map[uint16]int{}, frames: map[uint16]int{}}
	buf := make([]byte, 1<<17)
	gotMarkers := 0
	deadline := time.Now().Add(20 * time.Second)
	for s.next[40000] < sent[40000] || s.next[40001] < sent[40001] || gotMarkers < markers {
		if time.Now().After(deadline) {
			t.Fatalf("TAP got %v of %v, %d of %d markers (stats %v)", s.next, sent, gotMarkers, markers, e.stats())
		}
		f, err := e.recvTAP(buf)
		if err != nil {
			t.Fatalf("recv: %v (got %v of %v; stats %v)", err, s.next, sent, e.stats())
		}
		if binary.BigEndian.Uint16(f[12:]) == etherTest {
			gotMarkers++
			continue
		}
		s.add(f)
	}
	g := &e.n.Stats().GRO
	frames := s.frames[40000] + s.frames[40001]
	t.Logf("%d guest frames → %d TAP frames (largest %d bytes); GRO segments %d packets %d gso %d coalesced %d; stats %v",
		segs, frames+gotMarkers, s.largest, g.Segments.Load(), g.Packets.Load(), g.GSOOut.Load(), g.Coalesced.Load(), e.stats())
	if g.GSOOut.Load() == 0 || s.largest <= 1514 || frames*4 > segs {
		t.Errorf("not coalesced: %d TCP frames at the TAP for %d guest frames, largest %d", frames, segs, s.largest)
	}
	if g.Segments.Load() != uint64(segs) || g.Packets.Load() != uint64(frames+gotMarkers) {
		t.Errorf("GRO counted %d segments, %d packets; want %d, %d", g.Segments.Load(), g.Packets.Load(), segs, frames+gotMarkers)
	}
	if g.Reason(coalescer.ReasonGSOInput).Load() != 1 || g.Reason(coalescer.ReasonPureAck).Load()+g.Reason(coalescer.ReasonDupAck).Load() != 1 || g.Reason(coalescer.ReasonNotTCPUDP).Load() != uint64(markers) {
		t.Errorf("bypass counters: gso_input %d, acks %d, not_tcp_udp %d", g.Reason(coalescer.ReasonGSOInput).Load(), g.Reason(coalescer.ReasonPureAck).Load()+g.Reason(coalescer.ReasonDupAck).Load(), g.Reason(coalescer.ReasonNotTCPUDP).Load())
	}
	st := e.n.Stats()
	if st.TXFrames.Load() != uint64(segs) || st.TXGSO.Load() != 1 {
		t.Errorf("TXFrames %d (want %d), TXGSO %d (want 1)", st.TXFrames.Load(), segs, st.TXGSO.Load())
	}
	for r := range NumDrops {
		if v := st.Drops[r].Load(); v != 0 {
			t.Errorf("drops %s = %d", r.String(), v)
		}
	}
}

// TestGROSwitch: without Config.GRO nothing is coalesced and the engine counts nothing;
// SetGRO(true) at run time makes the next segments leave as GSO packets; SetGRO(false)
// writes what the engine holds before any later frame, and the stream stays whole and in
// order across both switches.
func TestGROSwitch(t *testing.T) {
	e := newEnvCfg(t, vhostusertest.Options{}, Config{TimerFlush: true, RSCInterval: time.Second})
	hl := e.s.HdrLen()
	tx := e.s.TX(0)
	s := &tcpStreams{t: t, next: map[uint16]int{}, frames: map[uint16]int{}}
	buf := make([]byte, 1<<17)
	seq := 0
	// round sends n MTU segments and returns how many TAP frames carried them.
	round := func(n int) int {
		t.Helper()
		before := s.frames[40000]
		for range n {
			f, h := tcpSeg(e.mac, gMAC, guestIP, farIP, 40000, 5001, uint32(seq), 1, tcpACK, uint16(seq/mss), streamBytes(0, seq, mss), false)
			data := make([]byte, hl+len(f))
			h.Encode(data, hl)
			copy(data[hl:], f)
			for tx.Free() < 4 {
				e.reapTX(time.Second)
			}
			tx.SendFrame(data, []int{hl}, false)
			seq += mss
		}
		tx.KickNow()
		e.waitTXDone()
		return s.frames[40000] - before
	}
	drain := func() {
		t.Helper()
		for s.next[40000] < seq {
			f, err := e.recvTAP(buf)
			if err != nil {
				t.Fatalf("recv: %v (got %d of %d bytes; stats %v)", err, s.next[40000], seq, e.stats())
			}
			s.add(f)
		}
	}
	round(20)
	drain()
	if got := s.frames[40000]; got != 20 || e.n.Stats().GRO.Segments.Load() != 0 {
		t.Fatalf("GRO off: %d frames at the TAP for 20 segments, engine saw %d", got, e.n.Stats().GRO.Segments.Load())
	}
	if !e.n.SetGRO(true) || !e.n.GROActive() {
		t.Fatal("SetGRO(true) did not turn GRO on")
	}
	before := s.frames[40000]
	round(40)
	// Timer mode with a 1 s interval: the last aggregate may still be held; switching
	// off must write it before the next frames.
	if e.n.SetGRO(false) {
		t.Fatal("SetGRO(false) left GRO on")
	}
	round(10)
	drain()
	on := s.frames[40000] - before - 10
	g := &e.n.Stats().GRO
	if g.Segments.Load() != 40 || g.GSOOut.Load() == 0 || on*4 > 40 {
		t.Errorf("GRO on for 40 segments: %d TAP frames, engine segments %d, GSO packets %d", on, g.Segments.Load(), g.GSOOut.Load())
	}
	for r := range NumDrops {
		if v := e.n.Stats().Drops[r].Load(); v != 0 {
			t.Errorf("drops %s = %d", r.String(), v)
		}
	}
}
