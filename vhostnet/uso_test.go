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

	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// UDP segmentation offload on the vhost-user port, both ways, through the front-end
// double and a real TAP: the host's kernel makes and checks the UDP GSO packets (a
// UDP_SEGMENT socket sends them, a plain UDP socket receives what the guest sent).

const (
	usoSize = 1400 // gso_size: a QUIC or WireGuard sender's datagram
	usoSegs = 40
	usoPort = 7600
)

// usoByte is byte i of a test payload.
func usoByte(i int) byte { return byte(i*7 + i>>8) }

func usoPayload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = usoByte(i)
	}
	return b
}

// udp4 is an IPv4/UDP frame with payload. gso > 0 makes it a UDP_L4 GSO frame of
// gso-byte datagrams (NEEDS_CSUM, the checksum field holding the pseudo-header sum for
// the whole length, as the kernel and tapgro's GRO engine build them); otherwise the
// checksum is complete and the header zero.
func udp4(dmac, smac net.HardwareAddr, sip, dip netip.Addr, sport, dport uint16, payload []byte, gso int) ([]byte, vnethdr.Hdr) {
	f := make([]byte, 14+20+8+len(payload))
	copy(f, dmac)
	copy(f[6:], smac)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(28+len(payload)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	copy(ip[12:16], sip.AsSlice())
	copy(ip[16:20], dip.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip[:20], 0))
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	copy(udp[8:], payload)
	ps := vnethdr.PseudoHeaderSum(unix.IPPROTO_UDP, ip[12:16], ip[16:20], 8+len(payload))
	if gso > 0 {
		binary.BigEndian.PutUint16(udp[6:], vnethdr.Fold(ps))
		return f, vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOUDPL4, HdrLen: 42,
			GSOSize: uint16(gso), CsumStart: 34, CsumOffset: 6}
	}
	c := vnethdr.Checksum(udp, ps)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	return f, vnethdr.Hdr{}
}

// requireUSO skips unless the TAP took TUN_F_USO4/6 (Linux 6.2 and later), and checks
// that tapgro then offered the USO bits.
func requireUSO(t *testing.T, e *env) {
	t.Helper()
	if e.n.probed&vnethdr.OffloadUSO != vnethdr.OffloadUSO {
		t.Skipf("the TAP refuses TUN_F_USO4/6 (kernel before 6.2): no USO to test")
	}
	off := e.n.State().Offered
	for _, b := range []uint{virtio.NetHostUSO, virtio.NetGuestUSO4, virtio.NetGuestUSO6} {
		if off&(1<<b) == 0 {
			t.Fatalf("the TAP probed USO but tapgro offers %s", virtio.String(off))
		}
	}
}

// udpGSOSend sends payload from the host's address to guestIP:usoPort with UDP_SEGMENT
// gso: one sendmsg, one UDP GSO packet in the kernel.
func (e *env) udpGSOSend(payload []byte, gso int) {
	e.t.Helper()
	e.ns.MustRun(e.t, "ip", "neigh", "replace", guestIP.String(), "lladdr", gMAC.String(), "dev", tapName, "nud", "permanent")
	if err := e.ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT, gso); err != nil {
			return err
		}
		return unix.Sendto(fd, payload, 0, &unix.SockaddrInet4{Port: usoPort, Addr: guestIP.As4()})
	}); err != nil {
		e.t.Fatalf("UDP_SEGMENT send: %v", err)
	}
}

// recvGuestUDP reaps the guest's RX ring until the UDP payload bytes to usoPort add up
// to want, and returns those frames. post chains of bufLen bytes are posted at the
// start, and each chain reaped is posted again (post 0: fill the ring).
func (e *env) recvGuestUDP(want, bufLen, post int) []vhostusertest.RXFrame {
	e.t.Helper()
	rx := e.s.RX(0)
	if post == 0 {
		post = rx.Free()
	}
	rx.PostRX(post, bufLen, 1)
	rx.KickNow()
	var out []vhostusertest.RXFrame
	got := 0
	deadline := time.Now().Add(10 * time.Second)
	for got < want {
		if time.Now().After(deadline) {
			e.t.Fatalf("guest received %d of %d UDP payload bytes in %d frames (stats %v)", got, want, len(out), e.stats())
		}
		rx.WaitCall(10 * time.Millisecond)
		fr := rx.ReapRX(e.s.HdrLen(), e.s.Has(virtio.NetMrgRxbuf))
		chains := 0
		for _, f := range fr {
			chains += f.NumBuffers
			b := f.Frame
			if len(b) < 42 || binary.BigEndian.Uint16(b[12:]) != 0x0800 || b[23] != unix.IPPROTO_UDP ||
				binary.BigEndian.Uint16(b[36:]) != usoPort {
				continue
			}
			out = append(out, f)
			got += len(b) - 42
		}
		if chains > 0 {
			rx.PostRX(chains, bufLen, 1)
			rx.KickNow()
		}
	}
	return out
}

