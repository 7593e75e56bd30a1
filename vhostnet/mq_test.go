//go:build linux

package vhostnet

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
	"tapgro/kvlog"
	"tapgro/tapdev"
	"tapgro/vhostuser"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

const mqTap = "tgvnmq0"

// newMQEnv is newEnv with a multiqueue TAP of pairs queues, one per queue pair.
func newMQEnv(t *testing.T, pairs int) *env {
	t.Helper()
	ns := netnstest.New(t, "vhostmq")
	ns.MustRun(t, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	e := &env{t: t, ns: ns, ps: -1}
	var qs []*tapdev.Device
	if err := ns.Do(func() (err error) {
		qs, err = tapdev.OpenQueues(tapdev.Config{Name: mqTap}, pairs)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, q := range qs {
			q.Close()
		}
	})
	e.tap = qs[0]
	e.attach(mqTap)
	queues := make([]TAP, len(qs))
	for i, q := range qs {
		queues[i] = q
	}
	n, err := New(Config{TAPs: queues, Log: kvlog.Printf(t.Logf)})
	if err != nil {
		t.Fatal(err)
	}
	e.n = n
	if got := n.State().Attached; len(got) != pairs || !got[0] || (pairs > 1 && got[1]) {
		t.Fatalf("attached before a session %v, want only queue 0", got)
	}
	e.s = vhostusertest.Start(t, n.ServeConn, vhostusertest.Options{Pairs: pairs, MemSize: uint64(pairs) * (80 << 20)})
	return e
}

// tapQueues is the TAP's attached and detached queue counts (IFLA_TUN_NUM_QUEUES,
// IFLA_TUN_NUM_DISABLED_QUEUES).
func (e *env) tapQueues() (attached, detached int) {
	e.t.Helper()
	var link netlink.Link
	if err := e.ns.Do(func() (err error) { link, err = netlink.LinkByName(mqTap); return err }); err != nil {
		e.t.Fatal(err)
	}
	tt := link.(*netlink.Tuntap)
	return tt.Queues, tt.DisabledQueues
}

// udpFrame is an IPv4/UDP frame from the TAP's address to the guest's, source port
// sport: one flow per port, which the TAP hashes onto its queues
// (drivers/net/tun.c tun_automq_select_queue).
func udpFrame(dst, src net.HardwareAddr, sport uint16, n int) []byte {
	f := make([]byte, n)
	copy(f, dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(n-14))
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	s, d := tapPfx.Addr().As4(), guestIP.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip, 0))
	udp := f[34:]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], uint16(n-34))
	for i := 42; i < n; i++ {
		f[i] = byte(int(sport) + i)
	}
	return f
}

// isOurUDP reports the source port of one of udpFrame's frames.
func isOurUDP(f []byte) (uint16, bool) {
	if len(f) < 42 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != unix.IPPROTO_UDP ||
		binary.BigEndian.Uint16(f[36:]) != 9 {
		return 0, false
	}
	return binary.BigEndian.Uint16(f[34:]), true
}

// rxFlows injects one frame per source port in ports and collects them from the RX
// rings of every pair until all have come; it returns which pair each arrived on,
// checking each frame whole.
func (e *env) rxFlows(pairs int, ports []uint16) map[uint16]int {
	e.t.Helper()
	const size = 300
	for p := 0; p < pairs; p++ {
		rx := e.s.RX(p)
		if k := rx.Free(); k > 0 {
			rx.PostRX(k, 4096, 1)
			rx.KickNow()
		}
	}
	want := map[uint16][]byte{}
	for _, sp := range ports {
		f := udpFrame(gMAC, e.mac, sp, size)
		want[sp] = f
		if err := e.injectTAP(f); err != nil {
			e.t.Fatal(err)
		}
	}
	got := map[uint16]int{}
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < len(ports) {
		if time.Now().After(deadline) {
			e.t.Fatalf("guest received %d of %d flows (%v; stats %v)", len(got), len(ports), got, e.stats())
		}
		for p := 0; p < pairs; p++ {
			rx := e.s.RX(p)
			rx.WaitCall(time.Millisecond)
			fr := rx.ReapRX(e.s.HdrLen(), true)
			for _, f := range fr {
				sp, ok := isOurUDP(f.Frame)
				if !ok {
					continue
				}
				if !bytes.Equal(f.Frame, want[sp]) {
					e.t.Fatalf("pair %d: flow %d arrived changed", p, sp)
				}
				if q, dup := got[sp]; dup {
					e.t.Fatalf("flow %d arrived twice (pairs %d, %d)", sp, q, p)
				}
				got[sp] = p
			}
			if len(fr) > 0 {
				rx.PostRX(rx.Free(), 4096, 1)
				rx.KickNow()
			}
		}
	}
	return got
}

func perPair(got map[uint16]int, pairs int) []int {
	c := make([]int, pairs)
	for _, p := range got {
		c[p]++
	}
	return c
}

func ports(from, n int) []uint16 {
	var out []uint16
	for i := range n {
		out = append(out, uint16(from+i))
	}
	return out
}

