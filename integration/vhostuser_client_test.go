//go:build linux

package integration

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// tapgro as QEMU's vhost-user back-end with the socket's roles reversed (--netdev
// vhost-user,path=P,server=off): QEMU listens on P (-chardev socket,server=on,wait=off)
// and tapgro dials it, with the stream client's backoff while P is missing or refuses,
// and again after every session.
//
//	netns                                 QEMU (TCG), same netns, listening on P
//	198.18.0.1 ─ tg0 ─ tapgro ══ vhost-user (guest RAM, rings) ══ virtio-net ─ eth0 198.18.0.2
//
// What QEMU 7.2 does, as measured here (and in its source); 10.0 passes the same checks:
//
//   - wait=off does not let the machine start without a back-end: -netdev vhost-user
//     waits in net_vhost_user_init (net/vhost-user.c), which loops on
//     qemu_chr_fe_wait_connected until the first vhost_user_start has succeeded; for a
//     listening chardev that is tcp_chr_wait_connected → tcp_chr_accept_server_sync
//     (chardev/char-socket.c), which prints "QEMU waiting for connection on:
//     disconnected:unix:P,server=on" and blocks in accept. The guest does not boot and
//     the monitor does not answer until tapgro connects.
//   - When tapgro goes away (killed, or a clean exit), QEMU's chardev sees the hang-up
//     (tcp_chr_hup → tcp_chr_disconnect_locked), which re-arms the listener
//     (qio_net_listener_set_client_func_full(…, tcp_chr_accept, …)); `info chardev`
//     then says "disconnected:unix:P,server=on". net_vhost_user_event gets
//     CHR_EVENT_CLOSED and its bottom half chr_closed_bh sets the link down
//     (qmp_set_link(name, false)): the guest's eth0 loses carrier. Stopping vhost logs
//     "Failed to set msg fds." and "vhost VQ N ring restore failed: -22" (GET_VRING_BASE
//     cannot be sent on a closed chardev; hw/virtio/vhost.c vhost_virtqueue_stop then
//     restores last_avail_idx from the used ring instead).
//   - The next connection is accepted at once (CHR_EVENT_OPENED → vhost_user_start from
//     GET_FEATURES, then qmp_set_link(name, true)): carrier returns and traffic resumes
//     with the guest's driver untouched. QEMU removes P when it exits, so a tapgro
//     outliving QEMU retries on ENOENT until the next QEMU listens.

// vhostUserClientGuest is what f's QEMU needs for a tapgro with server=off: RAM (the
// harness's -m 256) in a memfd the back-end can map, the chardev listening on sock, and
// an HMP monitor on mon to ask QEMU about the chardev.
func vhostUserClientGuest(f *qemuFlavour, sock, mon string) (args []string, netdev, dev string) {
	return []string{
		"-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-machine", "memory-backend=mem",
		"-chardev", "socket,id=vu0,path=" + sock + ",server=on,wait=off",
		"-monitor", "unix:" + mon + ",server=on,wait=off",
	}, "vhost-user,chardev=vu0", f.devOpts()
}

// newVhostUserClientSetup is a namespace with iperf3 -s and the arguments of a tapgro
// that dials QEMU's socket; debug logging shows its retries.
func newVhostUserClientSetup(t *testing.T, f *qemuFlavour) (s *qemuSetup, sock, mon string) {
	t.Helper()
	s = &qemuSetup{f: f, ns: netnstest.New(t, "vuc"), dir: t.TempDir()}
	sock = filepath.Join(s.dir, "qemu-vu.sock")
	mon = filepath.Join(s.dir, "hmp.sock")
	s.args = []string{"--tap", "tg0", "--mtu", "1500", "--addr", hostIP4 + "/24", "--addr", hostIP6 + "/64",
		"--netdev", "vhost-user,path=" + sock + ",server=off", "--log-level", "debug"}
	startIperf3Server(t, s.ns)
	return s, sock, mon
}