// checkCut checks frames as the datagrams a UDP GSO packet of payload was cut into:
// usoSize bytes each in order, no GSO, DATA_VALID (the guest acked GUEST_CSUM), and
// valid IPv4 header and UDP checksums.
func checkCut(t *testing.T, frames []vhostusertest.RXFrame, payload []byte) {
	t.Helper()
	if want := (len(payload) + usoSize - 1) / usoSize; len(frames) != want {
		t.Fatalf("guest got %d frames, want %d datagrams", len(frames), want)
	}
	off := 0
	for i, f := range frames {
		var h vnethdr.Hdr
		h.Decode(f.Hdr, len(f.Hdr))
		if h.GSOType != vnethdr.GSONone || h.Flags != vnethdr.FlagDataValid {
			t.Fatalf("datagram %d: header %v, want no GSO and DATA_VALID", i, h)
		}
		ip := f.Frame[14:]
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		if tot != len(ip) || vnethdr.Checksum(ip[:20], 0) != 0 {
			t.Fatalf("datagram %d: IPv4 total length %d in %d bytes, header checksum %s", i, tot, len(ip), map[bool]string{true: "valid", false: "bad"}[vnethdr.Checksum(ip[:20], 0) == 0])
		}
		udp := ip[20:tot]
		if int(binary.BigEndian.Uint16(udp[4:])) != len(udp) {
			t.Fatalf("datagram %d: UDP length %d in %d bytes", i, binary.BigEndian.Uint16(udp[4:]), len(udp))
		}
		if c := vnethdr.Checksum(udp, vnethdr.PseudoHeaderSum(unix.IPPROTO_UDP, ip[12:16], ip[16:20], len(udp))); c != 0 {
			t.Fatalf("datagram %d: UDP checksum does not verify (%#04x)", i, c)
		}
		pay := udp[8:]
		if want := min(usoSize, len(payload)-off); len(pay) != want || !bytes.Equal(pay, payload[off:off+want]) {
			t.Fatalf("datagram %d: %d payload bytes differ from bytes %d..%d sent", i, len(pay), off, off+want)
		}
		off += len(pay)
	}
}

