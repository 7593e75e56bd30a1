//go:build linux

package vhostnet

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// The dirty log during a migration (vhostuser/log.go, migrate.go): with logging on, the
// pages tapgro marks are exactly the pages of guest memory that changed, found by a
// byte-for-byte diff of guest RAM before and after, for every way tapgro writes guest
// memory — frames over several mergeable buffers, RSC packets, a used ring that wraps,
// the event index and the no-event-index flags word, the segments of a cut UDP GSO
// packet (and the chains its whole frame went into first), transmit completions.

// gpaOffset is where guest-physical a lives in the double's memfd.
func gpaOffset(g *vhostusertest.Guest, a uint64) (uint64, bool) {
	for _, r := range g.Regions {
		if a >= r.GPA && a < r.GPA+r.Size {
			return r.MmapOffset + a - r.GPA, true
		}
	}
	return 0, false
}

// devicePages are the guest pages tapgro may write: every ring's used ring, and the
// receive rings' buffer slots. The double writes only the other parts of guest RAM
// (descriptor tables, avail rings, transmit buffers), none of which share a page with
// these (vhostusertest.NewRing aligns used rings and slots to pages).
func devicePages(s *vhostusertest.Session) []uint64 {
	var pages []uint64
	add := func(a uint64, n int) {
		for p := a / vhostusertest.LogPage; p <= (a+uint64(n)-1)/vhostusertest.LogPage; p++ {
			pages = append(pages, p)
		}
	}
	for i, r := range s.Rings {
		add(r.UsedA, 6+8*r.Num)
		if i%2 == 0 {
			add(r.Slot(0), r.Num*r.SlotSize)
		}
	}
	slices.Sort(pages)
	return slices.Compact(pages)
}

// changedPages are the pages of set whose bytes differ between before (a copy of the
// double's memfd) and now.
func changedPages(g *vhostusertest.Guest, before []byte, set []uint64) []uint64 {
	var out []uint64
	for _, p := range set {
		off, ok := gpaOffset(g, p*vhostusertest.LogPage)
		if !ok {
			continue
		}
		if !bytes.Equal(before[off:off+vhostusertest.LogPage], g.Mem[off:off+vhostusertest.LogPage]) {
			out = append(out, p)
		}
	}
	return out
}

// fillSlots writes a pattern into every receive slot, so that any byte tapgro writes
// there changes the page.
func fillSlots(s *vhostusertest.Session) {
	for i := 0; i < len(s.Rings); i += 2 {
		r := s.Rings[i]
		b := s.G.At(r.Slot(0), r.Num*r.SlotSize)
		for j := range b {
			b[j] = 0xee
		}
	}
}

// logCase is one write path: its session, its configuration, and the traffic that
// exercises it (returning once the guest has everything).
type logCase struct {
	name    string
	o       vhostusertest.Options
	cfg     Config
	kernel  bool // the traffic needs the kernel's TAP (newKernelEnv)
	traffic func(t *testing.T, e *env)
}

// env is the case's test environment.
func (c logCase) env(t *testing.T) *env {
	if c.kernel {
		return newKernelEnv(t, c.o, c.cfg)
	}
	return newEnvCfg(t, c.o, c.cfg)
}

func logCases() []logCase {
	injectEth := func(t *testing.T, e *env, frames, size, bufLen int) {
		rx := e.s.RX(0)
		rx.PostRX(min(rx.Free(), 64), bufLen, 1)
		rx.KickNow()
		var sent [][]byte
		for i := range frames {
			f := testFrame(gMAC, e.mac, size, uint32(i), 7)
			sent = append(sent, f)
			if err := e.injectTAP(f); err != nil {
				t.Fatal(err)
			}
		}
		got := e.recvGuest(frames, bufLen, 1, 10*time.Second)
		for i := range got {
			if !bytes.Equal(got[i], sent[i]) {
				t.Fatalf("frame %d differs", i)
			}
		}
	}
	sendTX := func(t *testing.T, e *env, frames int) {
		for i := range frames {
			e.send(vnethdr.Hdr{}, testFrame(e.mac, gMAC, 1000, uint32(i), 8), []int{12}, false)
		}
		e.waitTXDone()
	}
	return []logCase{
		{name: "mergeable-9000", traffic: func(t *testing.T, e *env) {
			injectEth(t, e, 40, 9000, 2048) // five chains a frame
			sendTX(t, e, 20)
		}},
		{name: "used-ring-wraps", o: vhostusertest.Options{Num: 16}, traffic: func(t *testing.T, e *env) {
			injectEth(t, e, 100, 700, 4096)
			sendTX(t, e, 40)
		}},
		{name: "no-event-idx", o: vhostusertest.Options{AckMask: 1 << virtio.RingEventIdx}, traffic: func(t *testing.T, e *env) {
			injectEth(t, e, 30, 1500, 4096)
			sendTX(t, e, 10)
		}},
		{name: "rsc", cfg: Config{GRO: true, Offload: &vnethdr.Choice{}}, traffic: func(t *testing.T, e *env) {
			rx := e.s.RX(0)
			rx.PostRX(64, 4096, 1)
			rx.KickNow()
			for i := range 64 {
				f := rxTCP(e, 41000, uint32(1000+i*mss), tcpACK, uint16(i), streamBytes(0, i*mss, mss))
				if err := e.injectTAP(f); err != nil {
					t.Fatal(err)
				}
			}
			// Until the guest has every payload byte (RSC packets hold 1448-byte
			// segments behind one 54-byte header each).
			got := 0
			deadline := time.Now().Add(10 * time.Second)
			for got < 64*mss {
				if time.Now().After(deadline) {
					t.Fatalf("guest got %d of %d bytes (stats %v)", got, 64*mss, e.stats())
				}
				rx.WaitCall(10 * time.Millisecond)
				for _, f := range rx.ReapRX(e.s.HdrLen(), true) {
					if len(f.Frame) > 54 && f.Frame[23] == unix.IPPROTO_TCP {
						got += len(f.Frame) - 54
					}
				}
			}
			if e.n.Stats().RSC.GSOOut.Load() == 0 {
				t.Fatalf("nothing coalesced (stats %v)", e.stats())
			}
		}},
		{name: "uso-cut", o: vhostusertest.Options{AckMask: 1<<virtio.NetGuestUSO4 | 1<<virtio.NetGuestUSO6}, kernel: true, traffic: func(t *testing.T, e *env) {
			requireUSO(t, e)
			payload := usoPayload(usoSegs * usoSize)
			e.udpGSOSend(payload, usoSize)
			checkCut(t, e.recvGuestUDP(len(payload), 2048, 64), payload)
		}},
	}
}

