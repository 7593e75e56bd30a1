package tapdev

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
	"tapgro/vnethdr"
)

// Addresses (198.18.0.0/15, the RFC 2544 benchmarking range, so tests never clash with a
// real network).
var (
	tapIP   = netip.MustParseAddr("198.18.0.1")
	peerIP  = netip.MustParseAddr("198.18.0.2")
	tapPfx  = netip.MustParsePrefix("198.18.0.1/24")
	tap6Pfx = netip.MustParsePrefix("fd00:198:18::1/64")
	peerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
)

// hangGuard bounds blocking reads so a broken kernel path fails the test instead of
// hanging it; no assertion depends on it.
const hangGuard = 10 * time.Second

const bufSize = 65536 + 4096

func openIn(t testing.TB, ns *netnstest.NS, cfg Config) *Device {
	t.Helper()
	var d *Device
	if err := ns.Do(func() (err error) { d, err = Open(cfg); return err }); err != nil {
		t.Fatalf("Open(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func vnetHdrSz(t testing.TB, d *Device) int {
	t.Helper()
	var sz int
	var ierr error
	if err := d.rc.Control(func(fd uintptr) { sz, ierr = unix.IoctlGetInt(int(fd), unix.TUNGETVNETHDRSZ) }); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatalf("TUNGETVNETHDRSZ: %v", ierr)
	}
	return sz
}

func kernelAtLeast(t testing.TB, major, minor int) bool {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		t.Fatalf("cannot parse kernel release %q", rel)
	}
	maj, err1 := strconv.Atoi(parts[0])
	min, err2 := strconv.Atoi(strings.TrimFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		t.Fatalf("cannot parse kernel release %q", rel)
	}
	return maj > major || maj == major && min >= minor
}

func TestOpenRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Name: ""},
		{Name: "averyveryverylongname"},
		{Name: "tap%d"},
		{Name: "tap0", VnetHdrLen: 11},
		{Name: "tap0", VnetHdrLen: 20},
	} {
		if d, err := Open(cfg); err == nil {
			d.Close()
			t.Errorf("Open(%+v) succeeded", cfg)
		}
	}
}

func TestOpenVnetHdrLen(t *testing.T) {
	for _, tc := range []struct{ cfg, want int }{{0, 10}, {10, 10}, {12, 12}} {
		t.Run(fmt.Sprint(tc.cfg), func(t *testing.T) {
			ns := netnstest.New(t, "hdrlen")
			d := openIn(t, ns, Config{Name: "tgtap0", VnetHdrLen: tc.cfg})
			if d.Name() != "tgtap0" || d.VnetHdrLen() != tc.want {
				t.Fatalf("Name, VnetHdrLen = %q, %d; want tgtap0, %d", d.Name(), d.VnetHdrLen(), tc.want)
			}
			if got := vnetHdrSz(t, d); got != tc.want {
				t.Fatalf("TUNGETVNETHDRSZ = %d, want %d", got, tc.want)
			}
			out := string(ns.MustRun(t, "ip", "-d", "link", "show", "tgtap0"))
			if !strings.Contains(out, "tun type tap pi off vnet_hdr on") {
				t.Fatalf("ip -d link: %s", out)
			}
			if d.Offloads() != 0 {
				t.Fatalf("fresh device Offloads() = %s", d.Offloads())
			}
		})
	}
}

// A persistent TAP keeps its vnet header size; Open must set it every time.
func TestVnetHdrSizePersistsAndIsReset(t *testing.T) {
	ns := netnstest.New(t, "persist")
	ns.MustRun(t, "ip", "tuntap", "add", "dev", "tgp", "mode", "tap", "vnet_hdr")
	d := openIn(t, ns, Config{Name: "tgp", VnetHdrLen: 12})
	d.Close()
	d = openIn(t, ns, Config{Name: "tgp"})
	if got := vnetHdrSz(t, d); got != 10 {
		t.Fatalf("TUNGETVNETHDRSZ after reopening with 10 = %d", got)
	}
}

