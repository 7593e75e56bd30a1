//go:build linux

package vhostnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/pcapio"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

var sizes = []int{60, 61, 64, 1514, 1515, 4000, 9014, 32768, 65000, 65535}

// splitsFor cuts header and frame in the ways a driver may: header alone, header split,
// the frame starting inside the header's descriptor, many small pieces.
func splitsFor(hl int) [][]int {
	return [][]int{nil, {hl}, {3, hl - 3}, {hl + 20}, {5, 20, 100}, {1, 1, 1, 1, hl, 7, 1000, 1, 2000}}
}

func TestTXSizesAndSplits(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	if e.n.HdrLen() != 12 {
		t.Fatalf("TAP header %d, want the guest's 12", e.n.HdrLen())
	}
	buf := make([]byte, 1<<17)
	seq := uint32(0)
	for _, n := range sizes {
		for si, sp := range splitsFor(e.s.HdrLen()) {
			for _, ind := range []bool{false, true} {
				f := testFrame(e.mac, gMAC, n, seq, 1)
				seq++
				e.send(vnethdr.Hdr{}, f, sp, ind)
				got, err := e.recvTAP(buf)
				if err != nil {
					t.Fatalf("size %d split %d indirect %v: %v (stats %v)", n, si, ind, err, e.stats())
				}
				if !bytes.Equal(got, f) {
					t.Fatalf("size %d split %d: TAP got %d bytes, differing", n, si, len(got))
				}
			}
		}
	}
	e.waitTXDone()
	if st := e.n.Stats(); st.TXFrames.Load() != uint64(seq) {
		t.Fatalf("TXFrames %d, want %d", st.TXFrames.Load(), seq)
	}
}

func TestRXSizes(t *testing.T) {
	for _, tc := range []struct {
		name           string
		mask           uint64
		bufLen, pieces int
	}{
		{"mrg4k", 0, 4096, 1},
		{"mrg1536x2", 0, 1536, 2},
		{"big-nomrg", 1 << virtio.NetMrgRxbuf, 65536 + 200, 17},
		{"legacy10", 1<<virtio.NetMrgRxbuf | 1<<virtio.Version1, 65536 + 200, 17},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, vhostusertest.Options{AckMask: tc.mask})
			if e.n.HdrLen() != e.s.HdrLen() {
				t.Fatalf("TAP header %d, guest %d", e.n.HdrLen(), e.s.HdrLen())
			}
			rx := e.s.RX(0)
			rx.PostRX(rx.Free()/tc.pieces, tc.bufLen, tc.pieces)
			rx.KickNow()
			for i, n := range sizes {
				f := testFrame(gMAC, e.mac, n, uint32(i), 2)
				if err := e.injectTAP(f); err != nil {
					t.Fatalf("inject %d: %v", n, err)
				}
				got := e.recvGuest(1, tc.bufLen, tc.pieces, 10*time.Second)
				if !bytes.Equal(got[0], f) {
					t.Fatalf("size %d: guest got %d bytes, differing", n, len(got[0]))
				}
			}
		})
	}
}

