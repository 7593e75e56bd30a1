//go:build linux

package integration

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// The real QEMU guest on the other side of tapgro. Each subtest makes one namespace with a
// tapgro on TAP tg0 (198.18.0.1/24, fd00:198:18::1/64) and boots the guest (198.18.0.2,
// fd00:198:18::2) with its virtio-net NIC on a -netdev pointed at tapgro. QEMU runs inside
// the same namespace, so the inet backends meet tapgro on that namespace's loopback.
//
//	netns                                         QEMU (TCG), same netns
//	198.18.0.1 ─ tg0 ─ tapgro ══ stream/socket/dgram ══ virtio-net ─ eth0 198.18.0.2
//
// QEMU's socket-family backends carry no virtio-net header (they define no has_vnet_hdr,
// so hw/net/virtio-net.c offers the guest no offloads): the guest
// sends MTU frames with full checksums, tapgro coalesces them towards the TAP, and segments
// the TAP's TSO packets before they reach the guest. TCG makes everything here slow
// (a few hundred Mbit/s at best), so nothing asserts a rate; the counters and checksums are
// what pass or fail.

const (
	guestIP4   = "198.18.0.2"
	guestIP6   = "fd00:198:18::2"
	hostIP4    = "198.18.0.1"
	hostIP6    = "fd00:198:18::1"
	guestUp    = 7010 // guest -> host file, hashed by the host
	guestDown  = 7011 // host -> guest file, hashed by the guest
	guestGo    = 7012 // the guest listens here for "carry on"
	guestFile  = 8 << 20
	guestLimit = 4 * time.Minute // hang guard per guest run; TCG on a busy 2-CPU box is slow
)

// qemuBackend is one QEMU backend as tapgro and QEMU spell it; dir is a per-test directory.
type qemuBackend struct {
	name         string
	tapgro, qemu func(dir string) string
}

var qemuBackends = []qemuBackend{
	{name: "stream-unix",
		tapgro: func(d string) string {
			return "stream,server=on,addr.type=unix,addr.path=" + filepath.Join(d, "s.sock")
		},
		qemu: func(d string) string {
			return "stream,server=off,addr.type=unix,addr.path=" + filepath.Join(d, "s.sock")
		}},
	// -netdev socket is IPv4-only and QEMU 7.2 never reconnects a connect= client
	// (net/socket.c net_socket_connect_init connects once), so tapgro listens.
	{name: "socket-tcp",
		tapgro: func(string) string { return "socket,listen=127.0.0.1:5710" },
		qemu:   func(string) string { return "socket,connect=127.0.0.1:5710" }},
	{name: "dgram-udp",
		tapgro: func(string) string {
			return "dgram,local.type=inet,local.host=127.0.0.1,local.port=5711,remote.type=inet,remote.host=127.0.0.1,remote.port=5712"
		},
		qemu: func(string) string {
			return "dgram,local.type=inet,local.host=127.0.0.1,local.port=5712,remote.type=inet,remote.host=127.0.0.1,remote.port=5711"
		}},
}

// qemuSetup is one namespace with tapgro on tg0 and iperf3 -s listening.
type qemuSetup struct {
	f    *qemuFlavour // the QEMU and guest kernel every guest of the setup boots
	ns   *netnstest.NS
	dir  string
	args []string
	tg   *proc
	// guestArgs and guestDev go to every guest runFullGuest boots (guestOpts.QEMUArgs,
	// DevOpts).
	guestArgs []string
	guestDev  string
	// fileSize is the size of each hashed file runFullGuest moves (0: guestFile).
	fileSize int
	// guestExtra is shell the battery runs right after `ip link show eth0` (under set -e).
	guestExtra string
	// whileWaiting runs on the host while the battery's guest waits at GUEST-WAITING,
	// before runFullGuest's own pings.
	whileWaiting func()
}