func TestProbeOffloads(t *testing.T) {
	ns := netnstest.New(t, "probe")
	d := openIn(t, ns, Config{Name: "tgtap0"})
	got := d.ProbeOffloads()
	want := vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN
	if kernelAtLeast(t, 6, 2) {
		want |= vnethdr.OffloadUSO
	}
	if got&want != want {
		t.Fatalf("ProbeOffloads() = %s, want at least %s", got, want)
	}
	if d.Offloads() != 0 {
		t.Fatalf("Offloads() after probe = %s, want none (restored)", d.Offloads())
	}
	// Restored in the kernel too, not just in our bookkeeping.
	checkEthtool(t, ns, "tgtap0", 0)
	if again := d.ProbeOffloads(); again != got {
		t.Fatalf("cached probe %s != first probe %s", again, got)
	}
}

// ethtoolFeatures parses `ethtool -k` output into feature -> "on"/"off".
func ethtoolFeatures(out string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if f := strings.Fields(v); len(f) > 0 {
			m[k] = f[0]
		}
	}
	return m
}

// checkEthtool asserts that the TAP's netdev features mirror the TUN_F_* mask
// (drivers/net/tun.c tun_net_fix_features).
func checkEthtool(t *testing.T, ns *netnstest.NS, name string, set vnethdr.Offloads) {
	t.Helper()
	feats := ethtoolFeatures(string(ns.MustRun(t, "ethtool", "-k", name)))
	for _, f := range []struct {
		feature string
		bit     vnethdr.Offloads
	}{
		{"tx-checksum-ip-generic", vnethdr.OffloadCSUM},
		{"tx-checksumming", vnethdr.OffloadCSUM},
		{"tx-tcp-segmentation", vnethdr.OffloadTSO4},
		{"tx-tcp6-segmentation", vnethdr.OffloadTSO6},
		{"tx-tcp-ecn-segmentation", vnethdr.OffloadTSOECN},
		{"tx-udp-segmentation", vnethdr.OffloadUSO},
	} {
		want := "off"
		if set&f.bit == f.bit {
			want = "on"
		}
		got, ok := feats[f.feature]
		if !ok {
			t.Errorf("ethtool -k %s: no %q line", name, f.feature)
			continue
		}
		if got != want {
			t.Errorf("ethtool -k %s: %s is %s, want %s (offloads %s)", name, f.feature, got, want, set)
		}
	}
	tso := "off"
	if set&(vnethdr.OffloadTSO4|vnethdr.OffloadTSO6) != 0 {
		tso = "on"
	}
	if got := feats["tcp-segmentation-offload"]; got != tso {
		t.Errorf("ethtool -k %s: tcp-segmentation-offload is %s, want %s (offloads %s)", name, got, tso, set)
	}
}

func TestSetOffloadsEthtool(t *testing.T) {
	ns := netnstest.New(t, "ethtool")
	d := openIn(t, ns, Config{Name: "tgtap0"})
	probed := d.ProbeOffloads()
	const (
		csum = vnethdr.OffloadCSUM
		tso  = vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6
	)
	for _, tc := range []struct {
		name string
		want vnethdr.Offloads
		set  vnethdr.Offloads
	}{
		{"csum tso", csum | tso, csum | tso},
		{"none", 0, 0},
		{"csum", csum, csum},
		{"tso4 without csum", vnethdr.OffloadTSO4, 0},
		{"tso4", csum | vnethdr.OffloadTSO4, csum | vnethdr.OffloadTSO4},
		{"ecn without tso", csum | vnethdr.OffloadTSOECN, csum},
		{"half uso", csum | vnethdr.OffloadUSO4, csum},
		{"all", 0x7f, probed},
		{"back to none", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := d.SetOffloads(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.set || d.Offloads() != tc.set {
				t.Fatalf("SetOffloads(%s) = %s, Offloads() = %s; want %s", tc.want, got, d.Offloads(), tc.set)
			}
			checkEthtool(t, ns, "tgtap0", got)
		})
	}
}