// TestRXCallsFollowTXLoad: the calls that bring a guest the answers to what it sends
// in bulk are moderated as bulk (the TX worker reports its bytes to the pair's RX ring,
// vhostuser NoteLoad), while the same small frame after little sent is signalled at
// once. The interval is an hour, so whatever is held back stays held.
func TestRXCallsFollowTXLoad(t *testing.T) {
	e := newEnvCfg(t, vhostusertest.Options{}, Config{CallInterval: time.Hour})
	rx := e.s.RX(0)
	rx.PostRX(rx.Free(), 4096, 1)
	rx.KickNow()
	deferred := func() uint64 { return e.n.BackendStats().CallsDeferred.Load() }
	answer := func(seq uint32) {
		t.Helper()
		used := rx.UsedIdx()
		if err := e.injectTAP(testFrame(gMAC, e.mac, 66, seq, 3)); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for rx.UsedIdx() == used {
			if time.Now().After(deadline) {
				t.Fatalf("frame %d never delivered (stats %v)", seq, e.stats())
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	// A request's worth sent, then its answer: signalled at once (and the interval's
	// first call, which any load would send at once too).
	e.send(vnethdr.Hdr{}, testFrame(e.mac, gMAC, 100, 0, 1), []int{12 + 100}, false)
	e.waitTXDone()
	answer(1)
	if !rx.WaitCall(10*time.Second) || deferred() != 0 {
		t.Fatalf("answer to a small request: called %v, deferred %d", rx.Called(), deferred())
	}
	rx.Called()
	rx.ReapRX(e.s.HdrLen(), true)
	rx.SetUsedEvent(rx.Reaped()) // re-armed, as NAPI does after processing
	// 24 KiB sent, then the same small answer: held back within the interval.
	for i := range 16 {
		e.send(vnethdr.Hdr{}, testFrame(e.mac, gMAC, 1514, uint32(2+i), 1), []int{12 + 1514}, false)
	}
	e.waitTXDone()
	answer(2)
	if rx.Called() || deferred() != 1 {
		t.Fatalf("answer after 24 KiB sent: called %v, deferred %d, want a call owed", rx.Called(), deferred())
	}
}

// TestStreams moves SHA-256-checked byte streams of random-sized frames both ways at
// once.
func TestStreams(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	const frames = 3000
	rng := rand.New(rand.NewPCG(1, 2))
	txSizes, rxSizes := make([]int, frames), make([]int, frames)
	for i := range frames {
		txSizes[i], rxSizes[i] = 60+rng.IntN(9000), 60+rng.IntN(9000)
	}
	// TAP → guest: a sender paced by what the guest has taken (the TAP queue is 1000).
	var taken atomic.Int64
	sendDone := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		for i := range frames {
			for int64(i)-taken.Load() > 256 {
				time.Sleep(50 * time.Microsecond)
			}
			f := testFrame(gMAC, e.mac, rxSizes[i], uint32(i), 3)
			h.Write(f)
			if err := e.injectTAP(f); err != nil {
				t.Errorf("inject: %v", err)
				break
			}
		}
		sendDone <- [32]byte(h.Sum(nil))
	}()
	// guest → TAP: the packet socket reader hashes what arrives.
	recvDone := make(chan [32]byte, 1)
	go func() {
		h := sha256.New()
		buf := make([]byte, 1<<17)
		for range frames {
			f, err := e.recvTAP(buf)
			if err != nil {
				t.Errorf("recv TAP: %v", err)
				break
			}
			h.Write(f)
		}
		recvDone <- [32]byte(h.Sum(nil))
	}()
	txHash := sha256.New()
	rxHash := sha256.New()
	rx, tx := e.s.RX(0), e.s.TX(0)
	rx.PostRX(rx.Free(), 4096, 1)
	rx.KickNow()
	sent, got := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for sent < frames || got < frames {
		if time.Now().After(deadline) {
			t.Fatalf("sent %d, received %d of %d (stats %v)", sent, got, frames, e.stats())
		}
		for sent < frames && tx.Free() > 4 {
			f := testFrame(e.mac, gMAC, txSizes[sent], uint32(sent), 4)
			txHash.Write(f)
			data := append(make([]byte, 12), f...)
			tx.Publish(tx.PrepareFrame(data, []int{5, 30}, sent%3 == 0))
			sent++
		}
		tx.KickNow()
		tx.ReapFunc(nil)
		for _, f := range rx.ReapRX(12, true) {
			if binary.BigEndian.Uint16(f.Frame[12:]) != etherTest {
				continue
			}
			rxHash.Write(f.Frame)
			got++
			taken.Store(int64(got))
		}
		if k := rx.Free(); k > 32 {
			rx.PostRX(k, 4096, 1)
			rx.KickNow()
		}
		rx.WaitCall(time.Millisecond)
	}
	if s := <-sendDone; s != [32]byte(rxHash.Sum(nil)) {
		t.Fatal("TAP → guest stream hash differs")
	}
	if r := <-recvDone; r != [32]byte(txHash.Sum(nil)) {
		t.Fatal("guest → TAP stream hash differs")
	}
	t.Logf("stats %v, kicks %d, calls %d", e.stats(), e.n.BackendStats().Kicks.Load(), e.n.BackendStats().Calls.Load())
}

// tso4 is a TSO4 super-frame to farIP with payload bytes of TCP payload, and its header.
func tso4(dst, src []byte, payload int) ([]byte, vnethdr.Hdr) {
	f := make([]byte, 14+20+20+payload)
	copy(f, dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+20+payload))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, unix.IPPROTO_TCP
	copy(ip[12:16], guestIP.AsSlice())
	copy(ip[16:20], farIP.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip[:20], 0))
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], 40000)
	binary.BigEndian.PutUint16(tcp[2:], 5001)
	binary.BigEndian.PutUint32(tcp[4:], 1)
	tcp[12] = 5 << 4
	tcp[13] = 0x10 // ACK
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	for i := range payload {
		tcp[20+i] = byte(i)
	}
	h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOTCPv4, HdrLen: 54, GSOSize: 1448,
		CsumStart: 34, CsumOffset: 16}
	return f, h
}

