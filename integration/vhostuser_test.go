//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// tapgro as QEMU's vhost-user back-end (--netdev vhost-user,path=P): QEMU connects to P
// (-chardev socket with the flavour's ChardevReconnect) and hands over the guest's RAM (a shared memfd) and
// rings; vhostnet moves frames between them and the TAP, with no GRO engine between.
//
//	netns                                 QEMU (TCG), same netns
//	198.18.0.1 ─ tg0 ─ tapgro ══ vhost-user (guest RAM, rings) ══ virtio-net ─ eth0 198.18.0.2
//
// Under TCG the NIC of QEMU before 10.0 needs vectors=0 (qemuFlavour.Vectors0).

// vhostUserGuest is what f's QEMU needs on top of the guest's -netdev: RAM (the
// harness's -m 256) in a memfd the back-end can map, and the chardev connected to sock,
// retrying while the back-end is away.
func vhostUserGuest(f *qemuFlavour, sock string) (args []string, netdev, dev string) {
	return []string{
		"-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-machine", "memory-backend=mem",
		"-chardev", "socket,id=vu0,path=" + sock + "," + f.ChardevReconnect(),
	}, "vhost-user,chardev=vu0", f.devOpts()
}

var vhostExitRe = regexp.MustCompile(`tapgro exiting.*`)

func vhostCounter(t *testing.T, line, name string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`\b` + name + `=(\d+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no %s in %q", name, line)
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

func newVhostUserSetup(t *testing.T, f *qemuFlavour, mtu int) (*qemuSetup, string) {
	t.Helper()
	s := &qemuSetup{f: f, ns: netnstest.New(t, "vu"), dir: t.TempDir()}
	sock := filepath.Join(s.dir, "vu.sock")
	s.args = []string{"--tap", "tg0", "--mtu", strconv.Itoa(mtu), "--addr", hostIP4 + "/24", "--addr", hostIP6 + "/64",
		"--netdev", "vhost-user,path=" + sock, "--metrics-addr", metricsAddr, "--ctl-socket", filepath.Join(s.dir, "ctl"),
		"--qemu-version", f.version()}
	startIperf3Server(t, s.ns)
	return s, sock
}

// vhostStatus is `tapgro ctl --json status` of s's tapgro (ctlVhostJSON: vhostops_test.go).
func vhostStatus(t *testing.T, s *qemuSetup) ctlVhostJSON {
	t.Helper()
	out, err := ctl(t, s.ns, filepath.Join(s.dir, "ctl"), "--json", "status")
	if err != nil {
		t.Fatalf("tapgro ctl status: %v\n%s", err, out)
	}
	var st ctlVhostJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Status.Vhost == nil {
		t.Fatalf("ctl status reply %q: %v", out, err)
	}
	return st
}

// vhostFile is the size of each hashed file in the "full" run. Under TCG the guest's dd
// and sha256sum, not the network, take most of the time: about 4 s to make and hash the
// upload, 2 s to send it, 4-6 s to receive and hash the download on this 2-CPU box.
const vhostFile = 64 << 20

// virtioFeature is a virtio feature bit and its name in the virtio spec.
type virtioFeature struct {
	bit  int
	name string
}

// The virtio-net feature bits the guest must have negotiated with tapgro (virtio 1.2
// section 5.1.3 "Feature bits"; VERSION_1 is section 6 "Reserved Feature Bits").
var vhostWantFeatures = []virtioFeature{
	{0, "CSUM"}, {1, "GUEST_CSUM"}, {7, "GUEST_TSO4"}, {8, "GUEST_TSO6"},
	{11, "HOST_TSO4"}, {12, "HOST_TSO6"}, {15, "MRG_RXBUF"}, {32, "VERSION_1"},
}

// guestFeaturesCmd prints the driver's negotiated features, the virtio device's sysfs
// "features" file (linux drivers/virtio/virtio.c features_show: one '0'/'1' per bit of
// dev->features, bit 0 first), and the offloads the virtio-net driver derived from them
// (drivers/net/virtio_net.c virtnet_probe: HOST_TSO4 → NETIF_F_TSO).
const guestFeaturesCmd = `echo "GUEST-FEATURES=$(cat /sys/class/net/eth0/device/features)"
ethtool -k eth0`

var (
	guestFeaturesRe = regexp.MustCompile(`GUEST-FEATURES=([01]+)`)
	logWarnRe       = regexp.MustCompile(`level=(warning|error|fatal|panic)`)
	// vhostnet's FeaturesAcked log line: what QEMU sent in SET_FEATURES.
	vhostAckedRe = regexp.MustCompile(`guest features acked" features=(0x[0-9a-f]+) header_bytes=(\d+)`)
	// The same line with the bits' names, and the guest's ethtool -k line for USO.
	vhostAckedNamesRe = regexp.MustCompile(`guest features acked" features=(0x[0-9a-f]+) header_bytes=\d+ names="?([^"]*)"?`)
	guestUSORe        = regexp.MustCompile(`(?m)^tx-udp-segmentation: .*$`)
)