func newQEMUSetup(t *testing.T, f *qemuFlavour, tapgroSpec func(string) string, mtu int) *qemuSetup {
	t.Helper()
	s := &qemuSetup{f: f, ns: netnstest.New(t, "qemu"), dir: t.TempDir()}
	s.args = []string{"--tap", "tg0", "--mtu", strconv.Itoa(mtu), "--addr", hostIP4 + "/24", "--addr", hostIP6 + "/64",
		"--netdev", tapgroSpec(s.dir), "--metrics-addr", metricsAddr, "--qemu-version", f.version()}
	startIperf3Server(t, s.ns)
	return s
}

func (s *qemuSetup) startTapgro(t *testing.T, name string) {
	t.Helper()
	s.tg = startTapgro(t, s.ns, name, s.args...)
	s.tg.waitLog(readyRe, 20*time.Second)
}

// startIperf3Server runs iperf3 -s in ns for the rest of the test and waits until it listens.
func startIperf3Server(t *testing.T, ns *netnstest.NS) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns.Name, "iperf3", "-s")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("iperf3 -s: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("--- iperf3 -s ---\n%s", out.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if o, _ := ns.Run("ss", "-Hltn", "sport = :5201"); strings.Contains(string(o), "5201") {
			return
		}
		select {
		case <-done:
			t.Fatalf("iperf3 -s exited: %s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("iperf3 -s not listening after 10s: %s", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// guestFiles is the host end of the file transfers: a sink on guestUp that hashes what
// the guest sends, and a source on guestDown that sends seeded pseudo-random bytes.
type guestFiles struct {
	up       chan upResult
	downSum  string
	downSize int
	downTook chan time.Duration // accept to the last byte written, for the log
}

type upResult struct {
	sum  string
	n    int64
	err  error
	took time.Duration // accept to EOF, for the log
}

func serveGuestFiles(t *testing.T, ns *netnstest.NS, size int) *guestFiles {
	t.Helper()
	upLn, downLn := listenFiles(t, ns, guestUp, guestDown)
	data, sum := seededData(size, uint64(size))
	f := &guestFiles{up: make(chan upResult, 1), downSum: sum, downSize: size,
		downTook: make(chan time.Duration, 1)}

	go func() {
		c, err := upLn.Accept()
		if err != nil {
			f.up <- upResult{err: err}
			return
		}
		defer c.Close()
		start := time.Now()
		c.SetDeadline(start.Add(guestLimit))
		h := sha256.New()
		n, err := io.Copy(h, c)
		f.up <- upResult{sum: hex.EncodeToString(h.Sum(nil)), n: n, err: err, took: time.Since(start)}
	}()
	go func() {
		c, err := downLn.Accept()
		if err != nil {
			return
		}
		start := time.Now()
		c.SetDeadline(start.Add(guestLimit))
		c.Write(data)
		c.Close()
		f.downTook <- time.Since(start)
	}()
	return f
}

var (
	guestUpRe       = regexp.MustCompile(`GUEST-UP-SHA=([0-9a-f]{64})`)
	guestDownRe     = regexp.MustCompile(`GUEST-DOWN-SHA=([0-9a-f]{64})`)
	guestWaitingRe  = regexp.MustCompile(`GUEST-WAITING`)
	guestClockRe    = regexp.MustCompile(`GUEST-CLOCK-([A-Z]+)=([0-9.]+)`)
	portConnectedRe = regexp.MustCompile(`port connected`)
	iperfSummaryRe  = regexp.MustCompile(`(?m)^.*\s(sender|receiver)$`)
)

// fullGuestCmd is the whole battery, run by the guest: extra (shell, may be empty), ping
// v4 and v6, iperf3 guest->host and host->guest, a file of size bytes (a multiple of 64
// KiB) each way with SHA-256 printed, then it waits for the host's jumbo-sized DF ping and
// a connection on guestGo before it exits. GUEST-CLOCK-* lines are the guest's uptime
// around the file phase, for the log.
func fullGuestCmd(size int, extra string) string {
	return fmt.Sprintf(`set -e
ip link show eth0
%[7]s
ping -c 3 %[1]s
ping6 -c 3 %[2]s
iperf3 -c %[1]s -t 3
iperf3 -c %[1]s -t 3 -R
echo "GUEST-CLOCK-FILES=$(cut -d' ' -f1 /proc/uptime)"
dd if=/dev/urandom of=up bs=64k count=%[3]d 2>/dev/null
echo "GUEST-UP-SHA=$(sha256sum <up | cut -d' ' -f1)"
echo "GUEST-CLOCK-SEND=$(cut -d' ' -f1 /proc/uptime)"
nc %[1]s %[4]d <up
rm up
echo "GUEST-CLOCK-RECEIVE=$(cut -d' ' -f1 /proc/uptime)"
echo "GUEST-DOWN-SHA=$(nc %[1]s %[5]d </dev/null | sha256sum | cut -d' ' -f1)"
echo "GUEST-CLOCK-DONE=$(cut -d' ' -f1 /proc/uptime)"
echo GUEST-WAITING
nc -l -p %[6]d </dev/null >/dev/null
`, hostIP4, hostIP6, size/(64<<10), guestUp, guestDown, guestGo, extra)
}

// listenFiles listens on the host's address in ns on the upload and download ports of
// a guest's two file transfers, for the rest of the test.
func listenFiles(t *testing.T, ns *netnstest.NS, up, down int) (upLn, downLn net.Listener) {
	t.Helper()
	if err := ns.Do(func() (err error) {
		if upLn, err = net.Listen("tcp", net.JoinHostPort(hostIP4, strconv.Itoa(up))); err != nil {
			return err
		}
		downLn, err = net.Listen("tcp", net.JoinHostPort(hostIP4, strconv.Itoa(down)))
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", ns.Name, err)
	}
	t.Cleanup(func() { upLn.Close(); downLn.Close() })
	return upLn, downLn
}

// seededData is size bytes of pseudo-random data from seed (a multiple of 8 bytes) and
// its SHA-256, hex.
func seededData(size int, seed uint64) ([]byte, string) {
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, guestDown))
	for i := 0; i+8 <= size; i += 8 {
		binary.LittleEndian.PutUint64(data[i:], rng.Uint64())
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:])
}

