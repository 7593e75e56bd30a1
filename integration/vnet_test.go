//go:build linux

package integration

import (
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
)

// vnetUnix joins two tapgro instances with the vnet-hdr=on stream over UNIX: GSO frames
// and partial checksums cross whole.
var vnetUnix = backend{"stream-unix-vnet",
	func(d string) string {
		return "stream,server=on,addr.type=unix,addr.path=" + filepath.Join(d, "v.sock") + ",vnet-hdr=on"
	},
	func(d string) string {
		return "stream,server=off,addr.type=unix,addr.path=" + filepath.Join(d, "v.sock") + ",vnet-hdr=on"
	}}

// vnetUnixNoShm is vnetUnix with shm=off: every frame crosses the socket, as it does
// between two hosts over TCP.
var vnetUnixNoShm = backend{"stream-unix-vnet-noshm",
	func(d string) string { return vnetUnix.a(d) + ",shm=off" },
	func(d string) string { return vnetUnix.b(d) + ",shm=off" }}

var negotiatedRe = regexp.MustCompile(`negotiated: tap offloads=([a-z0-9_,]+) `)

// lastNegotiated is the TAP mask of the last "negotiated:" line in a tapgro log.
func lastNegotiated(t testing.TB, p *proc) string {
	t.Helper()
	p.waitLog(negotiatedRe, 10*time.Second)
	m := negotiatedRe.FindAllStringSubmatch(p.out.String(), -1)
	return m[len(m)-1][1]
}

// waitConnected waits until both tapgro logged the peer's negotiation (after connect).
func waitConnected(t testing.TB, s *pairSetup) {
	t.Helper()
	re := regexp.MustCompile(`port connected`)
	s.pa.waitLog(re, 20*time.Second)
	s.pb.waitLog(re, 20*time.Second)
}

// checkEthtool compares each TAP's offloads as the kernel shows them with tapgro's last
// negotiated line.
func checkEthtool(t testing.TB, s *pairSetup) {
	t.Helper()
	for _, side := range []struct {
		ns *netnstest.NS
		p  *proc
	}{{s.a, s.pa}, {s.b, s.pb}} {
		said := lastNegotiated(t, side.p)
		if got := ethtoolOffloads(t, side.ns, "tg0"); got != said {
			t.Errorf("%s: tapgro negotiated TAP offloads %q; ethtool -k shows %q", side.p.name, said, got)
		}
	}
}

// TestVnetHdr: two tapgro joined by the vnet-hdr=on stream move 200 MB each way intact,
// the TSO frames of the sending TAP cross as GSO frames (no software segmentation on the
// way), and each TAP's ethtool -k equals what its tapgro negotiated. Over UNIX the large
// frames cross in shared-memory ring slots; with shm=off, all through the socket.
func TestVnetHdr(t *testing.T) {
	for _, be := range []backend{vnetUnix, vnetUnixNoShm} {
		t.Run(be.name, func(t *testing.T) { testVnetHdr(t, be, be.name == vnetUnix.name) })
	}
}