// TestUSOToGuest: a host UDP_SEGMENT send of 40 datagrams reaches a guest that acked
// GUEST_USO4/6 as one UDP GSO frame; a guest that did not gets 40 datagrams cut by
// tapgro (the TAP still hands the packet over whole), checksums complete — in the
// zero-copy path, in RSC mode, with the ring running out mid-packet, and for a guest
// that acked the other IP version's bit only. With --offload capping USO off, the
// kernel cuts instead and tapgro cuts nothing.
func TestUSOToGuest(t *testing.T) {
	payload := usoPayload(usoSegs * usoSize)
	cut := []struct {
		name string
		o    vhostusertest.Options
		cfg  Config
		post int // RX chains posted at a time (0: the whole ring)
	}{
		{name: "not-acked", o: vhostusertest.Options{AckMask: 1<<virtio.NetGuestUSO4 | 1<<virtio.NetGuestUSO6}},
		{name: "uso6-only", o: vhostusertest.Options{AckMask: 1 << virtio.NetGuestUSO4}},
		{name: "ring-runs-out", o: vhostusertest.Options{AckMask: 1<<virtio.NetGuestUSO4 | 1<<virtio.NetGuestUSO6}, post: 7},
		{name: "rsc-mode", o: vhostusertest.Options{AckMask: 1<<virtio.NetGuestUSO4 | 1<<virtio.NetGuestUSO6},
			cfg: Config{GRO: true, Offload: &vnethdr.Choice{Set: vnethdr.OffloadCSUM | vnethdr.OffloadUSO}}},
	}
	for _, tc := range cut {
		t.Run(tc.name, func(t *testing.T) {
			e := newKernelEnv(t, tc.o, tc.cfg)
			requireUSO(t, e)
			if got := e.tap.Offloads(); got&vnethdr.OffloadUSO != vnethdr.OffloadUSO {
				t.Fatalf("TAP offloads %s: USO must be on for a guest that takes partial checksums", got)
			}
			if tc.cfg.GRO && !e.n.rscMode {
				t.Fatalf("RSC mode is off with TAP offloads %s", e.tap.Offloads())
			}
			e.udpGSOSend(payload, usoSize)
			checkCut(t, e.recvGuestUDP(len(payload), 2048, tc.post), payload)
			st := e.n.Stats()
			if n := st.GSOSegmented.Load(); n != 1 {
				t.Errorf("GSOSegmented %d, want 1 (the kernel must hand the packet over whole)", n)
			}
			if tc.post > 0 && st.RXStalls.Load() == 0 {
				t.Errorf("no RX stall with %d chains posted at a time", tc.post)
			}
			t.Logf("stats %v, stalls %d", e.stats(), st.RXStalls.Load())
		})
	}

	t.Run("acked", func(t *testing.T) {
		e := newKernelEnv(t, vhostusertest.Options{}, Config{})
		requireUSO(t, e)
		e.udpGSOSend(payload, usoSize)
		fr := e.recvGuestUDP(len(payload), 4096, 0)
		if len(fr) != 1 {
			t.Fatalf("guest got %d frames, want the UDP GSO packet whole", len(fr))
		}
		var h vnethdr.Hdr
		h.Decode(fr[0].Hdr, len(fr[0].Hdr))
		if h.GSOType != vnethdr.GSOUDPL4 || h.GSOSize != usoSize || h.Flags&vnethdr.FlagNeedsCsum == 0 {
			t.Fatalf("header %v, want UDP_L4 GSO of %d-byte datagrams with NEEDS_CSUM", h, usoSize)
		}
		if !bytes.Equal(fr[0].Frame[42:], payload) {
			t.Fatalf("the GSO frame's payload differs from what was sent")
		}
		if n := e.n.Stats().GSOSegmented.Load(); n != 0 {
			t.Errorf("GSOSegmented %d for a guest that takes USO", n)
		}
	})

	t.Run("capped-off", func(t *testing.T) {
		e := newKernelEnv(t, vhostusertest.Options{AckMask: 1<<virtio.NetGuestUSO4 | 1<<virtio.NetGuestUSO6},
			Config{Offload: &vnethdr.Choice{Set: vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6}})
		requireUSO(t, e)
		if got := e.tap.Offloads(); got&vnethdr.OffloadUSO != 0 {
			t.Fatalf("TAP offloads %s with --offload csum,tso4,tso6", got)
		}
		e.udpGSOSend(payload, usoSize)
		fr := e.recvGuestUDP(len(payload), 2048, 0)
		if len(fr) != usoSegs {
			t.Fatalf("guest got %d frames, want %d datagrams cut by the kernel", len(fr), usoSegs)
		}
		if n := e.n.Stats().GSOSegmented.Load(); n != 0 {
			t.Errorf("GSOSegmented %d: tapgro cut although the TAP has no USO", n)
		}
	})
}

// TestUSOToTAP: a guest that acked HOST_USO sends UDP GSO frames; each reaches the TAP
// whole (the packet socket sees it at full length, byte for byte), and the host's stack
// takes it: a socket on the host's address receives every datagram intact.
func TestUSOToTAP(t *testing.T) {
	e := newKernelEnv(t, vhostusertest.Options{}, Config{})
	requireUSO(t, e)
	if !e.s.Has(virtio.NetHostUSO) {
		t.Fatalf("the double did not ack HOST_USO (acked %s)", virtio.String(e.s.Acked))
	}
	payload := usoPayload(usoSegs * usoSize)
	f, h := udp4(e.mac, gMAC, guestIP, farIP, 40000, usoPort, payload, usoSize)
	buf := make([]byte, 1<<17)
	for _, sp := range [][]int{nil, {12, 42}, {30, 100, 1000}} {
		e.send(h, f, sp, false)
		got, err := e.recvTAP(buf)
		if err != nil {
			t.Fatalf("split %v: %v (stats %v)", sp, err, e.stats())
		}
		if len(got) != len(f) || !bytes.Equal(got[42:], f[42:]) {
			t.Fatalf("split %v: TAP saw %d bytes, want the whole %d-byte frame", sp, len(got), len(f))
		}
	}
	e.waitTXDone()
	if g := e.n.Stats().TXGSO.Load(); g != 3 {
		t.Fatalf("TXGSO %d, want 3", g)
	}

	// To the host itself: the kernel segments the packet for a socket without UDP_GRO
	// (net/ipv4/udp.c udp_unexpected_gso) and checks nothing was lost or changed.
	var fd int
	if err := e.ns.Do(func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		tv := unix.Timeval{Sec: 5}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		return unix.Bind(fd, &unix.SockaddrInet4{Port: usoPort, Addr: tapPfx.Addr().As4()})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	f, h = udp4(e.mac, gMAC, guestIP, tapPfx.Addr(), 40000, usoPort, payload, usoSize)
	e.send(h, f, nil, false)
	for i := range usoSegs {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			t.Fatalf("datagram %d of %d: %v (stats %v)", i, usoSegs, err, e.stats())
		}
		if !bytes.Equal(buf[:n], payload[i*usoSize:(i+1)*usoSize]) {
			t.Fatalf("datagram %d: %d bytes differ from what the guest sent", i, n)
		}
	}
	e.waitTXDone()
}