// check compares what the host's ends of the transfers saw with the SHA-256 sums the
// guest printed (GUEST-UP-SHA, GUEST-DOWN-SHA) for size-byte files.
func (files *guestFiles) check(t *testing.T, console string, size int) {
	t.Helper()
	files.checkUp(t, console, size)
	if m := guestDownRe.FindStringSubmatch(console); m == nil || m[1] != files.downSum {
		t.Errorf("host->guest file: guest says sha256 %v; host sent %d bytes sha256 %s", m, files.downSize, files.downSum)
	} else {
		select {
		case d := <-files.downTook:
			t.Logf("host->guest file: %d MiB, sha256 matches; host source %v", size>>20, d.Round(time.Millisecond))
		default:
		}
	}
}

// checkUp is check's guest → host half.
func (files *guestFiles) checkUp(t *testing.T, console string, size int) {
	t.Helper()
	select {
	case r := <-files.up:
		want := guestUpRe.FindStringSubmatch(console)
		switch {
		case r.err != nil:
			t.Errorf("guest->host file: %v after %d bytes", r.err, r.n)
		case want == nil:
			t.Errorf("guest printed no GUEST-UP-SHA")
		case r.n != int64(size) || r.sum != want[1]:
			t.Errorf("guest->host file: host got %d bytes sha256 %s; guest sent %d bytes sha256 %s", r.n, r.sum, size, want[1])
		default:
			t.Logf("guest->host file: %d MiB, sha256 matches; host sink %v", size>>20, r.took.Round(time.Millisecond))
		}
	case <-time.After(10 * time.Second):
		t.Errorf("guest->host file: host sink never finished")
	}
}

// releaseGuest connects to the guest's nc -l on guestGo and closes: the guest carries on.
func releaseGuest(t *testing.T, ns *netnstest.NS) {
	t.Helper()
	if err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(guestIP4, strconv.Itoa(guestGo)), 20*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	}); err != nil {
		t.Fatalf("release guest: %v", err)
	}
}