// checkGuestFeatures checks that the guest's driver negotiated every bit of
// vhostWantFeatures and extra, that the same bits reached tapgro in SET_FEATURES (QEMU passes the
// acked bits on to the back-end, hw/net/vhost_net.c vhost_net_ack_features), that the
// header is 12 bytes (virtio 1.2 5.1.6 "Device Operation": num_buffers is there with
// VERSION_1 or MRG_RXBUF), and that the guest's stack uses TSO and checksum offload.
func checkGuestFeatures(t *testing.T, console, tapgroLog string, extra ...virtioFeature) {
	t.Helper()
	m := guestFeaturesRe.FindStringSubmatch(console)
	if m == nil {
		t.Fatalf("guest printed no GUEST-FEATURES")
	}
	bits := m[1]
	acks := vhostAckedRe.FindAllStringSubmatch(tapgroLog, -1)
	if len(acks) == 0 {
		t.Fatalf("tapgro logged no SET_FEATURES")
	}
	last := acks[len(acks)-1]
	acked, err := strconv.ParseUint(last[1], 0, 64)
	if err != nil {
		t.Fatalf("tapgro's acked features %q: %v", last[1], err)
	}
	t.Logf("guest features %s; tapgro acked %#x, header %s bytes", bits, acked, last[2])
	for _, f := range append(vhostWantFeatures[:len(vhostWantFeatures):len(vhostWantFeatures)], extra...) {
		if f.bit >= len(bits) || bits[f.bit] != '1' {
			t.Errorf("guest did not negotiate %s (bit %d): features %s", f.name, f.bit, bits)
		}
		if acked&(1<<f.bit) == 0 {
			t.Errorf("tapgro's SET_FEATURES %#x lacks %s (bit %d)", acked, f.name, f.bit)
		}
	}
	if last[2] != "12" {
		t.Errorf("tapgro's header length is %s bytes, want 12", last[2])
	}
	for _, want := range []string{"tcp-segmentation-offload: on", "tx-checksumming: on"} {
		if !strings.Contains(console, want) {
			t.Errorf("guest's ethtool -k eth0 does not show %q", want)
		}
	}
}

// logUSO logs which UDP segmentation offloads (virtio 1.2 5.1.3: GUEST_USO4 54,
// GUEST_USO6 55, HOST_USO 56) the last SET_FEATURES from f's QEMU acked, and the guest's
// own view of its NIC's USO (ethtool -k). Nothing is asserted: tapgro does not offer
// them yet, and QEMU offers the guest no USO bit on a vhost-user NIC whatever the
// back-end offers (hw/net/virtio-net.c virtio_net_get_features clears them unless
// peer_has_uso; net/net.c qemu_has_uso is false for a peer without has_uso, which
// net/vhost-user.c's net_vhost_user_info does not set). The log says per QEMU what a
// guest gets.
func logUSO(t *testing.T, f *qemuFlavour, console, tapgroLog string) {
	t.Helper()
	acks := vhostAckedNamesRe.FindAllStringSubmatch(tapgroLog, -1)
	if len(acks) == 0 {
		t.Errorf("tapgro logged no SET_FEATURES")
		return
	}
	last := acks[len(acks)-1]
	acked, _ := strconv.ParseUint(last[1], 0, 64)
	t.Logf("QEMU %d.%d's SET_FEATURES, as tapgro saw it: %s (%s)", f.Major, f.Minor, last[1], last[2])
	has := func(bit int) bool { return acked&(1<<bit) != 0 }
	t.Logf("QEMU %d.%d acked USO: GUEST_USO4=%v GUEST_USO6=%v HOST_USO=%v", f.Major, f.Minor, has(54), has(55), has(56))
	if m := guestFeaturesRe.FindStringSubmatch(console); m != nil {
		bit := func(i int) bool { return i < len(m[1]) && m[1][i] == '1' }
		t.Logf("guest negotiated USO: GUEST_USO4=%v GUEST_USO6=%v HOST_USO=%v", bit(54), bit(55), bit(56))
	}
	if l := guestUSORe.FindString(console); l != "" {
		t.Logf("guest ethtool -k eth0: %s", l)
	} else {
		t.Logf("guest ethtool -k eth0 shows no tx-udp-segmentation line")
	}
}