func TestAttachExisting(t *testing.T) {
	ns := netnstest.New(t, "attach")
	ns.MustRun(t, "ip", "tuntap", "add", "dev", "tgex", "mode", "tap", "vnet_hdr")
	d := openIn(t, ns, Config{Name: "tgex"})
	if d.Name() != "tgex" {
		t.Fatalf("Name() = %q", d.Name())
	}
	// A single-queue TAP has one fd: a second Open says so.
	err := ns.Do(func() error {
		d2, err := Open(Config{Name: "tgex"})
		if err == nil {
			d2.Close()
		}
		return err
	})
	if !errors.Is(err, unix.EBUSY) || !strings.Contains(err.Error(), "already attached") {
		t.Fatalf("second Open of single-queue tap: %v, want EBUSY explained", err)
	}

	ns.MustRun(t, "ip", "tuntap", "add", "dev", "tgmq", "mode", "tap", "vnet_hdr", "multi_queue")
	q0 := openIn(t, ns, Config{Name: "tgmq", MultiQueue: true})
	q1 := openIn(t, ns, Config{Name: "tgmq", MultiQueue: true, VnetHdrLen: 12})
	if q0.Name() != "tgmq" || q1.Name() != "tgmq" {
		t.Fatalf("queue names %q %q", q0.Name(), q1.Name())
	}
	var link netlink.Link
	if err := ns.Do(func() (err error) { link, err = netlink.LinkByName("tgmq"); return err }); err != nil {
		t.Fatal(err)
	}
	if q := link.(*netlink.Tuntap).Queues; q != 2 {
		t.Fatalf("tgmq has %d queues attached, want 2", q)
	}
}

func TestRefuseWithoutVnetHdr(t *testing.T) {
	ns := netnstest.New(t, "novnet")
	ns.MustRun(t, "ip", "tuntap", "add", "dev", "tgplain", "mode", "tap")
	err := ns.Do(func() error {
		d, err := Open(Config{Name: "tgplain"})
		if err == nil {
			d.Close()
		}
		return err
	})
	want := `tap "tgplain" exists without vnet_hdr; recreate it with: ip tuntap del dev tgplain mode tap && ip tuntap add dev tgplain mode tap vnet_hdr`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Open: %v\nwant an error containing %q", err, want)
	}
	// Refusing must not have attached: attaching would have rewritten the flags.
	if out := string(ns.MustRun(t, "ip", "-d", "link", "show", "tgplain")); strings.Contains(out, "vnet_hdr on") {
		t.Fatalf("device flags changed by a refused Open: %s", out)
	}

	ns.MustRun(t, "ip", "tuntap", "add", "dev", "tgtun", "mode", "tun", "vnet_hdr")
	err = ns.Do(func() error {
		d, err := Open(Config{Name: "tgtun"})
		if err == nil {
			d.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "exists as a TUN") {
		t.Fatalf("Open of a TUN device: %v", err)
	}
}

func TestMultiQueueMismatch(t *testing.T) {
	ns := netnstest.New(t, "mq")
	ns.MustRun(t, "ip", "tuntap", "add", "dev", "tgmq", "mode", "tap", "vnet_hdr", "multi_queue")
	ns.MustRun(t, "ip", "tuntap", "add", "dev", "tgsq", "mode", "tap", "vnet_hdr")
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Name: "tgmq"}, `tap "tgmq" exists with multi_queue but a single queue was asked for; enable multiqueue in tapgro or recreate it with: ip tuntap del dev tgmq mode tap && ip tuntap add dev tgmq mode tap vnet_hdr`},
		{Config{Name: "tgsq", MultiQueue: true}, `tap "tgsq" exists without multi_queue but multiqueue was asked for; disable multiqueue in tapgro or recreate it with: ip tuntap del dev tgsq mode tap && ip tuntap add dev tgsq mode tap vnet_hdr multi_queue`},
	} {
		err := ns.Do(func() error {
			d, err := Open(tc.cfg)
			if err == nil {
				d.Close()
			}
			return err
		})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%+v): %v\nwant an error containing %q", tc.cfg, err, tc.want)
		}
		// The kernel's own answer to the mismatch is a bare EINVAL from TUNSETIFF (if the
		// pre-check lost a race); it gets the same explanation.
		err = ns.Do(func() error { return explainSetIff(tc.cfg, unix.EINVAL) })
		if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("explainSetIff(%+v, EINVAL) = %v", tc.cfg, err)
		}
		// And TUNSETIFF really does say EINVAL.
		err = ns.Do(func() error {
			fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			ifr, _ := unix.NewIfreq(tc.cfg.Name)
			fl := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
			if tc.cfg.MultiQueue {
				fl |= unix.IFF_MULTI_QUEUE
			}
			ifr.SetUint16(fl)
			return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		})
		if !errors.Is(err, unix.EINVAL) {
			t.Errorf("raw TUNSETIFF for %+v: %v, want EINVAL", tc.cfg, err)
		}
	}
}