// runFullGuest boots the battery against s's tapgro, checks everything it reports and
// returns the guest's console.
func runFullGuest(t *testing.T, s *qemuSetup, netdev string, mtu int) string {
	t.Helper()
	size := s.fileSize
	if size == 0 {
		size = guestFile
	}
	files := serveGuestFiles(t, s.ns, size)
	o := guestOpts{Flavour: s.f, NS: s.ns, Netdev: netdev, IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: mtu,
		Cmd: fullGuestCmd(size, s.guestExtra), QEMUArgs: s.guestArgs, DevOpts: s.guestDev}
	if mtu != 1500 {
		o.HostMTU = mtu
	}
	g := startGuest(t, o)
	g.waitConsole(guestWaitingRe, guestLimit)
	if s.whileWaiting != nil {
		s.whileWaiting()
	}
	// Host -> guest at the full MTU with DF set: a frame that does not fit anywhere on the
	// path (TAP, tapgro, QEMU, virtio-net) fails here instead of being fragmented.
	s.ns.MustRun(t, "ping", "-c", "2", "-W", "5", "-M", "do", "-s", strconv.Itoa(mtu-28), guestIP4)
	s.ns.MustRun(t, "ping", "-c", "2", "-W", "5", guestIP6)
	releaseGuest(t, s.ns)
	console := g.mustSucceed(guestLimit)

	if !strings.Contains(console, fmt.Sprintf(" mtu %d ", mtu)) {
		t.Errorf("guest eth0 does not have MTU %d:\n%s", mtu, console)
	}
	for _, m := range iperfSummaryRe.FindAllString(console, -1) {
		t.Logf("guest iperf3: %s", strings.TrimSpace(m))
	}
	files.check(t, console, size)
	// The guest's clock around the file phase: what the transfers cost it, dd and
	// sha256sum included (under TCG these, not the network, take the time).
	clock := map[string]float64{}
	for _, m := range guestClockRe.FindAllStringSubmatch(console, -1) {
		clock[m[1]], _ = strconv.ParseFloat(m[2], 64)
	}
	if len(clock) == 4 {
		t.Logf("guest clock: up (dd + sha256sum %.1fs, send %.1fs), down (receive + sha256sum) %.1fs",
			clock["SEND"]-clock["FILES"], clock["RECEIVE"]-clock["SEND"], clock["DONE"]-clock["RECEIVE"])
	}
	return console
}

// groCounters reads tapgro's GRO counters from /metrics, then stops it.
func groCounters(t *testing.T, s *qemuSetup) (segments, packets uint64) {
	t.Helper()
	m := scrape(t, s.ns, metricsAddr)
	segments, packets = uint64(m.get(t, mGROSegments)), uint64(m.get(t, mGROPackets))
	s.tg.stop()
	return segments, packets
}

// x86CommandLineSize is the kernel command line's limit on x86, NUL included
// (arch/x86/include/asm/setup.h COMMAND_LINE_SIZE).
const x86CommandLineSize = 2048

// TestQEMUGuest runs a real virtio-net guest against tapgro on every QEMU backend, with
// each QEMU and guest kernel flavour.
func TestQEMUGuest(t *testing.T) {
	netnstest.RequirePriv(t)
	tapgroBin(t)
	forEachFlavour(t, testQEMUGuest)
}