// TestGSOPassthrough: a 64 KB TSO4 frame from the guest reaches the TAP whole.
func TestGSOPassthrough(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	f, h := tso4(e.mac, gMAC, 65535-40)
	buf := make([]byte, 1<<17)
	for _, sp := range [][]int{nil, {12, 54}, {30, 100, 1000}} {
		e.send(h, f, sp, false)
		got, err := e.recvTAP(buf)
		if err != nil {
			t.Fatalf("split %v: %v (stats %v)", sp, err, e.stats())
		}
		if len(got) != len(f) || !bytes.Equal(got[54:], f[54:]) {
			t.Fatalf("split %v: TAP saw %d bytes, want the whole %d-byte frame", sp, len(got), len(f))
		}
	}
	e.waitTXDone()
	if g := e.n.Stats().TXGSO.Load(); g != 3 {
		t.Fatalf("TXGSO %d, want 3", g)
	}
}

// TestHostileHeaders: malformed or unnegotiated headers are counted and never reach
// the TAP; a good marker frame after each one does.
func TestHostileHeaders(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{AckMask: 1 << virtio.NetHostTSO6})
	f, good := tso4(e.mac, gMAC, 20000)
	bad := func(mut func(h *vnethdr.Hdr, f []byte)) ([]byte, vnethdr.Hdr) {
		ff := bytes.Clone(f)
		h := good
		mut(&h, ff)
		return ff, h
	}
	cases := []struct {
		name   string
		mut    func(h *vnethdr.Hdr, f []byte)
		reason Drop
	}{
		{"gso_size 0", func(h *vnethdr.Hdr, _ []byte) { h.GSOSize = 0 }, DropTXBadHeader},
		{"ufo", func(h *vnethdr.Hdr, _ []byte) { h.GSOType = vnethdr.GSOUDP }, DropTXNotNegotiated},
		{"tso6 not acked", func(h *vnethdr.Hdr, _ []byte) { h.GSOType = vnethdr.GSOTCPv6 }, DropTXNotNegotiated},
		{"csum_start", func(h *vnethdr.Hdr, _ []byte) { h.CsumStart = 60000 }, DropTXBadHeader},
		{"csum_offset", func(h *vnethdr.Hdr, _ []byte) { h.CsumOffset = 6 }, DropTXBadHeader},
		{"rsc flag", func(h *vnethdr.Hdr, _ []byte) { h.Flags |= vnethdr.FlagRSCInfo }, DropTXBadHeader},
		{"ip length", func(_ *vnethdr.Hdr, f []byte) { binary.BigEndian.PutUint16(f[16:], 1000) }, DropTXBadHeader},
		{"not tcp", func(_ *vnethdr.Hdr, f []byte) { f[23] = unix.IPPROTO_UDP }, DropTXBadHeader},
		{"gso on arp", func(_ *vnethdr.Hdr, f []byte) { binary.BigEndian.PutUint16(f[12:], 0x0806) }, DropTXBadHeader},
	}
	buf := make([]byte, 1<<17)
	for i, c := range cases {
		ff, h := bad(c.mut)
		before := e.n.Stats().Drops[c.reason].Load()
		e.send(h, ff, []int{7, 40, 3}, false) // header split, frame inside its descriptor
		marker := testFrame(e.mac, gMAC, 100, uint32(i), 5)
		e.send(vnethdr.Hdr{}, marker, nil, false)
		got, err := e.recvTAP(buf)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !bytes.Equal(got, marker) {
			t.Fatalf("%s: TAP saw a %d-byte frame before the marker", c.name, len(got))
		}
		e.waitTXDone()
		if e.n.Stats().Drops[c.reason].Load() != before+1 {
			t.Fatalf("%s: %s not counted (stats %v)", c.name, c.reason.String(), e.stats())
		}
	}
	if tx := e.n.Stats().TXFrames.Load(); tx != uint64(len(cases)) {
		t.Fatalf("TXFrames %d, want only the %d markers", tx, len(cases))
	}
}