func TestConfigureLink(t *testing.T) {
	ns := netnstest.New(t, "link")
	d := openIn(t, ns, Config{Name: "tgtap0"})
	lc := LinkConfig{MTU: 9000, TxQueueLen: 2000, Addrs: []netip.Prefix{tapPfx, tap6Pfx}, Up: true}
	// Configuring from the test goroutine (host namespace) works: the device remembers
	// its namespace. Twice, to show re-adding addresses is fine.
	for range 2 {
		if err := d.ConfigureLink(lc); err != nil {
			t.Fatal(err)
		}
	}
	var link netlink.Link
	if err := ns.Do(func() (err error) { link, err = netlink.LinkByName("tgtap0"); return err }); err != nil {
		t.Fatal(err)
	}
	a := link.Attrs()
	if a.MTU != 9000 || a.TxQLen != 2000 || a.Flags&net.FlagUp == 0 {
		t.Fatalf("link attrs: mtu %d txqlen %d flags %v; want 9000 2000 up", a.MTU, a.TxQLen, a.Flags)
	}
	addrs, err := d.linkAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range lc.Addrs {
		found := false
		for _, got := range addrs {
			found = found || got == want
		}
		if !found {
			t.Errorf("address %s missing; link has %v", want, addrs)
		}
	}
	// nodad: the IPv6 address is usable at once, not tentative.
	out := string(ns.MustRun(t, "ip", "-6", "-o", "addr", "show", "dev", "tgtap0"))
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, tap6Pfx.String()) && (strings.Contains(line, "tentative") || !strings.Contains(line, "nodad")) {
			t.Errorf("IPv6 address not added with nodad: %s", line)
		}
	}
	if !strings.Contains(out, tap6Pfx.String()) {
		t.Errorf("ip -6 addr: %s lacks %s", out, tap6Pfx)
	}

	for _, bad := range []LinkConfig{
		{MTU: 65522}, {MTU: 67}, {TxQueueLen: -1},
		{MTU: 1000, Addrs: []netip.Prefix{tap6Pfx}},
		{Addrs: []netip.Prefix{netip.MustParsePrefix("::ffff:198.18.0.1/120")}},
		{Addrs: []netip.Prefix{{}}},
	} {
		if err := d.ConfigureLink(bad); err == nil {
			t.Errorf("ConfigureLink(%+v) succeeded", bad)
		}
	}
	if err := d.ConfigureLink(LinkConfig{MTU: MaxMTU}); err != nil {
		t.Errorf("MTU %d: %v", MaxMTU, err)
	}
}