func testVnetHdr(t *testing.T, be backend, shm bool) {
	netnstest.RequirePriv(t)
	s := newPair(t, be, "--metrics-addr", metricsAddr)
	waitConnected(t, s)
	s.pingAll(t)
	const size = 200 << 20
	d := transfer(t, s.a, s.b, "198.18.0.2", 7101, size)
	t.Logf("A->B %d MB in %v (%.2f Gbit/s)", size>>20, d, float64(size)*8/d.Seconds()/1e9)
	d = transfer(t, s.b, s.a, "198.18.0.1", 7102, size)
	t.Logf("B->A %d MB in %v (%.2f Gbit/s)", size>>20, d, float64(size)*8/d.Seconds()/1e9)
	checkEthtool(t, s)
	for _, p := range []*proc{s.pa, s.pb} {
		m := regexp.MustCompile(`negotiated: .*`).FindAllString(p.out.String(), -1)
		t.Logf("%s: %s", p.name, m[len(m)-1])
		if !strings.Contains(m[len(m)-1], "tap->port=passthrough") {
			t.Errorf("%s did not negotiate GSO passthrough: %s", p.name, m[len(m)-1])
		}
		if got := strings.Contains(m[len(m)-1], "shared memory"); got != shm {
			t.Errorf("%s: shared memory in the negotiated line is %v, want %v: %s", p.name, got, shm, m[len(m)-1])
		}
	}
	for _, side := range []struct {
		ns *netnstest.NS
		p  *proc
	}{{s.a, s.pa}, {s.b, s.pb}} {
		p := side.p
		c := scrape(t, side.ns, metricsAddr).pick(t, mT2PPassthrough, mT2PSegmented, mP2TPassthrough, mT2PFrames, mP2TFrames,
			mGSOFallback, mTapEINVAL, mP2TMalformed, mT2PShm, mP2TShm)
		t.Logf("%s: tap_to_port_gso_passthrough=%v tap_to_port_gso_segmented=%v port_to_tap_gso_passthrough=%v tap_to_port_frames=%v port_to_tap_frames=%v",
			p.name, c[mT2PPassthrough], c[mT2PSegmented], c[mP2TPassthrough], c[mT2PFrames], c[mP2TFrames])
		// Each side both sent 200 MB (its TAP emits TSO) and received 200 MB.
		if c[mT2PPassthrough] < 1000 || c[mP2TPassthrough] < 1000 {
			t.Errorf("%s: too few GSO frames went through whole: %v", p.name, c)
		}
		if c[mT2PSegmented] != 0 || c[mGSOFallback] != 0 || c[mTapEINVAL] != 0 || c[mP2TMalformed] != 0 {
			t.Errorf("%s: GSO frames were segmented or refused: %v", p.name, c)
		}
		t.Logf("%s: tap_to_port_shm=%v port_to_tap_shm=%v", p.name, c[mT2PShm], c[mP2TShm])
		if shm && (c[mT2PShm] < 1000 || c[mP2TShm] < 1000) {
			t.Errorf("%s: too few frames crossed in shared memory: %v", p.name, c)
		}
		if !shm && (c[mT2PShm] != 0 || c[mP2TShm] != 0) {
			t.Errorf("%s: frames crossed in shared memory with shm=off: %v", p.name, c)
		}
	}
	s.pa.stop()
	s.pb.stop()
}

// TestVnetHdrMismatch: a vnet-hdr=on server meeting a plain client refuses it with a
// clear error on both sides, and keeps waiting for the right peer.
func TestVnetHdrMismatch(t *testing.T) {
	netnstest.RequirePriv(t)
	mixed := backend{"mixed", vnetUnix.a, func(d string) string {
		return "stream,server=off,addr.type=unix,addr.path=" + filepath.Join(d, "v.sock")
	}}
	s := newPair(t, mixed)
	s.pa.waitLog(regexp.MustCompile(`peer is not a tapgro speaking vnet-hdr=on`), 10*time.Second)
	s.pb.waitLog(regexp.MustCompile(`set vnet-hdr=on on this end too`), 10*time.Second)
	// A keeps serving: a vnet-hdr=on client gets through.
	s.pb.kill()
	args := append([]string{}, s.argsB...)
	for i := range args {
		if strings.HasPrefix(args[i], "stream,") {
			args[i] += ",vnet-hdr=on"
		}
	}
	s.pb = startTapgro(t, s.b, "tapgro B (vnet)", args...)
	waitPing(t, s.a, "198.18.0.2", 20*time.Second)
}