// TestRXStall: with no RX buffers the worker stops reading the TAP (frames wait in the
// kernel's queue), counts a stall, and resumes when the guest posts buffers and kicks.
func TestRXStall(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	const n = 50
	var want [][]byte
	for i := range n {
		f := testFrame(gMAC, e.mac, 1000+i, uint32(i), 6)
		want = append(want, f)
		if err := e.injectTAP(f); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for e.n.Stats().RXStalls.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no stall counted (stats %v)", e.stats())
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if r := e.n.Stats().RXFrames.Load(); r != 0 {
		t.Fatalf("%d frames received with no buffers", r)
	}
	if !e.n.Stats().RXWaiting.Load() {
		t.Fatal("RXWaiting false while the worker waits for buffers")
	}
	// Too few buffers for a worst-case frame is a stall too.
	rx := e.s.RX(0)
	rx.PostRX(4, 4096, 1)
	rx.KickNow()
	for e.n.Stats().RXStalls.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no second stall (stats %v)", e.stats())
		}
		time.Sleep(time.Millisecond)
	}
	got := e.recvGuest(n, 4096, 1, 10*time.Second)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d differs after the stall", i)
		}
	}
	if k := e.n.BackendStats().Kicks.Load(); k == 0 {
		t.Fatal("no kicks counted")
	}
}

// TestOffloadsFollowAcks: TUNSETOFFLOAD ⊆ the guest's acks.
func TestOffloadsFollowAcks(t *testing.T) {
	for _, tc := range []struct {
		mask uint64
		want string
	}{
		{0, "csum,tso4,tso6,tso_ecn,uso4,uso6"},
		{1 << virtio.NetGuestTSO6, "csum,tso4,tso_ecn,uso4,uso6"},
		{1 << virtio.NetGuestCsum, "none"},
		// USO stays on for a guest that takes partial checksums but not UDP GSO:
		// tapgro cuts the packets (split.go).
		{1<<virtio.NetGuestUSO4 | 1<<virtio.NetGuestUSO6, "csum,tso4,tso6,tso_ecn,uso4,uso6"},
		{1<<virtio.NetGuestTSO4 | 1<<virtio.NetGuestTSO6, "csum,uso4,uso6"},
	} {
		t.Run(fmt.Sprint(tc.mask), func(t *testing.T) {
			e := newEnv(t, vhostusertest.Options{AckMask: tc.mask})
			if got := e.tap.Offloads().String(); got != tc.want {
				t.Fatalf("TAP offloads %s, want %s", got, tc.want)
			}
		})
	}
}

// TestReconnect: a new session after the old one ended starts from scratch.
func TestReconnect(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	buf := make([]byte, 1<<17)
	e.s.Stop()
	for i := range 3 {
		if err := e.s.Close(); err != nil {
			t.Fatal(err)
		}
		e.s = vhostusertest.Start(t, e.n.ServeConn, vhostusertest.Options{})
		f := testFrame(e.mac, gMAC, 500, uint32(i), 7)
		e.send(vnethdr.Hdr{}, f, []int{20}, false)
		got, err := e.recvTAP(buf)
		if err != nil || !bytes.Equal(got, f) {
			t.Fatalf("session %d: %v", i, err)
		}
	}
}

// TestServe: Serve takes one QEMU at a time on a listener, each connection a fresh
// session, and returns ctx.Err() once cancelled, ending the running session.
func TestServe(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	path, cancel, done := e.serve()
	defer cancel()
	buf := make([]byte, 1<<17)
	sessions := e.n.BackendStats().Sessions.Load()
	for i := range 2 {
		s := vhostusertest.Dial(t, path, vhostusertest.Options{})
		f := testFrame(e.mac, gMAC, 300, uint32(i), 9)
		h := s.HdrLen()
		s.TX(0).SendFrame(append(make([]byte, h), f...), nil, false)
		s.TX(0).KickNow()
		got, err := e.recvTAP(buf)
		if err != nil || !bytes.Equal(got, f) {
			t.Fatalf("session %d over the listener: %v", i, err)
		}
		if i == 0 {
			s.Close()
		} else {
			cancel()
		}
	}
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Serve = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	if got := e.n.BackendStats().Sessions.Load() - sessions; got != 2 {
		t.Fatalf("%d sessions, want 2", got)
	}
}

func TestFeatureNames(t *testing.T) {
	f := Offer(vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN)
	got := virtio.String(f | 1<<45)
	want := "CSUM GUEST_CSUM MTU GUEST_TSO4 GUEST_TSO6 GUEST_ECN HOST_TSO4 HOST_TSO6 HOST_ECN MRG_RXBUF GUEST_ANNOUNCE INDIRECT_DESC EVENT_IDX VERSION_1 bit(45)"
	if got != want {
		t.Errorf("virtio.String = %q\nwant            %q", got, want)
	}
	if virtio.String(0) != "none" {
		t.Errorf("virtio.String(0) = %q", virtio.String(0))
	}
}