// upTAP opens a TAP in a fresh namespace, addressed 198.18.0.1/24 and up, with a
// permanent neighbour entry for 198.18.0.2 so the kernel never needs ARP. IPv6 is
// disabled in the namespace so router solicitations and MLD reports do not interleave.
func upTAP(t testing.TB, name string, cfg Config, mtu int) (*netnstest.NS, *Device, net.HardwareAddr) {
	t.Helper()
	ns := netnstest.New(t, name)
	ns.MustRun(t, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	d := openIn(t, ns, cfg)
	if err := d.ConfigureLink(LinkConfig{MTU: mtu, Addrs: []netip.Prefix{tapPfx}, Up: true}); err != nil {
		t.Fatal(err)
	}
	ns.MustRun(t, "ip", "neigh", "replace", peerIP.String(), "lladdr", peerMAC.String(), "dev", cfg.Name, "nud", "permanent")
	var mac net.HardwareAddr
	if err := ns.Do(func() error {
		ifc, err := net.InterfaceByName(cfg.Name)
		if err == nil {
			mac = ifc.HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ns, d, mac
}

func ipv4Header(b []byte, proto uint8, totalLen int, src, dst netip.Addr) {
	b[0] = 0x45
	b[1] = 0
	binary.BigEndian.PutUint16(b[2:], uint16(totalLen))
	binary.BigEndian.PutUint16(b[4:], 0)      // id
	binary.BigEndian.PutUint16(b[6:], 0x4000) // DF
	b[8] = 64
	b[9] = proto
	b[10], b[11] = 0, 0
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], vnethdr.Checksum(b[:20], 0))
}

// echoRequest builds [zero vnet header][Ethernet][IPv4][ICMP echo request] from the peer.
func echoRequest(hdrLen int, dstMAC net.HardwareAddr, id, seq uint16, payload []byte) []byte {
	pkt := make([]byte, hdrLen+14+20+8+len(payload))
	f := pkt[hdrLen:]
	copy(f[0:6], dstMAC)
	copy(f[6:12], peerMAC)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ipv4Header(f[14:], unix.IPPROTO_ICMP, 20+8+len(payload), peerIP, tapIP)
	icmp := f[34:]
	icmp[0] = 8 // echo request
	binary.BigEndian.PutUint16(icmp[4:], id)
	binary.BigEndian.PutUint16(icmp[6:], seq)
	copy(icmp[8:], payload)
	binary.BigEndian.PutUint16(icmp[2:], vnethdr.Checksum(icmp, 0))
	return pkt
}

// isEchoReply reports whether frame (after the vnet header) is the reply to id/seq.
func isEchoReply(f []byte, id, seq uint16, payload []byte) bool {
	if len(f) < 42 || binary.BigEndian.Uint16(f[12:]) != 0x0800 || f[23] != unix.IPPROTO_ICMP {
		return false
	}
	icmp := f[14+int(f[14]&0xf)*4:]
	return netip.AddrFrom4([4]byte(f[26:30])) == tapIP && netip.AddrFrom4([4]byte(f[30:34])) == peerIP &&
		icmp[0] == 0 && binary.BigEndian.Uint16(icmp[4:]) == id && binary.BigEndian.Uint16(icmp[6:]) == seq &&
		bytes.Equal(icmp[8:], payload) && vnethdr.Checksum(icmp, 0) == 0
}

func newBufs(n int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, bufSize)
	}
	return bufs, make([]int, n)
}

func TestICMPRoundTrip(t *testing.T) {
	for _, hdrLen := range []int{10, 12} {
		t.Run(fmt.Sprint(hdrLen), func(t *testing.T) {
			_, d, mac := upTAP(t, "icmp", Config{Name: "tgtap0", VnetHdrLen: hdrLen}, 1500)
			payload := []byte("tapgro icmp round trip")
			req := echoRequest(hdrLen, mac, 0x1234, 7, payload)
			if n, err := d.Write(req); err != nil || n != len(req) {
				t.Fatalf("Write = %d, %v; want %d", n, err, len(req))
			}
			const off = 4 // headroom must be honoured
			bufs, sizes := newBufs(4)
			d.SetReadDeadline(time.Now().Add(hangGuard))
			for {
				n, err := d.ReadBatch(bufs, sizes, off)
				if err != nil {
					t.Fatalf("ReadBatch: %v (stats: %d frames read)", err, d.Stats().FramesRead.Load())
				}
				for i := range n {
					frame := bufs[i][off : off+sizes[i]]
					var h vnethdr.Hdr
					if err := h.Decode(frame, hdrLen); err != nil {
						t.Fatal(err)
					}
					if isEchoReply(frame[hdrLen:], 0x1234, 7, payload) {
						if h.IsGSO() || h.Flags&vnethdr.FlagNeedsCsum != 0 {
							t.Fatalf("echo reply with offloads off has header %v", h)
						}
						st := d.Stats()
						if st.FramesWritten.Load() != 1 || st.BytesWritten.Load() != uint64(len(req)) ||
							st.FramesRead.Load() == 0 || st.BytesRead.Load() == 0 || st.Truncated.Load() != 0 {
							t.Fatalf("stats: written %d/%d read %d/%d truncated %d", st.FramesWritten.Load(),
								st.BytesWritten.Load(), st.FramesRead.Load(), st.BytesRead.Load(), st.Truncated.Load())
						}
						return
					}
				}
			}
		})
	}
}