// TestUDPGROToTAP: with --udp-gro, 40 MTU datagrams of one flow that the guest sends in
// one kick reach the TAP as fewer, larger UDP GSO packets carrying the same bytes;
// switched off at run time (SetUDPGRO), they cross one by one.
func TestUDPGROToTAP(t *testing.T) {
	e := newKernelEnv(t, vhostusertest.Options{}, Config{GRO: true, UDPGRO: true})
	requireUSO(t, e)
	if !e.n.UDPGROActive() {
		t.Fatal("UDP GRO inactive with GRO on and a TAP that takes USO")
	}
	payload := usoPayload(usoSegs * usoSize)
	buf := make([]byte, 1<<17)
	round := func() (frames int) {
		t.Helper()
		tx := e.s.TX(0)
		for i := range usoSegs {
			f, _ := udp4(e.mac, gMAC, guestIP, farIP, 40000, usoPort, payload[i*usoSize:(i+1)*usoSize], 0)
			data := append(make([]byte, e.s.HdrLen()), f...)
			tx.Publish(tx.PrepareFrame(data, nil, false))
		}
		tx.KickNow()
		var got []byte
		for len(got) < len(payload) {
			f, err := e.recvTAP(buf)
			if err != nil {
				t.Fatalf("after %d of %d bytes: %v (stats %v)", len(got), len(payload), err, e.stats())
			}
			if f[23] != unix.IPPROTO_UDP {
				continue
			}
			got = append(got, f[42:]...)
			frames++
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("the TAP's datagrams differ from what the guest sent")
		}
		e.waitTXDone()
		return frames
	}
	if n := round(); n >= usoSegs {
		t.Errorf("UDP GRO on: the TAP got %d frames for %d datagrams", n, usoSegs)
	} else {
		t.Logf("UDP GRO on: %d datagrams reached the TAP as %d frames", usoSegs, n)
	}
	if e.n.SetUDPGRO(false) {
		t.Fatal("SetUDPGRO(false) reports UDP GRO still active")
	}
	if n := round(); n != usoSegs {
		t.Errorf("UDP GRO off: the TAP got %d frames for %d datagrams", n, usoSegs)
	}
}

// TestSetOffloads: `tapgro ctl offload` on a vhost-user port changes TUNSETOFFLOAD under
// a running session, and auto gives back what the guest acked.
func TestSetOffloads(t *testing.T) {
	e := newKernelEnv(t, vhostusertest.Options{}, Config{})
	full := e.tap.Offloads()
	if got := e.n.SetOffloads(vnethdr.Choice{Set: vnethdr.OffloadCSUM | vnethdr.OffloadTSO4}); got != vnethdr.OffloadCSUM|vnethdr.OffloadTSO4 {
		t.Fatalf("SetOffloads(csum,tso4) = %s", got)
	}
	if got := e.tap.Offloads(); got != vnethdr.OffloadCSUM|vnethdr.OffloadTSO4 {
		t.Fatalf("TAP offloads %s after SetOffloads(csum,tso4)", got)
	}
	if got := e.n.SetOffloads(vnethdr.Choice{Auto: true}); got != full {
		t.Fatalf("SetOffloads(auto) = %s, want %s", got, full)
	}
	// The frames keep crossing, byte for byte.
	f := testFrame(gMAC, e.mac, 1000, 1, 9)
	if err := e.injectTAP(f); err != nil {
		t.Fatal(err)
	}
	if got := e.recvGuest(1, 4096, 1, 5*time.Second); !bytes.Equal(got[0], f) {
		t.Fatal("the frame after SetOffloads differs")
	}
}