// vhostLogProblems is every warning or error tapgro logged (vhostnet's SET_FEATURES
// report is info).
func vhostLogProblems(log string) []string {
	var bad []string
	for _, l := range strings.Split(log, "\n") {
		if !logWarnRe.MatchString(l) {
			continue
		}
		bad = append(bad, l)
	}
	return bad
}

// qemuComplaintRe is a message QEMU's error_report printed (util/error-report.c prefixes
// the program name); QEMU's stderr shares the console with the guest's serial output.
var qemuComplaintRe = regexp.MustCompile(`qemu-system-x86_64: .*`)

// checkQEMUQuiet fails the test if QEMU reported an error: with tapgro alive throughout,
// every vhost-user request (GET_VRING_BASE at the guest's power-off included) must have
// succeeded. When the back-end dies QEMU prints "Failed to set msg fds."
// (hw/virtio/vhost-user.c vhost_user_write, the chardev is gone) and "vhost VQ n ring
// restore failed" (hw/virtio/vhost.c vhost_virtqueue_stop, GET_VRING_BASE unanswered),
// so tapgro-restart, which SIGKILLs tapgro, does not use this.
func checkQEMUQuiet(t *testing.T, name, console string) {
	t.Helper()
	if m := qemuComplaintRe.FindAllString(console, -1); len(m) > 0 {
		t.Errorf("%s: QEMU reported:\n%s", name, strings.Join(m, "\n"))
	}
}

// snmpCounter reads one counter of ns's /proc/net/snmp ("Ip: ... ReasmReqds ...") or
// /proc/net/snmp6 ("Ip6ReasmReqds N"); /proc/net is the reading process's namespace.
func snmpCounter(t *testing.T, ns *netnstest.NS, file, proto, name string) uint64 {
	t.Helper()
	lines := strings.Split(string(ns.MustRun(t, "cat", file)), "\n")
	for i, l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) == 2 && f[0] == name:
			n, _ := strconv.ParseUint(f[1], 10, 64)
			return n
		case len(f) > 1 && f[0] == proto+":" && i+1 < len(lines):
			v := strings.Fields(lines[i+1])
			for j := 1; j < len(f) && j < len(v); j++ {
				if f[j] == name {
					n, _ := strconv.ParseUint(v[j], 10, 64)
					return n
				}
			}
		}
	}
	t.Fatalf("no %s in %s", name, file)
	return 0
}

// TestQEMUVhostUser runs the real guest's whole battery (ping v4/v6, iperf3 both ways, a
// hashed file each way, a DF ping at the MTU) with its NIC on tapgro's vhost-user socket,
// at MTU 1500 and 9000, and restarts each side under the other.
func TestQEMUVhostUser(t *testing.T) {
	netnstest.RequirePriv(t)
	tapgroBin(t)
	forEachFlavour(t, testQEMUVhostUser)
}