// synAck answers the SYN in frame (after the vnet header) with MSS 1460, window 65535.
func synAck(hdrLen int, frame []byte) ([]byte, error) {
	if len(frame) < 54 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 || frame[23] != unix.IPPROTO_TCP {
		return nil, errors.New("not TCPv4")
	}
	tcp := frame[14+int(frame[14]&0xf)*4:]
	if tcp[13] != 0x02 {
		return nil, fmt.Errorf("TCP flags %#x, not a SYN", tcp[13])
	}
	pkt := make([]byte, hdrLen+14+20+24)
	f := pkt[hdrLen:]
	copy(f[0:6], frame[6:12])
	copy(f[6:12], peerMAC)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ipv4Header(f[14:], unix.IPPROTO_TCP, 20+24, peerIP, tapIP)
	r := f[34:]
	copy(r[0:2], tcp[2:4]) // sport = their dport
	copy(r[2:4], tcp[0:2])
	binary.BigEndian.PutUint32(r[4:], 1000)
	binary.BigEndian.PutUint32(r[8:], binary.BigEndian.Uint32(tcp[4:])+1)
	r[12] = 6 << 4
	r[13] = 0x12 // SYN|ACK
	binary.BigEndian.PutUint16(r[14:], 65535)
	copy(r[20:], []byte{2, 4, 0x05, 0xb4, 1, 1, 1, 0}) // MSS 1460, NOP padding
	src, dst := peerIP.As4(), tapIP.As4()
	binary.BigEndian.PutUint16(r[16:], vnethdr.Checksum(r, vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, src[:], dst[:], len(r))))
	return pkt, nil
}

// TestTSO makes the kernel send a TCP stream out of the TAP. With TSO4 set the first
// flight (initial cwnd of 10 segments) must arrive as GSO super-frames larger than the
// MTU; with offloads off, only MTU-sized plain frames.
func TestTSO(t *testing.T) {
	for _, tc := range []struct {
		name string
		offl vnethdr.Offloads
	}{
		{"on", vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6},
		{"off", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const mtu = 1500
			ns, d, _ := upTAP(t, "tso", Config{Name: "tgtap0"}, mtu)
			if got, err := d.SetOffloads(tc.offl); err != nil || got != tc.offl {
				t.Fatalf("SetOffloads(%s) = %s, %v", tc.offl, got, err)
			}
			hl := d.VnetHdrLen()

			type dialed struct {
				c   net.Conn
				err error
			}
			dials := make(chan dialed, 1)
			go func() {
				var c net.Conn
				err := ns.Do(func() (err error) {
					c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(peerIP, 5001).String(), hangGuard)
					return err
				})
				dials <- dialed{c, err}
			}()

			bufs, sizes := newBufs(16)
			d.SetReadDeadline(time.Now().Add(hangGuard))
			var conn net.Conn
			gso, plain, payload := 0, 0, 0
			for payload < 10*1460 && (tc.offl == 0 || gso == 0) {
				n, err := d.ReadBatch(bufs, sizes, 0)
				if err != nil {
					t.Fatalf("ReadBatch after %d GSO / %d plain frames, %d payload bytes: %v", gso, plain, payload, err)
				}
				for i := range n {
					frame := bufs[i][:sizes[i]]
					var h vnethdr.Hdr
					if err := h.Decode(frame, hl); err != nil {
						t.Fatal(err)
					}
					eth := frame[hl:]
					if len(eth) < 54 || binary.BigEndian.Uint16(eth[12:]) != 0x0800 || eth[23] != unix.IPPROTO_TCP {
						continue
					}
					tcp := eth[14+int(eth[14]&0xf)*4:]
					if conn == nil && tcp[13] == 0x02 {
						sa, err := synAck(hl, eth)
						if err != nil {
							t.Fatal(err)
						}
						if _, err := d.Write(sa); err != nil {
							t.Fatalf("write SYN-ACK: %v", err)
						}
						dl := <-dials
						if dl.err != nil {
							t.Fatalf("dial: %v", dl.err)
						}
						conn = dl.c
						t.Cleanup(func() { conn.Close() })
						// The write never completes (nothing is ACKed); it fails once the
						// test closes conn.
						go conn.Write(make([]byte, 256<<10))
						continue
					}
					data := len(eth) - 14 - int(eth[14]&0xf)*4 - int(tcp[12]>>4)*4
					if data <= 0 {
						continue
					}
					payload += data
					if h.GSOType&^vnethdr.GSOECN == vnethdr.GSOTCPv4 {
						gso++
						if len(eth) <= mtu+14 || h.GSOSize == 0 || h.GSOSize > mtu-40 {
							t.Errorf("GSO frame of %d bytes with gso_size %d: want > %d bytes and 0 < gso_size <= %d",
								len(eth), h.GSOSize, mtu+14, mtu-40)
						}
						if h.Flags&vnethdr.FlagNeedsCsum == 0 {
							t.Errorf("GSO frame without NEEDS_CSUM: %v", h)
						}
					} else {
						plain++
						if h.IsGSO() || len(eth) > mtu+14 {
							t.Errorf("frame of %d bytes with header %v, want plain and <= %d", len(eth), h, mtu+14)
						}
					}
				}
			}
			if tc.offl&vnethdr.OffloadTSO4 != 0 && gso == 0 {
				t.Fatalf("TSO4 on: no GSO frame among %d data frames", plain)
			}
			if tc.offl == 0 && gso != 0 {
				t.Fatalf("offloads off: %d GSO frames", gso)
			}
			t.Logf("%d GSO + %d plain data frames, %d payload bytes, %d read(2) for %d batches",
				gso, plain, payload, d.Stats().ReadCalls.Load(), d.Stats().ReadBatches.Load())
		})
	}
}