func testQEMUGuest(t *testing.T, f *qemuFlavour) {
	// The image on its own, no NIC: the script's output and exit status come back over
	// the serial console. The script is longer than any kernel command line and arrives
	// whole through the appended initramfs (every line counts), and the command line
	// carries no script.
	t.Run("boot", func(t *testing.T) {
		start := time.Now()
		const lines = 100
		var b strings.Builder
		b.WriteString("n=0\n")
		for i := 0; i < lines; i++ {
			fmt.Fprintf(&b, "n=$((n + 1)) # line %d of a script longer than the kernel command line\n", i)
		}
		b.WriteString("grep -q tg.cmd /proc/cmdline && echo GUEST-CMDLINE-HAS-SCRIPT\necho GUEST-SAYS-$n; exit 3\n")
		long := b.String()
		if len(long) <= x86CommandLineSize {
			t.Fatalf("the script is %d bytes, want more than %d", len(long), x86CommandLineSize)
		}
		status, console := startGuest(t, guestOpts{Name: "bare guest", Flavour: f, Cmd: long}).wait(guestLimit)
		if status != 3 {
			t.Errorf("guest exit status %d, want 3", status)
		}
		if want := fmt.Sprintf("GUEST-SAYS-%d", lines); !strings.Contains(console, want) {
			t.Errorf("%s missing from the console (the %d-byte script did not run whole):\n%s", want, len(long), console)
		}
		if strings.Contains(console, "GUEST-CMDLINE-HAS-SCRIPT") {
			t.Errorf("the kernel command line carries tg.cmd:\n%s", console)
		}
		t.Logf("%d-byte script; took %v", len(long), time.Since(start).Round(time.Millisecond))
	})

	for _, be := range qemuBackends {
		t.Run(be.name, func(t *testing.T) {
			start := time.Now()
			s := newQEMUSetup(t, f, be.tapgro, 1500)
			s.startTapgro(t, "tapgro")
			runFullGuest(t, s, be.qemu(s.dir), 1500)
			seg, pkt := groCounters(t, s)
			t.Logf("gro_segments=%d gro_packets=%d; took %v", seg, pkt, time.Since(start).Round(time.Millisecond))
		})
	}

	// A jumbo guest: host_mtu tells virtio-net the device's MTU (VIRTIO_NET_F_MTU).
	t.Run("stream-unix-mtu9000", func(t *testing.T) {
		start := time.Now()
		be := qemuBackends[0]
		s := newQEMUSetup(t, f, be.tapgro, 9000)
		s.startTapgro(t, "tapgro")
		runFullGuest(t, s, be.qemu(s.dir), 9000)
		seg, pkt := groCounters(t, s)
		t.Logf("gro_segments=%d gro_packets=%d; took %v", seg, pkt, time.Since(start).Round(time.Millisecond))
	})

	// The guest powers off and a new one connects to the same tapgro, which must have gone
	// back to accepting. Both guests only send guest->host bulk TCP, so tapgro's GRO
	// counters describe the guest's stream: with MTU frames arriving in batches, several
	// segments must share each packet.
	t.Run("guest-restart-gro", func(t *testing.T) {
		start := time.Now()
		be := qemuBackends[0]
		s := newQEMUSetup(t, f, be.tapgro, 1500)
		s.startTapgro(t, "tapgro")
		cmd := fmt.Sprintf("set -e\nping -c 2 %[1]s\niperf3 -c %[1]s -t 3\n", hostIP4)
		for i := 1; i <= 2; i++ {
			g := startGuest(t, guestOpts{Name: fmt.Sprintf("guest %d", i), Flavour: f, NS: s.ns, Netdev: be.qemu(s.dir),
				IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: cmd})
			console := g.mustSucceed(guestLimit)
			for _, m := range iperfSummaryRe.FindAllString(console, -1) {
				t.Logf("guest %d iperf3: %s", i, strings.TrimSpace(m))
			}
		}
		if n := strings.Count(s.tg.out.String(), "port connected"); n != 2 {
			t.Errorf("tapgro logged %d connections, want one per guest (2)", n)
		}
		seg, pkt := groCounters(t, s)
		t.Logf("gro_segments=%d gro_packets=%d (%.1f segments per packet); took %v",
			seg, pkt, float64(seg)/float64(max(pkt, 1)), time.Since(start).Round(time.Millisecond))
		if pkt == 0 || seg < 2*pkt {
			t.Errorf("GRO did not coalesce the guest's stream: %d segments in %d packets, want >= 2 per packet", seg, pkt)
		}
	})

	// tapgro dies and comes back while the guest keeps running: QEMU is the stream server
	// (net/stream.c re-arms its listener on disconnect) and tapgro the client that reconnects.
	t.Run("tapgro-restart", func(t *testing.T) {
		start := time.Now()
		var sock string
		s := newQEMUSetup(t, f, func(d string) string {
			sock = filepath.Join(d, "q.sock")
			return "stream,server=off,addr.type=unix,addr.path=" + sock
		}, 1500)
		g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: "stream,server=on,addr.type=unix,addr.path=" + sock,
			IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: restartGuestCmd()})
		s.startTapgro(t, "tapgro")
		s.tg.waitLog(portConnectedRe, guestLimit)
		restartTapgroUnderGuest(t, s, g)
		t.Logf("took %v", time.Since(start).Round(time.Millisecond))
	})

	// The roles reversed: tapgro is the stream server and QEMU the client, which
	// reconnects by itself when tapgro comes back (StreamReconnect: QEMU 8.0 and later;
	// 7.2's client connects once). With such a QEMU either side of the stream path may
	// restart under a running guest.
	if f.StreamReconnect() != "" {
		t.Run("stream-client-reconnect", func(t *testing.T) {
			start := time.Now()
			be := qemuBackends[0]
			s := newQEMUSetup(t, f, be.tapgro, 1500)
			s.startTapgro(t, "tapgro")
			// tapgro's hint, written for this QEMU (--qemu-version), gives the option
			// this test boots QEMU with.
			if out := s.tg.out.String(); !strings.Contains(out, "give QEMU "+f.version()+": -netdev stream,id=n0,") ||
				!strings.Contains(out, ","+f.StreamReconnect()+" -device virtio-net-pci") {
				t.Errorf("tapgro's ready line does not give QEMU %s's stream client option %s:\n%s", f.version(), f.StreamReconnect(), out)
			}
			g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: be.qemu(s.dir) + "," + f.StreamReconnect(),
				IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: restartGuestCmd()})
			s.tg.waitLog(portConnectedRe, guestLimit)
			restartTapgroUnderGuest(t, s, g)
			t.Logf("took %v", time.Since(start).Round(time.Millisecond))
		})
	}
}