// TestMultiqueue: two queue pairs on a two-queue TAP. Frames go both ways on both
// pairs, each pair's TX on its own TAP queue, and the TAP's flows spread over both RX
// rings; SET_VRING_ENABLE 0 on pair 1 detaches its TAP queue, so everything the host
// sends arrives on pair 0; enabling it again attaches it.
func TestMultiqueue(t *testing.T) {
	const pairs = 2
	e := newMQEnv(t, pairs)
	if !e.s.Has(virtio.NetMQ) {
		t.Fatalf("MQ not offered/acked: offered %#x", e.s.Offered)
	}
	if a := e.n.State().Attached; !a[0] || !a[1] {
		t.Fatalf("attached %v with both pairs enabled", a)
	}
	if a, d := e.tapQueues(); a != 2 || d != 0 {
		t.Fatalf("TAP queues %d attached, %d detached; want 2, 0", a, d)
	}
	if e.n.HdrLen() != 12 || e.n.pairs[1].tap.VnetHdrLen() != 12 {
		t.Fatalf("header length %d (queue 1: %d), want 12", e.n.HdrLen(), e.n.pairs[1].tap.VnetHdrLen())
	}

	// Guest → TAP on each pair.
	buf := make([]byte, 1<<17)
	const perTX = 20
	hl := e.s.HdrLen()
	for p := 0; p < pairs; p++ {
		tx := e.s.TX(p)
		for i := range perTX {
			f := testFrame(e.mac, gMAC, 100+i*37, uint32(p*1000+i), 7)
			data := make([]byte, hl+len(f))
			copy(data[hl:], f)
			tx.SendFrame(data, nil, false)
			tx.KickNow()
			got, err := e.recvTAP(buf)
			if err != nil {
				t.Fatalf("pair %d frame %d: %v (stats %v)", p, i, err, e.stats())
			}
			if !bytes.Equal(got, f) {
				t.Fatalf("pair %d frame %d: TAP got %d bytes, differing", p, i, len(got))
			}
		}
	}
	for p := 0; p < pairs; p++ {
		// A chain is used after its frame is counted: wait for all of them.
		tx := e.s.TX(p)
		for deadline := time.Now().Add(10 * time.Second); tx.Outstanding() > 0; {
			if time.Now().After(deadline) {
				t.Fatalf("pair %d: %d TX chains never used", p, tx.Outstanding())
			}
			tx.WaitCall(10 * time.Millisecond)
			tx.ReapFunc(nil)
		}
		q := &e.n.Stats().Queues[p]
		if q.TXFrames.Load() != perTX {
			t.Fatalf("pair %d TX frames %d, want %d", p, q.TXFrames.Load(), perTX)
		}
	}

	// TAP → guest: 64 flows over both queues.
	got := e.rxFlows(pairs, ports(1000, 64))
	c := perPair(got, pairs)
	if c[0] == 0 || c[1] == 0 {
		t.Fatalf("64 flows landed %v on the pairs; the TAP should spread them", c)
	}
	for p := 0; p < pairs; p++ {
		if q := &e.n.Stats().Queues[p]; q.RXFrames.Load() != uint64(c[p]) || q.RXBytes.Load() != uint64(300*c[p]) {
			t.Fatalf("pair %d RX counters %d frames %d bytes, want %d, %d", p, q.RXFrames.Load(), q.RXBytes.Load(), c[p], 300*c[p])
		}
	}

	// The guest goes down to one pair (ethtool -L combined 1): QEMU disables pair 1's
	// rings. Its TAP queue is detached and every flow comes in on pair 0.
	rx1Before := e.n.Stats().Queues[1].RXFrames.Load()
	for _, r := range []uint32{2, 3} {
		e.s.FE.Send(vhostuser.ReqSetVringEnable, 1, vhostusertest.State(r, 0))
	}
	e.s.FE.Get(vhostuser.ReqGetFeatures) // the session has handled both
	if a := e.n.State().Attached; !a[0] || a[1] {
		t.Fatalf("attached %v after disabling pair 1", a)
	}
	if a, d := e.tapQueues(); a != 1 || d != 1 {
		t.Fatalf("TAP queues %d attached, %d detached; want 1, 1", a, d)
	}
	got = e.rxFlows(pairs, ports(2000, 64))
	if c := perPair(got, pairs); c[1] != 0 {
		t.Fatalf("with pair 1 disabled flows landed %v", c)
	}
	if n := e.n.Stats().Queues[1].RXFrames.Load(); n != rx1Before {
		t.Fatalf("pair 1 RX frames went %d → %d while disabled", rx1Before, n)
	}

	// Back to two pairs.
	for _, r := range []uint32{2, 3} {
		e.s.FE.Send(vhostuser.ReqSetVringEnable, 1, vhostusertest.State(r, 1))
	}
	e.s.FE.Get(vhostuser.ReqGetFeatures)
	if a := e.n.State().Attached; !a[0] || !a[1] {
		t.Fatalf("attached %v after enabling pair 1 again", a)
	}
	if a, d := e.tapQueues(); a != 2 || d != 0 {
		t.Fatalf("TAP queues %d attached, %d detached; want 2, 0", a, d)
	}
	got = e.rxFlows(pairs, ports(3000, 64))
	if c := perPair(got, pairs); c[0] == 0 || c[1] == 0 {
		t.Fatalf("with pair 1 enabled again flows landed %v", c)
	}

	// The session's end puts the queues back: only queue 0 attached.
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	if a := e.n.State().Attached; !a[0] || a[1] {
		t.Fatalf("attached %v after the session", a)
	}
	if a, d := e.tapQueues(); a != 1 || d != 1 {
		t.Fatalf("TAP queues after the session %d attached, %d detached; want 1, 1", a, d)
	}
}