func TestCloseUnblocksReadBatch(t *testing.T) {
	ns := netnstest.New(t, "close")
	d := openIn(t, ns, Config{Name: "tgtap0"})
	bufs, sizes := newBufs(2)
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		close(started)
		_, err := d.ReadBatch(bufs, sizes, 0)
		done <- err
	}()
	<-started
	// The device is down, so nothing arrives: once the first read(2) has found nothing
	// the goroutine parks in the poller, and Close must wake it.
	for d.Stats().ReadCalls.Load() == 0 {
		runtime.Gosched()
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("ReadBatch after Close: %v, want os.ErrClosed", err)
	}
	if _, err := d.Write(make([]byte, 64)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Write after Close: %v, want os.ErrClosed", err)
	}
	if err := d.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
}

// Deleting the device under a blocked reader ends the read with os.ErrClosed (tun
// detaches the queue; read(2) then says EBADFD).
func TestDeviceDeleted(t *testing.T) {
	ns := netnstest.New(t, "deleted")
	d := openIn(t, ns, Config{Name: "tgtap0"})
	bufs, sizes := newBufs(2)
	done := make(chan error, 1)
	go func() {
		_, err := d.ReadBatch(bufs, sizes, 0)
		done <- err
	}()
	for d.Stats().ReadCalls.Load() == 0 {
		runtime.Gosched()
	}
	ns.MustRun(t, "ip", "link", "del", "tgtap0")
	d.SetReadDeadline(time.Now().Add(hangGuard))
	if err := <-done; !errors.Is(err, os.ErrClosed) {
		t.Fatalf("ReadBatch after the device was deleted: %v, want os.ErrClosed", err)
	}
	if d.Stats().ReadErrors.Load() == 0 {
		t.Fatal("no read(2) error counted: the read did not see the deletion")
	}
}

func TestReadDeadline(t *testing.T) {
	ns := netnstest.New(t, "deadline")
	d := openIn(t, ns, Config{Name: "tgtap0"})
	bufs, sizes := newBufs(1)
	d.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := d.ReadBatch(bufs, sizes, 0); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("ReadBatch past deadline: %v", err)
	}
}

func TestReadBatchBadArgs(t *testing.T) {
	ns := netnstest.New(t, "args")
	d := openIn(t, ns, Config{Name: "tgtap0", VnetHdrLen: 12})
	big := make([]byte, 100)
	for _, tc := range []struct {
		bufs  [][]byte
		sizes []int
		off   int
	}{
		{[][]byte{big, big}, make([]int, 1), 0},
		{[][]byte{big}, make([]int, 1), -1},
		{[][]byte{big, make([]byte, 11)}, make([]int, 2), 0},
		{[][]byte{big}, make([]int, 1), 89},
	} {
		if _, err := d.ReadBatch(tc.bufs, tc.sizes, tc.off); err == nil {
			t.Errorf("ReadBatch(%d bufs, %d sizes, offset %d) succeeded", len(tc.bufs), len(tc.sizes), tc.off)
		}
	}
	if n, err := d.ReadBatch(nil, nil, 0); n != 0 || err != nil {
		t.Errorf("empty ReadBatch = %d, %v", n, err)
	}
}

