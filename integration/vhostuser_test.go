//go:build linux

package integration

import (
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
// (-chardev socket,reconnect=1) and hands over the guest's RAM (a shared memfd) and
// rings; vhostnet moves frames between them and the TAP, with no GRO engine between.
//
//	netns                                 QEMU (TCG), same netns
//	198.18.0.1 ─ tg0 ─ tapgro ══ vhost-user (guest RAM, rings) ══ virtio-net ─ eth0 198.18.0.2
//
// Under TCG the NIC needs vectors=0: QEMU 7.2 crashes in msix_set_vector_notifiers from
// vhost_net_start with MSI-X.

// vhostUserGuest is what QEMU needs on top of the guest's -netdev: RAM (the harness's -m
// 256) in a memfd the back-end can map, and the chardev connected to sock.
func vhostUserGuest(sock string) (args []string, netdev, dev string) {
	return []string{
		"-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-machine", "memory-backend=mem",
		"-chardev", "socket,id=vu0,path=" + sock + ",reconnect=1",
	}, "vhost-user,chardev=vu0", ",vectors=0"
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

func newVhostUserSetup(t *testing.T) (*qemuSetup, string) {
	t.Helper()
	s := &qemuSetup{ns: netnstest.New(t, "vu"), dir: t.TempDir()}
	sock := filepath.Join(s.dir, "vu.sock")
	s.args = []string{"--tap", "tg0", "--mtu", "1500", "--addr", hostIP4 + "/24", "--addr", hostIP6 + "/64",
		"--netdev", "vhost-user,path=" + sock, "--metrics-addr", metricsAddr}
	startIperf3Server(t, s.ns)
	return s, sock
}

// TestQEMUVhostUser runs the real guest's whole battery (ping v4/v6, iperf3 both ways, a
// hashed file each way, a DF ping at the MTU) with its NIC on tapgro's vhost-user socket.
func TestQEMUVhostUser(t *testing.T) {
	netnstest.RequirePriv(t)
	guestImage(t)
	tapgroBin(t)

	t.Run("full", func(t *testing.T) {
		start := time.Now()
		s, sock := newVhostUserSetup(t)
		s.startTapgro(t, "tapgro")
		if out := s.tg.out.String(); !strings.Contains(out, "-chardev socket,id=vu0,path="+sock+",reconnect=1") ||
			!strings.Contains(out, "vectors=0") {
			t.Errorf("tapgro's ready line does not give the QEMU options:\n%s", out)
		}
		var netdev string
		s.guestArgs, netdev, s.guestDev = vhostUserGuest(sock)
		runFullGuest(t, s, netdev, 1500)
		m := scrape(t, s.ns, metricsAddr)
		for _, name := range []string{`tapgro_vhost_frames_total{direction="port_to_tap"}`, `tapgro_vhost_frames_total{direction="tap_to_port"}`,
			`tapgro_gso_passthrough_total{direction="port_to_tap"}`, `tapgro_vhost_sessions_total`} {
			if v := m.get(t, name); v < 1 {
				t.Errorf("%s = %v after the guest's traffic", name, v)
			}
		}
		// Every tapgro_vhost_* series in the README is exported, and everything exported
		// is in the README.
		readme := readmeText(t)
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
			if name, _, _ := strings.Cut(k, "{"); strings.HasPrefix(name, "tapgro_") && !strings.Contains(readme, "`"+name+"`") {
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
	})

	// tapgro dies and comes back while the guest runs: QEMU's chardev reconnects
	// (reconnect=1) and the new session starts over from GET_FEATURES.
	t.Run("tapgro-restart", func(t *testing.T) {
		start := time.Now()
		s, sock := newVhostUserSetup(t)
		s.startTapgro(t, "tapgro")
		args, netdev, dev := vhostUserGuest(sock)
		cmd := fmt.Sprintf(`ping -c 1 -W 30 %[1]s
echo GUEST-WAITING
nc -l -p %[2]d </dev/null >/dev/null
set -e
ping -c 3 %[1]s
iperf3 -c %[1]s -t 2
`, hostIP4, guestGo)
		g := startGuest(t, guestOpts{NS: s.ns, Netdev: netdev, QEMUArgs: args, DevOpts: dev,
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
		t.Logf("took %v", time.Since(start).Round(time.Millisecond))
	})
}
