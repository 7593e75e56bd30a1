//go:build linux

package vhostnet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// TestTXHeadersFromOurCopy: a guest rewrites the IP protocol of its TCP GSO frames (TCP
// ↔ UDP) while tapgro handles them. Whatever it catches, every frame on the TAP passes
// ValidatePeer with the header the kernel kept for it: the headers the kernel parsed are
// the ones tapgro checked. The racing writer is seen (some frames are refused as bad
// headers), and the race runs over 100,000 frames.
func TestTXHeadersFromOurCopy(t *testing.T) {
	const frames = 100_000
	e := newKernelEnv(t, vhostusertest.Options{AckMask: 1 << virtio.NetHostTSO6, Num: 256, TXSlot: 8192}, Config{})
	ps := e.vnetSocket()
	f, h := tso4(e.mac, gMAC, 3000) // three segments of 1448
	hl := e.s.HdrLen()
	data := make([]byte, hl+len(f))
	h.Encode(data, hl)
	copy(data[hl:], f)
	tx := e.s.TX(0)

	// The racer flips byte 23 of every slot's frame (the IPv4 protocol) for as long as
	// the test sends: where it lies unsplit, and where it lies when the frame starts in
	// a second descriptor, a gap (64 bytes, vhostusertest) after the header's.
	var protos [][]byte
	for i := range tx.Num {
		a := tx.Slot(uint16(i)) + uint64(hl)
		protos = append(protos, e.s.G.At(a+23, 1), e.s.G.At(a+64+23, 1))
	}
	var stop atomic.Bool
	raced := make(chan struct{})
	go func() {
		defer close(raced)
		for v := byte(unix.IPPROTO_UDP); !stop.Load(); v ^= unix.IPPROTO_UDP ^ unix.IPPROTO_TCP {
			for _, p := range protos {
				p[0] = v
			}
		}
	}()

	// The reader checks everything the TAP took from the guest.
	var got, bad atomic.Int64
	var firstBad atomic.Value
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf := make([]byte, 1<<17)
		for {
			n, from, err := unix.Recvfrom(ps, buf, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				if stop.Load() {
					return
				}
				continue // the receive timeout: look at stop again
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			if n < vnethdr.Len+34 || binary.BigEndian.Uint16(buf[vnethdr.Len+12:]) != 0x0800 {
				continue
			}
			var kh vnethdr.Hdr
			kh.Decode(buf, vnethdr.Len)
			frame := buf[vnethdr.Len:n]
			got.Add(1)
			if err := vnethdr.ValidatePeer(frame, &kh); err != nil || frame[23] != unix.IPPROTO_TCP {
				if bad.Add(1) == 1 {
					firstBad.Store(err)
				}
			}
		}
	}()

	heads := make([]uint16, 0, 64)
	for sent := 0; sent < frames; {
		for tx.Free() < 64 {
			tx.WaitCall(10 * time.Millisecond)
			tx.ReapFunc(nil)
		}
		heads = heads[:0]
		for i := 0; i < 64 && sent < frames; i++ {
			split := []int(nil)
			if sent%2 == 1 {
				split = []int{hl, 30} // headers over two descriptors
			}
			heads = append(heads, tx.PrepareFrame(data, split, false))
			sent++
		}
		tx.Publish(heads...)
		tx.KickNow()
	}
	e.waitTXDone()
	delivered := e.n.Stats().TXFrames.Load()
	for deadline := time.Now().Add(5 * time.Second); got.Load() < int64(delivered) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stop.Store(true)
	<-raced
	<-readDone
	refused := e.n.Stats().Drops[DropTXBadHeader].Load()
	t.Logf("%d frames sent: %d reached the TAP, %d refused as bad headers; %d read back, %d of them invalid",
		frames, delivered, refused, got.Load(), bad.Load())
	if bad.Load() != 0 {
		t.Fatalf("%d frames on the TAP fail ValidatePeer (first: %v)", bad.Load(), firstBad.Load())
	}
	if refused == 0 || delivered == 0 {
		t.Fatalf("the race was not exercised: %d delivered, %d refused", delivered, refused)
	}
	if delivered+refused != frames {
		t.Fatalf("%d delivered + %d refused, want %d (stats %v)", delivered, refused, frames, e.stats())
	}
	if got.Load() < int64(delivered)/2 {
		t.Fatalf("read back only %d of %d frames", got.Load(), delivered)
	}
}

// TestTXPlainHdrLen: a frame with neither GSO nor a partial checksum reaches the TAP
// whatever hdr_len the guest wrote; tun would refuse 1..13 or more than the frame.
func TestTXPlainHdrLen(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	buf := make([]byte, 1<<17)
	for i, hdrLen := range []uint16{5, 13, 60000} {
		f := testFrame(e.mac, gMAC, 200, uint32(i), 11)
		e.send(vnethdr.Hdr{HdrLen: hdrLen}, f, nil, false)
		got, err := e.recvTAP(buf)
		if err != nil || !bytes.Equal(got, f) {
			t.Fatalf("hdr_len %d: %v (stats %v)", hdrLen, err, e.stats())
		}
	}
	if d := e.n.Stats().Drops[DropTXTAP].Load(); d != 0 {
		t.Fatalf("%d frames refused by the TAP", d)
	}
}

