//go:build linux

package integration

import (
	"bytes"
	"encoding/binary"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
	"tapgro/sockport"
	"tapgro/vnethdr"
)

// TestPeerCraftedHeadersKillNothing: a vnet-hdr=on peer sends GSO records whose
// virtio_net_hdr the kernel refuses (hdr_len past the frame, gso_size 0xffff; TCPv4,
// TCPv6, USO over IPv4 and IPv6). A real tapgro drops them as malformed before they
// reach its TAP, no offload is killed (tapgro_offload_killed stays 0, the TAP never
// answers EINVAL), and the next connection's GSO frames still reach the TAP whole: the
// TAP netdev counts one received packet of the full length per frame.
//
// The test is the peer itself: it speaks the vnet-hdr=on hello over tapgro's UNIX
// socket with sockport, as another tapgro would.
func TestPeerCraftedHeadersKillNothing(t *testing.T) {
	netnstest.RequirePriv(t)
	ns := netnstest.New(t, "peerhdr")
	const dev, maddr = "tgpeerhdr0", "127.0.0.1:9141"
	sock := filepath.Join(t.TempDir(), "peerhdr.sock")
	p := startTapgro(t, ns, "tapgro", "--tap", dev, "--mtu", "1500",
		"--addr", "198.18.0.1/24", "--addr", "fd00:198:18::1/64",
		"--netdev", "stream,server=on,addr.type=unix,addr.path="+sock+",vnet-hdr=on,shm=off",
		"--metrics-addr", maddr, "--log-level", "debug")
	p.waitLog(readyRe, 10*time.Second)
	uso := kernelTakesUSO(t, p)

	const (
		malformed   = `tapgro_dropped_total{direction="port_to_tap",reason="malformed"}`
		passthrough = `tapgro_gso_passthrough_total{direction="port_to_tap"}`
		fallback    = `tapgro_gro_gso_write_fallback_total`
		einval      = `tapgro_tap_write_errors_total{errno="EINVAL"}`
	)
	checkNothingKilled := func(when string) map[string]float64 {
		t.Helper()
		m := scrape(t, ns, maddr)
		for _, o := range []string{"csum", "tso4", "tso6", "tso_ecn", "uso"} {
			k := `tapgro_offload_killed{offload="` + o + `"}`
			v, ok := m[k]
			if !ok {
				t.Fatalf("%s: metric %s missing", when, k)
			}
			if v != 0 {
				t.Errorf("%s: %s = %v", when, k, v)
			}
		}
		if m[einval] != 0 || m[fallback] != 0 {
			t.Errorf("%s: the TAP refused %v writes, %v GSO writes fell back to segments", when, m[einval], m[fallback])
		}
		return m
	}
	before := checkNothingKilled("at start")

	// Connection 1: the crafted records.
	crafted := phCraftedRecords()
	c1 := phConnect(t, p, sock, 1)
	for _, r := range crafted {
		if _, err := c1.WriteBatch([][]byte{r}); err != nil {
			t.Fatal(err)
		}
	}
	want := before[malformed] + float64(len(crafted))
	deadline := time.Now().Add(10 * time.Second)
	for scrape(t, ns, maddr)[malformed] < want && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	mid := checkNothingKilled("after the crafted records")
	if mid[malformed] != want {
		t.Errorf("%s = %v after %d crafted records, want %v", malformed, mid[malformed], len(crafted), want)
	}
	c1.Close()

	// Connection 2: valid GSO frames, each to reach the TAP as one packet.
	valid := [][]byte{
		phGSO(false, false, 20000, 1448),
		phGSO(true, false, 20000, 1428),
	}
	if uso {
		valid = append(valid, phGSO(false, true, 6000, 1400), phGSO(true, true, 6000, 1400))
	} else {
		t.Log("this kernel's TAP does not take USO: checking TCP GSO only")
	}
	rxPackets, rxBytes := tapRx(t, ns, dev)
	c2 := phConnect(t, p, sock, 2)
	var frameBytes float64
	for _, r := range valid {
		if _, err := c2.WriteBatch([][]byte{r}); err != nil {
			t.Fatal(err)
		}
		frameBytes += float64(len(r) - sockport.VnetStreamHdrLen)
	}
	wantPass := mid[passthrough] + float64(len(valid))
	deadline = time.Now().Add(10 * time.Second)
	for scrape(t, ns, maddr)[passthrough] < wantPass && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	end := checkNothingKilled("after the valid frames")
	if end[passthrough] != wantPass {
		t.Errorf("%s = %v, want %v: the next connection's GSO frames did not pass whole", passthrough, end[passthrough], wantPass)
	}
	if end[malformed] != want {
		t.Errorf("%s = %v after the valid frames, want it unchanged at %v", malformed, end[malformed], want)
	}
	// The kernel's view: one packet per GSO frame, of the frame's full length.
	var gotPackets, gotBytes float64
	deadline = time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		p2, b2 := tapRx(t, ns, dev)
		gotPackets, gotBytes = p2-rxPackets, b2-rxBytes
		if gotPackets >= float64(len(valid)) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if gotPackets != float64(len(valid)) || gotBytes != frameBytes {
		t.Errorf("the TAP received %v packets of %v bytes, want %d GSO packets of %v bytes", gotPackets, gotBytes, len(valid), frameBytes)
	}
	c2.Close()
}

// kernelTakesUSO reads from tapgro's start-up log whether the TAP accepts UDP_L4 GSO
// writes (a USO probe succeeded, Linux 6.2+).
func kernelTakesUSO(t *testing.T, p *proc) bool {
	t.Helper()
	m := regexp.MustCompile(`probed="?([a-z0-9_,]+)"?`).FindStringSubmatch(p.out.String())
	return m != nil && strings.Contains(m[1], "uso")
}