// hmp runs one human-monitor command on QEMU's monitor socket and returns its output.
func hmp(t *testing.T, mon, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("unix", mon, 5*time.Second)
	if err != nil {
		t.Fatalf("monitor %s: %v", mon, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	prompt := func() string {
		var b strings.Builder
		for !strings.HasSuffix(b.String(), "(qemu) ") {
			ch, err := r.ReadByte()
			if err != nil {
				t.Fatalf("monitor %s after %q: %v", mon, b.String(), err)
			}
			b.WriteByte(ch)
		}
		return b.String()
	}
	prompt()
	fmt.Fprintf(c, "%s\n", cmd)
	return strings.ReplaceAll(prompt(), "\r", "")
}

// waitChardev polls `info chardev` until vu0's filename is want.
func waitChardev(t *testing.T, mon, want string, limit time.Duration) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^vu0: filename=(\S+)`)
	deadline := time.Now().Add(limit)
	for {
		out := hmp(t, mon, "info chardev")
		m := re.FindStringSubmatch(out)
		if m != nil && m[1] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU's chardev vu0 is not %q after %v:\n%s", want, limit, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

var (
	vhostRetryRe   = regexp.MustCompile(`peer not reachable yet.*no such file or directory`)
	qemuWaitingRe  = regexp.MustCompile(`QEMU waiting for connection on: disconnected:unix:\S+,server=on`)
	guestStartedRe = regexp.MustCompile(`TAPGRO-GUEST-START`)
	// Carrier up, down when the back-end went away, up again when the new one connected.
	carrierDownRe    = regexp.MustCompile(`GUEST-CARRIER=1\s[\s\S]*GUEST-CARRIER=0\s`)
	carrierUpAgainRe = regexp.MustCompile(`GUEST-CARRIER=1\s[\s\S]*GUEST-CARRIER=0\s[\s\S]*GUEST-CARRIER=1\s`)
)

// vhostExit reads tapgro's exit line and the frame and session counts on it.
func vhostExit(t *testing.T, p *proc) (line string, tx, rx, sessions uint64) {
	t.Helper()
	line = vhostExitRe.FindString(p.out.String())
	return line, vhostCounter(t, line, "port_to_tap_frames"), vhostCounter(t, line, "tap_to_port_frames"), vhostCounter(t, line, "sessions")
}

func logIperf(t *testing.T, console string) {
	for _, m := range iperfSummaryRe.FindAllString(console, -1) {
		t.Logf("guest iperf3: %s", strings.TrimSpace(m))
	}
}

// TestQEMUVhostUserClient: tapgro with server=off against a real QEMU, of each flavour,
// that serves the chardev.
func TestQEMUVhostUserClient(t *testing.T) {
	netnstest.RequirePriv(t)
	tapgroBin(t)
	forEachFlavour(t, testQEMUVhostUserClient)
}

func testQEMUVhostUserClient(t *testing.T, f *qemuFlavour) {
	// tapgro first: it retries on ENOENT until QEMU creates the socket, then serves the
	// guest's ping v4/v6 and iperf3 both ways.
	t.Run("tapgro-first", func(t *testing.T) {
		start := time.Now()
		s, sock, mon := newVhostUserClientSetup(t, f)
		s.startTapgro(t, "tapgro")
		out := s.tg.out.String()
		if !strings.Contains(out, "-chardev socket,id=vu0,path="+sock+",server=on,wait=off -netdev vhost-user,id=n0,chardev=vu0") ||
			!strings.Contains(out, `connect="unix:`+sock+`"`) {
			t.Errorf("tapgro's ready line does not give the QEMU options for server=off:\n%s", out)
		}
		s.tg.waitLog(vhostRetryRe, 10*time.Second)
		args, netdev, dev := vhostUserClientGuest(f, sock, mon)
		cmd := fmt.Sprintf(`set -e
ping -c 3 %[1]s
ping6 -c 3 %[2]s
iperf3 -c %[1]s -t 3
iperf3 -c %[1]s -t 3 -R
echo GUEST-WAITING
nc -l -p %[3]d </dev/null >/dev/null
`, hostIP4, hostIP6, guestGo)
		g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: netdev, QEMUArgs: args, DevOpts: dev,
			IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: cmd})
		g.waitConsole(guestWaitingRe, guestLimit)
		s.ns.MustRun(t, "ping", "-c", "2", "-W", "5", guestIP4)
		s.ns.MustRun(t, "ping", "-c", "2", "-W", "5", guestIP6)
		waitChardev(t, mon, "unix:"+sock+",server=on", 5*time.Second)
		releaseGuest(t, s.ns)
		console := g.mustSucceed(guestLimit)
		if !qemuWaitingRe.MatchString(console) {
			t.Errorf("QEMU did not say it waited for the back-end:\n%s", console)
		}
		logIperf(t, console)
		if n := len(iperfSummaryRe.FindAllString(console, -1)); n < 4 {
			t.Errorf("%d iperf3 summary lines, want 4 (two runs):\n%s", n, console)
		}
		s.tg.stop()
		line, tx, rx, sessions := vhostExit(t, s.tg)
		t.Logf("tapgro: %s; took %v", line, time.Since(start).Round(time.Millisecond))
		if tx < 1000 || rx < 1000 || sessions != 1 {
			t.Errorf("port_to_tap_frames=%d tap_to_port_frames=%d sessions=%d: want the guest's traffic through one session", tx, rx, sessions)
		}
	})

	// QEMU first (it waits for a back-end before the guest boots); then tapgro is killed
	// while the guest runs and started again: it dials QEMU's socket, which QEMU has
	// gone back to listening on, and traffic resumes in the same guest.
	t.Run("qemu-first-tapgro-restart", func(t *testing.T) {
		start := time.Now()
		s, sock, mon := newVhostUserClientSetup(t, f)
		args, netdev, dev := vhostUserClientGuest(f, sock, mon)
		// The watcher prints eth0's carrier each time it changes: QEMU's link state as the
		// guest's driver sees it (VIRTIO_NET_S_LINK_UP in the config space).
		cmd := fmt.Sprintf(`(p=; while :; do read c </sys/class/net/eth0/carrier; [ "$c" != "$p" ] && echo "GUEST-CARRIER=$c"; p=$c; sleep 0.1; done) &
ping -c 1 -W 30 %[1]s
echo GUEST-WAITING
nc -l -p %[2]d </dev/null >/dev/null
set -e
ping -c 3 %[1]s
iperf3 -c %[1]s -t 2
iperf3 -c %[1]s -t 2 -R
`, hostIP4, guestGo)
		g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: netdev, QEMUArgs: args, DevOpts: dev,
			IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: cmd})
		g.waitConsole(qemuWaitingRe, 30*time.Second)
		time.Sleep(3 * time.Second)
		if guestStartedRe.MatchString(g.console()) {
			t.Fatalf("the guest ran before any back-end connected:\n%s", g.console())
		}

		s.startTapgro(t, "tapgro")
		g.waitConsole(guestWaitingRe, guestLimit)
		waitPing(t, s.ns, guestIP4, 30*time.Second)
		waitChardev(t, mon, "unix:"+sock+",server=on", 5*time.Second)
		first := s.tg

		first.kill()
		waitChardev(t, mon, "disconnected:unix:"+sock+",server=on", 10*time.Second)
		g.waitConsole(carrierDownRe, 60*time.Second)
		restarted := time.Now()
		s.startTapgro(t, "tapgro (restarted)")
		waitChardev(t, mon, "unix:"+sock+",server=on", 10*time.Second)
		g.waitConsole(carrierUpAgainRe, 60*time.Second)
		waitPing(t, s.ns, guestIP4, 60*time.Second)
		t.Logf("traffic resumed %v after the restart", time.Since(restarted).Round(time.Millisecond))
		releaseGuest(t, s.ns)
		console := g.mustSucceed(guestLimit)
		logIperf(t, console)
		if n := len(iperfSummaryRe.FindAllString(console, -1)); n < 4 {
			t.Errorf("%d iperf3 summary lines after the restart, want 4 (two runs):\n%s", n, console)
		}
		s.tg.stop()
		line, tx, rx, sessions := vhostExit(t, s.tg)
		t.Logf("restarted tapgro: %s; took %v", line, time.Since(start).Round(time.Millisecond))
		if tx < 1000 || rx < 1000 || sessions != 1 {
			t.Errorf("port_to_tap_frames=%d tap_to_port_frames=%d sessions=%d after the restart", tx, rx, sessions)
		}
	})
}