// TestDirtyLog: every write path marks exactly the pages it changed.
func TestDirtyLog(t *testing.T) {
	for _, tc := range logCases() {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.env(t)
			marked, changed := runLogged(t, e, tc.traffic)
			if !slices.Equal(marked, changed) {
				t.Errorf("pages marked %v\npages changed %v\nmarked, unchanged: %v\nchanged, unmarked: %v",
					marked, changed, minus(marked, changed), minus(changed, marked))
			}
			bs := e.n.BackendStats()
			if bs.LogPages.Load() == 0 || bs.LogBeyond.Load() != 0 {
				t.Errorf("LogPages %d, LogBeyond %d", bs.LogPages.Load(), bs.LogBeyond.Load())
			}
			t.Logf("%d pages marked and changed (stats %v)", len(marked), e.stats())
		})
	}
	// The control, a back-end that does not mark receive buffers, is a build of its own
	// (migrate_unlogged_test.go, -tags tapgro_unlogged_rx; test.sh runs it).
}

// runLogged fills the receive slots, copies guest RAM, turns logging on as QEMU does at
// a migration's start, runs traffic, lets the workers go idle, and returns the pages
// the log holds and the device pages that changed (both sorted). Every marked page
// must be a device page.
func runLogged(t *testing.T, e *env, traffic func(*testing.T, *env)) (marked, changed []uint64) {
	t.Helper()
	fillSlots(e.s)
	before := bytes.Clone(e.s.G.Mem)
	l := e.s.StartLog()
	if !e.n.BackendStats().Logging.Load() {
		t.Fatal("logging not on after SET_LOG_BASE, LOG_ALL and VHOST_VRING_F_LOG")
	}
	traffic(t, e)
	time.Sleep(200 * time.Millisecond) // the workers' last used-ring writes before they sleep
	marked = l.Collect()
	dev := devicePages(e.s)
	for _, p := range marked {
		if _, ok := slices.BinarySearch(dev, p); !ok {
			t.Errorf("page %#x marked: not a used ring or receive buffer", p)
		}
	}
	changed = changedPages(e.s.G, before, dev)
	e.s.StopLog()
	if e.n.BackendStats().Logging.Load() {
		t.Error("logging still on after LOG_ALL was cleared")
	}
	return marked, changed
}

func minus(a, b []uint64) []uint64 {
	var out []uint64
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			out = append(out, x)
		}
	}
	return out
}

// TestSendRARP: QEMU's SEND_RARP after a migration puts QEMU's announcement from the
// guest's MAC into the TAP.
func TestSendRARP(t *testing.T) {
	e := newKernelEnv(t, vhostusertest.Options{}, Config{})
	mac := [6]byte{0x52, 0x54, 0, 0x12, 0x34, 0x56}
	payload := binary.LittleEndian.AppendUint64(nil, 0)
	copy(payload, mac[:])
	if r := e.s.FE.Ack(19, payload); r != 0 { // VHOST_USER_SEND_RARP
		t.Fatalf("SEND_RARP ack %d", r)
	}
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		n, from, err := unix.Recvfrom(e.ps, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		f := buf[:n]
		if n >= 14 && binary.BigEndian.Uint16(f[12:]) == 0x8035 {
			want := rarpFrame(mac)
			if !bytes.Equal(f, want[:]) {
				t.Fatalf("RARP frame\n%x\nwant\n%x", f, want)
			}
			if e.n.Stats().RARPs.Load() != 1 {
				t.Errorf("RARPs %d", e.n.Stats().RARPs.Load())
			}
			return
		}
	}
	t.Fatal("no RARP reached the TAP")
}