// TestCapture: --pcap-port on this path records every frame the guest sent (a TSO
// frame split over descriptors, recorded whole) and received, byte for byte, without
// the virtio-net header; stopping it flushes the file.
func TestCapture(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	path := filepath.Join(t.TempDir(), "vu.pcap")
	if err := e.n.SetCapture(path); err != nil {
		t.Fatal(err)
	}
	f, h := tso4(e.mac, gMAC, 30000)
	e.send(h, f, []int{12, 54, 1000}, false)
	buf := make([]byte, 1<<17)
	if _, err := e.recvTAP(buf); err != nil {
		t.Fatal(err)
	}
	e.waitTXDone()
	in := testFrame(gMAC, e.mac, 1200, 7, 6)
	if err := e.injectTAP(in); err != nil {
		t.Fatal(err)
	}
	got := e.recvGuest(1, 4096, 1, 10*time.Second)
	if !bytes.Equal(got[0], in) {
		t.Fatal("the guest received a different frame")
	}
	if err := e.n.CloseCapture(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs [][]byte
	for off := pcapio.FileHeaderLen; off+pcapio.RecordHeaderLen <= len(b); {
		caplen := int(binary.LittleEndian.Uint32(b[off+8:]))
		off += pcapio.RecordHeaderLen
		recs = append(recs, b[off:off+caplen])
		off += caplen
	}
	if len(recs) != 2 || !bytes.Equal(recs[0], f) || !bytes.Equal(recs[1], in) {
		t.Fatalf("capture holds %d records (lengths %v), want the %d-byte TSO frame sent and the %d-byte frame received", len(recs), lens(recs), len(f), len(in))
	}
	if c := e.n.Capture().Stats(); c.Frames.Load() != 2 || c.Dropped.Load() != 0 {
		t.Errorf("capture counted %d frames, %d dropped", c.Frames.Load(), c.Dropped.Load())
	}
}

func lens(bs [][]byte) []int {
	var out []int
	for _, b := range bs {
		out = append(out, len(b))
	}
	return out
}

// TestTXHold: after a batch that moved bulk (txHoldBytes or more) the TX worker holds
// with kicks off, so a frame the guest posts then, without kicking, is still sent; after
// a small batch it waits for the kick, with avail_event at the next index. The hold is
// 2 s, far longer than this test takes to look and post.
func TestTXHold(t *testing.T) {
	e := newEnvCfg(t, vhostusertest.Options{}, Config{TXHold: 2 * time.Second})
	tx := e.s.TX(0)
	hl := e.s.HdrLen()
	frame := func(seq uint32) []byte {
		data := make([]byte, hl+1514)
		var h vnethdr.Hdr
		h.Encode(data, hl)
		copy(data[hl:], testFrame(e.mac, gMAC, 1514, seq, 4))
		return data
	}
	buf := make([]byte, 1<<16)
	expect := func(seq uint32) {
		t.Helper()
		f, err := e.recvTAP(buf)
		if err != nil {
			t.Fatalf("frame %d: %v (stats %v)", seq, err, e.stats())
		}
		if got := binary.BigEndian.Uint32(f[14:]); got != seq {
			t.Fatalf("TAP got frame %d, want %d", got, seq)
		}
	}
	// A small batch: the worker waits for the next kick.
	tx.SendFrame(frame(0), nil, false)
	tx.KickNow()
	expect(0)
	deadline := time.Now().Add(10 * time.Second)
	for tx.AvailEvent() != tx.AvailIdx() {
		if time.Now().After(deadline) {
			t.Fatalf("after a small batch, avail_event %d, want %d (kicks on for the next chain)", tx.AvailEvent(), tx.AvailIdx())
		}
		time.Sleep(time.Millisecond)
	}
	// 12 frames in one batch (18 KiB): bulk. The frame after it is posted without a kick.
	var heads []uint16
	for i := range 12 {
		heads = append(heads, tx.PrepareFrame(frame(uint32(1+i)), nil, false))
	}
	tx.Publish(heads...)
	tx.KickNow()
	for i := range 12 {
		expect(uint32(1 + i))
	}
	for tx.UsedIdx() != tx.AvailIdx() {
		time.Sleep(100 * time.Microsecond) // the batch is published after its writes
	}
	// Holding, the worker leaves kicks off: avail_event stays behind. (Waiting for a
	// kick it would move avail_event to the next index within microseconds; 100 ms of
	// the 2 s hold is only how long this test looks, and cannot fail a correct hold.)
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		if tx.AvailEvent() == tx.AvailIdx() {
			t.Fatal("after a bulk batch the worker turned kicks on: no hold")
		}
		time.Sleep(time.Millisecond)
	}
	tx.SendFrame(frame(13), nil, false) // no kick: the hold's next batch takes it
	expect(13)
}