func testQEMUVhostUser(t *testing.T, f *qemuFlavour) {
	// The battery with 64 MiB files, after the guest printed what it negotiated: the
	// offloads must be on end to end, and GSO frames must cross vhostnet whole both ways.
	t.Run("full", func(t *testing.T) {
		start := time.Now()
		s, sock := newVhostUserSetup(t, f, 1500)
		s.startTapgro(t, "tapgro")
		// tapgro's hint, written for this QEMU (--qemu-version), gives the options this
		// test boots QEMU with: its chardev reconnect, and vectors=0 only where needed.
		if out := s.tg.out.String(); !strings.Contains(out, "give QEMU "+f.version()+": ") ||
			!strings.Contains(out, "-chardev socket,id=vu0,path="+sock+","+f.ChardevReconnect()+" ") ||
			strings.Contains(out, "vectors=0") != f.Vectors0() {
			t.Errorf("tapgro's ready line does not give QEMU %s's options (%s, vectors=0 %v):\n%s", f.version(), f.ChardevReconnect(), f.Vectors0(), out)
		}
		var netdev string
		s.guestArgs, netdev, s.guestDev = vhostUserGuest(f, sock)
		s.fileSize = vhostFile
		s.guestExtra = guestFeaturesCmd
		s.whileWaiting = func() {
			// The guest's GUEST_TSO4/6 acks became the TAP's offloads (vhostnet
			// FeaturesAcked → TUNSETOFFLOAD; drivers/net/tun.c set_offload turns
			// them into the netdev's TSO features), read back from the kernel.
			if got := ethtoolOffloads(t, s.ns, "tg0"); !strings.Contains(got, "tso4") || !strings.Contains(got, "tso6") {
				t.Errorf("tg0's offloads with the guest connected: %s, want tso4 and tso6", got)
			}
		}
		console := runFullGuest(t, s, netdev, 1500)
		checkQEMUQuiet(t, "guest", console)
		checkGuestFeatures(t, console, s.tg.out.String())
		logUSO(t, f, console, s.tg.out.String())
		m := scrape(t, s.ns, metricsAddr)
		// Both directions carry bulk TCP (iperf3 both ways, the files), so with the
		// offloads on GSO frames go through whole: from the guest's TSO (HOST_TSO4) to
		// the TAP, and from the host's TCP through the TAP to the guest (GUEST_TSO4).
		for _, name := range []string{`tapgro_frames_total{direction="port_to_tap"}`, `tapgro_frames_total{direction="tap_to_port"}`,
			`tapgro_gso_passthrough_total{direction="port_to_tap"}`, `tapgro_gso_passthrough_total{direction="tap_to_port"}`,
			`tapgro_port_connects_total`} {
			if v := m.get(t, name); v < 1 {
				t.Errorf("%s = %v after the guest's traffic", name, v)
			}
		}
		for _, name := range []string{`tapgro_bytes_total{direction="port_to_tap"}`, `tapgro_bytes_total{direction="tap_to_port"}`} {
			if v := m.get(t, name); v < vhostFile {
				t.Errorf("%s = %v, want >= %d (a hashed file each way)", name, v, vhostFile)
			}
		}
		t.Logf("metrics: %v", m.pick(t, `tapgro_gso_passthrough_total{direction="port_to_tap"}`,
			`tapgro_gso_passthrough_total{direction="tap_to_port"}`, `tapgro_rx_stalls_total`))
		// Every tapgro_vhost_* series in docs/metrics.md is exported, and everything
		// exported is in docs/metrics.md.
		metricsDoc := metricsDocText(t)
		for _, name := range documentedMetrics(t) {
			if !strings.HasPrefix(name, "tapgro_vhost_") {
				continue
			}
			found := false
			for k := range m {
				found = found || k == name || strings.HasPrefix(k, name+"{")
			}
			if !found {
				t.Errorf("documented metric %s missing from the scrape", name)
			}
		}
		for k := range m {
			if name, _, _ := strings.Cut(k, "{"); strings.HasPrefix(name, "tapgro_") && !strings.Contains(metricsDoc, "`"+name+"`") {
				t.Errorf("scraped metric %s is not documented", name)
			}
		}
		s.tg.stop()
		line := vhostExitRe.FindString(s.tg.out.String())
		tx, rx := vhostCounter(t, line, "port_to_tap_frames"), vhostCounter(t, line, "tap_to_port_frames")
		t.Logf("tapgro: %s; took %v", line, time.Since(start).Round(time.Millisecond))
		if tx < 1000 || rx < 1000 {
			t.Errorf("port_to_tap_frames=%d tap_to_port_frames=%d: the guest's traffic did not go through vhostnet", tx, rx)
		}
		if bad := vhostLogProblems(s.tg.out.String()); len(bad) > 0 {
			t.Errorf("tapgro logged:\n%s", strings.Join(bad, "\n"))
		}
	})

	// Jumbo frames: the TAP and the guest at MTU 9000. host_mtu=9000 gives the guest
	// VIRTIO_NET_F_MTU with 9000 in its config space, and QEMU tells the back-end in
	// NET_SET_MTU (hw/net/virtio-net.c virtio_net_vhost_status → vhost_net_set_mtu; sent
	// because tapgro offers PROTOCOL_F_NET_MTU, hw/virtio/vhost-user.c
	// vhost_user_net_set_mtu). Full-size DF pings both ways, then the battery (iperf3,
	// hashed files).
	t.Run("mtu9000", func(t *testing.T) {
		start := time.Now()
		s, sock := newVhostUserSetup(t, f, 9000)
		s.startTapgro(t, "tapgro")
		var netdev string
		s.guestArgs, netdev, s.guestDev = vhostUserGuest(f, sock)
		// /usr/bin/ping is iputils' (build.sh): busybox's ping cannot set DF.
		s.guestExtra = guestFeaturesCmd + fmt.Sprintf("\n/usr/bin/ping -c 2 -W 5 -M do -s 8972 %s\n/usr/bin/ping -6 -c 2 -W 5 -M do -s 8952 %s",
			hostIP4, hostIP6)
		const frame = 14 + 9000
		s.whileWaiting = func() {
			if st := vhostStatus(t, s); st.Status.Vhost.MTU != 9000 {
				t.Errorf("ctl status: guest MTU %d, want 9000 (QEMU's NET_SET_MTU)", st.Status.Vhost.MTU)
			}
			// Host → guest, the guest idle: the requests and replies are (nearly)
			// all that crosses vhostnet here, and they must be counted at full size.
			keys := []string{`tapgro_bytes_total{direction="tap_to_port"}`, `tapgro_bytes_total{direction="port_to_tap"}`}
			before := scrape(t, s.ns, metricsAddr).pick(t, keys...)
			s.ns.MustRun(t, "ping", "-c", "2", "-W", "5", "-M", "do", "-s", "8972", guestIP4)
			s.ns.MustRun(t, "ping", "-6", "-c", "2", "-W", "5", "-M", "do", "-s", "8952", guestIP6)
			after := scrape(t, s.ns, metricsAddr).pick(t, keys...)
			for _, k := range keys {
				if d := after[k] - before[k]; d < 4*frame {
					t.Errorf("%s grew by %v over 4 full-size pings, want >= %d", k, d, 4*frame)
				}
			}
		}
		console := runFullGuest(t, s, netdev, 9000)
		checkQEMUQuiet(t, "guest", console)
		checkGuestFeatures(t, console, s.tg.out.String(), virtioFeature{3, "MTU"})
		// Every ping above crossed as one frame: the host reassembled nothing (with -M
		// do neither side fragments locally; a path that split frames would show here).
		if n := snmpCounter(t, s.ns, "/proc/net/snmp", "Ip", "ReasmReqds"); n != 0 {
			t.Errorf("host reassembled %d IPv4 fragments", n)
		}
		if n := snmpCounter(t, s.ns, "/proc/net/snmp6", "", "Ip6ReasmReqds"); n != 0 {
			t.Errorf("host reassembled %d IPv6 fragments", n)
		}
		// The hashed files alone are guestFile each way.
		m := scrape(t, s.ns, metricsAddr)
		for _, k := range []string{`tapgro_bytes_total{direction="port_to_tap"}`, `tapgro_bytes_total{direction="tap_to_port"}`} {
			if v := m.get(t, k); v < guestFile {
				t.Errorf("%s = %v, want >= %d: the guest's traffic did not go through vhostnet", k, v, guestFile)
			}
		}
		s.tg.stop()
		if bad := vhostLogProblems(s.tg.out.String()); len(bad) > 0 {
			t.Errorf("tapgro logged:\n%s", strings.Join(bad, "\n"))
		}
		t.Logf("tapgro: %s; took %v", vhostExitRe.FindString(s.tg.out.String()), time.Since(start).Round(time.Millisecond))
	})

	// The guest powers off (QEMU exits, closing the socket) and a second QEMU connects to
	// the same tapgro, which must have ended the first session and gone back to
	// accepting: the second guest's traffic works and is counted on top of the first's.
	t.Run("guest-restart", func(t *testing.T) {
		start := time.Now()
		s, sock := newVhostUserSetup(t, f, 1500)
		s.startTapgro(t, "tapgro")
		args, netdev, dev := vhostUserGuest(f, sock)
		// A fixed amount each way (-n, not -t), so what the counters must grow by does
		// not depend on how fast TCG is.
		const bulk = 32 << 20
		cmd := fmt.Sprintf("set -e\nping -c 2 %[1]s\nping6 -c 2 %[2]s\niperf3 -c %[1]s -n %[3]d\niperf3 -c %[1]s -n %[3]d -R\n",
			hostIP4, hostIP6, bulk)
		keys := []string{`tapgro_bytes_total{direction="port_to_tap"}`, `tapgro_bytes_total{direction="tap_to_port"}`}
		prev := map[string]float64{}
		for i := 1; i <= 2; i++ {
			g := startGuest(t, guestOpts{Name: fmt.Sprintf("guest %d", i), Flavour: f, NS: s.ns, Netdev: netdev, QEMUArgs: args, DevOpts: dev,
				IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: cmd})
			console := g.mustSucceed(guestLimit) // the guest powered off and QEMU exited
			checkQEMUQuiet(t, g.name, console)
			for _, m := range iperfSummaryRe.FindAllString(console, -1) {
				t.Logf("guest %d iperf3: %s", i, strings.TrimSpace(m))
			}
			cur := scrape(t, s.ns, metricsAddr).pick(t, keys...)
			for _, k := range keys {
				if d := cur[k] - prev[k]; d < bulk {
					t.Errorf("guest %d: %s grew by %v, want >= %d (its iperf3 -n)", i, k, d, bulk)
				}
			}
			prev = cur
		}
		if n := scrape(t, s.ns, metricsAddr).get(t, `tapgro_port_connects_total`); n != 2 {
			t.Errorf("tapgro_port_connects_total = %v, want one per guest (2)", n)
		}
		s.tg.stop()
		if bad := vhostLogProblems(s.tg.out.String()); len(bad) > 0 {
			t.Errorf("tapgro logged:\n%s", strings.Join(bad, "\n"))
		}
		t.Logf("took %v", time.Since(start).Round(time.Millisecond))
	})

	// tapgro dies and comes back while the guest runs: QEMU's chardev reconnects
	// (ChardevReconnect) and the new session starts over from GET_FEATURES.
	t.Run("tapgro-restart", func(t *testing.T) {
		start := time.Now()
		s, sock := newVhostUserSetup(t, f, 1500)
		s.startTapgro(t, "tapgro")
		args, netdev, dev := vhostUserGuest(f, sock)
		cmd := fmt.Sprintf(`ping -c 1 -W 30 %[1]s
echo GUEST-WAITING
nc -l -p %[2]d </dev/null >/dev/null
set -e
ping -c 3 %[1]s
iperf3 -c %[1]s -t 2
`, hostIP4, guestGo)
		g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: netdev, QEMUArgs: args, DevOpts: dev,
			IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: cmd})
		g.waitConsole(guestWaitingRe, guestLimit)
		waitPing(t, s.ns, guestIP4, 30*time.Second)

		s.tg.kill()
		s.startTapgro(t, "tapgro (restarted)")
		waitPing(t, s.ns, guestIP4, 60*time.Second)
		releaseGuest(t, s.ns)
		console := g.mustSucceed(guestLimit)
		for _, m := range iperfSummaryRe.FindAllString(console, -1) {
			t.Logf("guest iperf3: %s", strings.TrimSpace(m))
		}
		s.tg.stop()
		if bad := vhostLogProblems(s.tg.out.String()); len(bad) > 0 {
			t.Errorf("restarted tapgro logged:\n%s", strings.Join(bad, "\n"))
		}
		t.Logf("took %v", time.Since(start).Round(time.Millisecond))
	})
}