// udpExchange sends n self-checking UDP datagrams of size bytes (larger than the MTU,
// so the IP layer fragments them, or with gso set one UDP_SEGMENT send per datagram
// group, which a TAP with USO emits as one UDP_L4 GSO frame) from ns `from` to dst in
// ns `to`, and fails unless every datagram arrives once with its content intact.
func udpExchange(t testing.TB, from, to *netnstest.NS, dst string, port, n, size int, gso int) {
	t.Helper()
	var rc *net.UDPConn
	if err := to.Do(func() (err error) {
		rc, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(dst), Port: port})
		if err == nil {
			err = rc.SetReadBuffer(8 << 20)
		}
		return err
	}); err != nil {
		t.Fatalf("listen udp in %s: %v", to.Name, err)
	}
	defer rc.Close()
	var sc *net.UDPConn
	if err := from.Do(func() (err error) {
		sc, err = net.DialUDP("udp", nil, &net.UDPAddr{IP: net.ParseIP(dst), Port: port})
		return err
	}); err != nil {
		t.Fatalf("dial udp from %s: %v", from.Name, err)
	}
	defer sc.Close()
	if gso > 0 {
		raw, _ := sc.SyscallConn()
		var serr error
		raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_SEGMENT, gso) })
		if serr != nil {
			t.Fatalf("UDP_SEGMENT: %v", serr)
		}
	}
	dgram := func(seq, l int) []byte {
		b := make([]byte, l)
		binary.BigEndian.PutUint32(b, uint32(seq))
		binary.BigEndian.PutUint16(b[4:], uint16(l))
		for i := 6; i < l; i++ {
			b[i] = byte(seq*31 + i*7)
		}
		return b
	}
	// With gso, one send carries size bytes cut into gso-byte datagrams.
	perSend, dlen := 1, size
	if gso > 0 {
		perSend, dlen = (size+gso-1)/gso, gso
	}
	want := n * perSend
	got := make(chan error, 1)
	go func() {
		seen := make(map[uint32]bool, want)
		buf := make([]byte, 70000)
		rc.SetReadDeadline(time.Now().Add(20 * time.Second))
		for len(seen) < want {
			k, err := rc.Read(buf)
			if err != nil {
				got <- fmt.Errorf("after %d of %d datagrams: %w", len(seen), want, err)
				return
			}
			if k < 6 {
				got <- fmt.Errorf("runt datagram of %d bytes", k)
				return
			}
			seq := binary.BigEndian.Uint32(buf)
			exp := dgram(int(seq), int(binary.BigEndian.Uint16(buf[4:])))
			if k != len(exp) || string(buf[:k]) != string(exp) || seen[seq] {
				got <- fmt.Errorf("datagram %d: %d bytes, corrupt or duplicated", seq, k)
				return
			}
			seen[seq] = true
		}
		got <- nil
	}()
	seq := 0
	for i := 0; i < n; i++ {
		var msg []byte
		for j := 0; j < perSend; j++ {
			l := min(dlen, size-j*dlen)
			if l < 6 {
				l = 6
			}
			msg = append(msg, dgram(seq, l)...)
			seq++
		}
		if _, err := sc.Write(msg); err != nil {
			t.Fatalf("send: %v", err)
		}
		// Paced so that no queue on the way overflows: the check is integrity, not rate.
		time.Sleep(200 * time.Microsecond)
	}
	if err := <-got; err != nil {
		t.Fatalf("UDP %s -> %s (%d-byte sends, gso %d): %v", from.Name, dst, size, gso, err)
	}
}

// TestOffloadMatrix: TAP offloads × port kind × GRO, each cell moving TCP v4/v6 (SHA-256
// checked) and UDP v4/v6 datagrams larger than the MTU (fragmented, and UDP_SEGMENT
// bursts that a TAP with USO emits as GSO) both ways, intact, with each TAP's ethtool -k
// equal to what its tapgro negotiated.
func TestOffloadMatrix(t *testing.T) {
	netnstest.RequirePriv(t)
	offloads := []string{"off", "csum", "csum,tso4,tso6", "csum,tso4,tso6,uso"}
	// stream plain, stream vnet-hdr=on (shared memory, and shm=off: the socket), dgram unix
	ports := []backend{backends[0], vnetUnix, vnetUnixNoShm, backends[4]}
	for _, be := range ports {
		for _, off := range offloads {
			for _, gro := range []string{"on", "off"} {
				// No comma in the name: t.TempDir (the socket paths) is named after it,
				// and a comma would split the --netdev spec.
				name := fmt.Sprintf("%s/%s/gro=%s", be.name, strings.ReplaceAll(off, ",", "+"), gro)
				t.Run(name, func(t *testing.T) {
					s := newPair(t, be, "--offload", off, "--gro", gro)
					waitConnected(t, s)
					s.pingAll(t)
					const size = 8 << 20
					transfer(t, s.a, s.b, "198.18.0.2", 7201, size)
					transfer(t, s.b, s.a, "198.18.0.1", 7202, size)
					transfer(t, s.a, s.b, "fd00:198:18::2", 7203, size)
					transfer(t, s.b, s.a, "fd00:198:18::1", 7204, size)
					for _, c := range []struct {
						from, to *netnstest.NS
						dst      string
					}{
						{s.a, s.b, "198.18.0.2"}, {s.b, s.a, "198.18.0.1"},
						{s.a, s.b, "fd00:198:18::2"}, {s.b, s.a, "fd00:198:18::1"},
					} {
						udpExchange(t, c.from, c.to, c.dst, 7301, 100, 4000, 0)
						udpExchange(t, c.from, c.to, c.dst, 7302, 50, 8000, 1400)
					}
					checkEthtool(t, s)
				})
			}
		}
	}
}