// phConnect connects to tapgro's vnet-hdr=on socket as a peer tapgro (hello, no shared
// memory) and waits until tapgro has logged its n-th connection.
func phConnect(t *testing.T, p *proc, sock string, n int) *sockport.StreamPort {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	port, err := sockport.NewVnetStreamPort(c, nil, nil, sockport.VnetStreamAccepts, false, 5*time.Second)
	if err != nil {
		c.Close()
		t.Fatalf("vnet-hdr=on hello: %v", err)
	}
	t.Cleanup(func() { port.Close() })
	re := regexp.MustCompile(`port connected`)
	deadline := time.Now().Add(10 * time.Second)
	for len(re.FindAllString(p.out.String(), -1)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("tapgro did not log connection %d:\n%s", n, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return port
}

// tapRx reads the TAP netdev's receive counters: what tapgro wrote to it and the kernel
// took, one packet per write.
func tapRx(t *testing.T, ns *netnstest.NS, dev string) (packets, bytes float64) {
	t.Helper()
	read := func(name string) float64 {
		out := ns.MustRun(t, "cat", "/sys/class/net/"+dev+"/statistics/"+name)
		v, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", name, out, err)
		}
		return v
	}
	return read("rx_packets"), read("rx_bytes")
}

// phGSO is a vnet-hdr=on record carrying one GSO frame as a Linux TAP emits it
// (NEEDS_CSUM, csum_start at the L4 header, the L4 checksum field holding the
// pseudo-header sum): TCP or UDP_L4 over IPv4 (198.18.0.2 → 198.18.0.1) or IPv6
// (fd00:198:18::2 → ::1), payload bytes cut at mss. It is addressed to a MAC that is not
// the TAP's, so the stack drops it after the TAP took it.
func phGSO(v6, udp bool, payload, mss int) []byte {
	l3Len, l4Len, proto, csumOff := 20, 20, uint8(unix.IPPROTO_TCP), 16
	gsoType := uint8(vnethdr.GSOTCPv4)
	if v6 {
		l3Len, gsoType = 40, vnethdr.GSOTCPv6
	}
	if udp {
		l4Len, proto, csumOff, gsoType = 8, unix.IPPROTO_UDP, 6, vnethdr.GSOUDPL4
	}
	const hl, l3 = sockport.VnetStreamHdrLen, 14
	l4 := l3 + l3Len
	rec := make([]byte, hl+l4+l4Len+payload)
	h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: gsoType, HdrLen: uint16(l4 + l4Len),
		GSOSize: uint16(mss), CsumStart: uint16(l4), CsumOffset: uint16(csumOff)}
	h.Encode(rec, hl)
	f := rec[hl:]
	copy(f[0:6], []byte{0x02, 0x70, 0x68, 0, 0, 1})
	copy(f[6:12], []byte{0x02, 0x70, 0x68, 0, 0, 2})
	var src, dst []byte
	if v6 {
		binary.BigEndian.PutUint16(f[12:], 0x86dd)
		ip := f[l3:l4]
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(len(f)-l4))
		ip[6], ip[7] = proto, 64
		src, dst = ip[8:24], ip[24:40]
		copy(src, net.ParseIP("fd00:198:18::2").To16())
		copy(dst, net.ParseIP("fd00:198:18::1").To16())
	} else {
		binary.BigEndian.PutUint16(f[12:], 0x0800)
		ip := f[l3:l4]
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(len(f)-l3))
		binary.BigEndian.PutUint16(ip[6:], 0x4000)
		ip[8], ip[9] = 64, proto
		src, dst = ip[12:16], ip[16:20]
		copy(src, []byte{198, 18, 0, 2})
		copy(dst, []byte{198, 18, 0, 1})
		binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip, 0))
	}
	l4h := f[l4:]
	binary.BigEndian.PutUint16(l4h[0:], 7401)
	binary.BigEndian.PutUint16(l4h[2:], 7402)
	if udp {
		binary.BigEndian.PutUint16(l4h[4:], uint16(len(l4h)))
	} else {
		binary.BigEndian.PutUint32(l4h[4:], 1)
		binary.BigEndian.PutUint32(l4h[8:], 1)
		l4h[12], l4h[13] = 5<<4, 0x10
		binary.BigEndian.PutUint16(l4h[14:], 512)
	}
	for i := range l4h[l4Len:] {
		l4h[l4Len+i] = byte(i*7 + i>>8)
	}
	binary.BigEndian.PutUint16(l4h[csumOff:], vnethdr.Fold(vnethdr.PseudoHeaderSum(proto, src, dst, len(l4h))))
	return rec
}

// phCraftedRecords are GSO records whose frames are fine but whose header the kernel
// refuses with EINVAL (drivers/net/tun.c tun_get_user: hdr_len past the frame;
// include/linux/virtio_net.h virtio_net_hdr_to_skb: gso_size GSO_BY_FRAGS).
func phCraftedRecords() [][]byte {
	var out [][]byte
	for _, k := range []struct{ v6, udp bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		for _, mod := range []func(h *vnethdr.Hdr, frameLen int){
			func(h *vnethdr.Hdr, n int) { h.HdrLen = uint16(n + 1) },
			func(h *vnethdr.Hdr, _ int) { h.GSOSize = 0xffff },
		} {
			r := bytes.Clone(phGSO(k.v6, k.udp, 5000, 1400))
			var h vnethdr.Hdr
			h.Decode(r, sockport.VnetStreamHdrLen)
			mod(&h, len(r)-sockport.VnetStreamHdrLen)
			h.Encode(r, sockport.VnetStreamHdrLen)
			out = append(out, r)
		}
	}
	return out
}