// restartGuestCmd is the guest's side of a tapgro restart: it waits for the host, says
// GUEST-WAITING and waits on guestGo while tapgro is killed and restarted, then pings
// and runs iperf3 through the new tapgro.
func restartGuestCmd() string {
	return fmt.Sprintf(`ping -c 1 -W 30 %[1]s
echo GUEST-WAITING
nc -l -p %[3]d </dev/null >/dev/null
set -e
ping -c 3 %[1]s
ping6 -c 3 %[2]s
iperf3 -c %[1]s -t 2
`, hostIP4, hostIP6, guestGo)
}

// restartTapgroUnderGuest is the host's side: once g (running restartGuestCmd) and s's
// tapgro are connected and the guest answers, tapgro is SIGKILLed and started again; the
// new tapgro must get a connection, the guest must answer pings again, and its pings and
// iperf3 must succeed.
func restartTapgroUnderGuest(t *testing.T, s *qemuSetup, g *guest) {
	t.Helper()
	g.waitConsole(guestWaitingRe, guestLimit)
	waitPing(t, s.ns, guestIP4, 30*time.Second)

	s.tg.kill()
	restarted := time.Now()
	s.startTapgro(t, "tapgro (restarted)")
	s.tg.waitLog(portConnectedRe, 30*time.Second)
	waitPing(t, s.ns, guestIP4, 60*time.Second)
	waitPing(t, s.ns, guestIP6, 30*time.Second)
	t.Logf("traffic resumed %v after the restart", time.Since(restarted).Round(time.Millisecond))
	releaseGuest(t, s.ns)
	console := g.mustSucceed(guestLimit)
	for _, m := range iperfSummaryRe.FindAllString(console, -1) {
		t.Logf("guest iperf3: %s", strings.TrimSpace(m))
	}
	s.tg.stop()
}