func TestWriteErrors(t *testing.T) {
	ns, d, mac := upTAP(t, "werr", Config{Name: "tgtap0"}, 1500)
	good := echoRequest(10, mac, 1, 1, make([]byte, 100))

	// GSO type 2 does not exist (include/linux/virtio_net.h virtio_net_hdr_to_skb rejects it).
	bad := bytes.Clone(good)
	bad[1] = 2
	binary.LittleEndian.PutUint16(bad[4:], 100)
	if _, err := d.Write(bad); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("Write(bad gso_type): %v, want EINVAL", err)
	}
	// Shorter than an Ethernet header.
	if _, err := d.Write(good[:10+13]); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("Write(13-byte frame): %v, want EINVAL", err)
	}
	ns.MustRun(t, "ip", "link", "set", "tgtap0", "down")
	if _, err := d.Write(good); !errors.Is(err, unix.EIO) {
		t.Fatalf("Write on a down link: %v, want EIO", err)
	}
	st := d.Stats()
	if st.WriteErrEINVAL.Load() != 2 || st.WriteErrEIO.Load() != 1 || st.WriteErrOther.Load() != 0 || st.FramesWritten.Load() != 0 {
		t.Fatalf("stats: EINVAL %d EIO %d other %d written %d", st.WriteErrEINVAL.Load(), st.WriteErrEIO.Load(),
			st.WriteErrOther.Load(), st.FramesWritten.Load())
	}
}

// TestAllocs: a steady-state Write + ReadBatch cycle allocates nothing.
func TestAllocs(t *testing.T) {
	_, d, mac := upTAP(t, "allocs", Config{Name: "tgtap0"}, 1500)
	req := echoRequest(10, mac, 9, 9, make([]byte, 56))
	bufs, sizes := newBufs(8)
	d.SetReadDeadline(time.Now().Add(hangGuard))
	var werr, rerr error
	// Every iteration writes one request whose reply is queued by the time (or shortly
	// after) ReadBatch runs, so ReadBatch never waits for long (see the hang guard).
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := d.Write(req); err != nil {
			werr = err
		}
		if _, err := d.ReadBatch(bufs, sizes, 0); err != nil {
			rerr = err
		}
	})
	if werr != nil || rerr != nil {
		t.Fatalf("write: %v, read: %v", werr, rerr)
	}
	if allocs != 0 {
		t.Fatalf("Write+ReadBatch: %v allocs per run, want 0", allocs)
	}
	// Failed writes the caller is expected to see often allocate nothing either.
	bad := bytes.Clone(req)
	bad[1] = 2
	allocs = testing.AllocsPerRun(100, func() { d.Write(bad) })
	if allocs != 0 {
		t.Fatalf("rejected Write: %v allocs per run, want 0", allocs)
	}
}

// BenchmarkWrite writes plain 1514-byte frames (UDP to an unbound port of the TAP's own
// address) to a TAP that is up.
func BenchmarkWrite(b *testing.B) {
	_, d, mac := upTAP(b, "bench", Config{Name: "tgtap0"}, 1500)
	const hl = 10
	pkt := make([]byte, hl+1514)
	f := pkt[hl:]
	copy(f[0:6], mac)
	copy(f[6:12], peerMAC)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ipv4Header(f[14:], unix.IPPROTO_UDP, 1500, peerIP, tapIP)
	udp := f[34:]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], 9)
	binary.BigEndian.PutUint16(udp[4:], 1480)
	// UDP checksum 0: none (IPv4).
	b.ReportAllocs()
	b.SetBytes(int64(len(f)))
	for b.Loop() {
		if _, err := d.Write(pkt); err != nil {
			b.Fatal(err)
		}
	}
}