// TestRXSmallBuffers: with only a few small buffers posted, a small frame is delivered
// at once (it is not held back for the largest frame the TAP could hand over), a
// larger one waits for more buffers, and both arrive intact and in order.
func TestRXSmallBuffers(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	rx := e.s.RX(0)
	mrg := e.s.Has(virtio.NetMrgRxbuf)
	if !mrg {
		t.Fatal("the double did not ack MRG_RXBUF")
	}
	rx.PostRX(2, 2048, 1)
	rx.KickNow()
	small := testFrame(gMAC, e.mac, 64, 1, 12)
	large := testFrame(gMAC, e.mac, 5000, 2, 12)
	if err := e.injectTAP(small); err != nil {
		t.Fatal(err)
	}
	var got [][]byte
	reap := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); len(got) < want; {
			if time.Now().After(deadline) {
				t.Fatalf("guest has %d of %d frames (stats %v)", len(got), want, e.stats())
			}
			rx.WaitCall(10 * time.Millisecond)
			for _, fr := range rx.ReapRX(e.s.HdrLen(), mrg) {
				if len(fr.Frame) >= 14 && binary.BigEndian.Uint16(fr.Frame[12:]) == etherTest {
					got = append(got, fr.Frame)
				}
			}
		}
	}
	reap(1) // before the fix the frame waited for 65,605 bytes of buffers
	if err := e.injectTAP(large); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); e.n.Stats().RXStalls.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no stall for a frame larger than the buffers (stats %v)", e.stats())
		}
	}
	rx.PostRX(4, 2048, 1)
	rx.KickNow()
	reap(2)
	if !bytes.Equal(got[0], small) || !bytes.Equal(got[1], large) {
		t.Fatalf("frames differ: %d and %d bytes", len(got[0]), len(got[1]))
	}
}

// TestServeRefusesSecond: a second front-end on the socket while a session runs is
// closed (after the grace for a restart) and counted, instead of waiting in the
// backlog; the running session is unaffected and the next front-end is served.
func TestServeRefusesSecond(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	path, cancel, done := e.serve()
	defer func() {
		cancel()
		<-done
	}()
	s1 := vhostusertest.Dial(t, path, vhostusertest.Options{})
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var req [12]byte
	binary.LittleEndian.PutUint32(req[0:], vhostuser.ReqGetFeatures)
	binary.LittleEndian.PutUint32(req[4:], 1)
	c.Write(req[:])
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(req[:])
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("second front-end left waiting")
	}
	if n != 0 || err == nil {
		t.Fatalf("second front-end: read %d bytes, %v; want the connection closed", n, err)
	}
	if r := e.n.BackendStats().Refused.Load(); r != 1 {
		t.Fatalf("Refused = %d", r)
	}
	s1.FE.Get(vhostuser.ReqGetFeatures) // the first session still answers
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<17)
	s2 := vhostusertest.Dial(t, path, vhostusertest.Options{ConnectWait: time.Second})
	f := testFrame(e.mac, gMAC, 300, 1, 9)
	s2.TX(0).SendFrame(append(make([]byte, s2.HdrLen()), f...), nil, false)
	s2.TX(0).KickNow()
	if got, err := e.recvTAP(buf); err != nil || !bytes.Equal(got, f) {
		t.Fatalf("next session: %v", err)
	}
	s2.Close()
}

// guestMappings counts the mappings of the double's guest RAM in this process, the
// back-end's included.
func guestMappings(t *testing.T) int {
	m, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(m, []byte("memfd:guest-ram"))
}

// TestWorkerFault: the front-end truncates guest RAM under the TX buffers while the
// real workers run. The TX worker's copy faults; the fault is recovered and counted, the
// session ends with a FaultError and unmaps everything, the daemon goes on, and the
// next session moves frames both ways.
func TestWorkerFault(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	buf := make([]byte, 1<<17)
	f := testFrame(e.mac, gMAC, 300, 1, 13)
	e.send(vnethdr.Hdr{}, f, nil, false)
	if got, err := e.recvTAP(buf); err != nil || !bytes.Equal(got, f) {
		t.Fatalf("before the truncate: %v", err)
	}
	e.waitTXDone()
	tx := e.s.TX(0)
	hl := e.s.HdrLen()
	head := tx.PrepareFrame(append(make([]byte, hl), f...), nil, false)
	if err := unix.Ftruncate(e.s.G.FD, int64(tx.Slot(0))); err != nil { // region B's offsets are its GPAs
		t.Fatal(err)
	}
	tx.Publish(head)
	tx.KickNow()
	// The worker faults and ends the session; closing before it does would end the
	// session cleanly instead.
	for deadline := time.Now().Add(5 * time.Second); e.n.BackendStats().Rejected[vhostuser.RejectFault].Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no fault counted")
		}
	}
	err := e.s.Close()
	var fe *vhostuser.FaultError
	if !errors.As(err, &fe) || fe.Ring != 1 {
		t.Fatalf("session ended with %v, want a fault on ring 1", err)
	}
	t.Logf("session: %v", err)
	if n := e.n.BackendStats().Rejected[vhostuser.RejectFault].Load(); n != 1 {
		t.Fatalf("fault counted %d times", n)
	}
	if m := guestMappings(t); m != 1 {
		t.Fatalf("%d mappings of guest RAM left, want only the double's own", m)
	}
	e.s = vhostusertest.Start(t, e.n.ServeConn, vhostusertest.Options{})
	f2 := testFrame(e.mac, gMAC, 400, 2, 13)
	e.send(vnethdr.Hdr{}, f2, []int{20}, false)
	if got, err := e.recvTAP(buf); err != nil || !bytes.Equal(got, f2) {
		t.Fatalf("next session, TX: %v", err)
	}
	in := testFrame(gMAC, e.mac, 500, 3, 13)
	if err := e.injectTAP(in); err != nil {
		t.Fatal(err)
	}
	if got := e.recvGuest(1, 4096, 1, 5*time.Second); !bytes.Equal(got[0], in) {
		t.Fatal("next session, RX: frame differs")
	}
}
