//go:build linux

package integration

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// tapgro as a two-queue-pair vhost-user back-end (--netdev vhost-user,path=P,queues=2):
// the TAP tg0 has two queues, one per pair, and QEMU's NIC has mq=on.
//
//	netns                                          QEMU (TCG), same netns
//	198.18.0.1 ─ tg0 (2 queues) ─ tapgro ══ vhost-user, 2 pairs ══ virtio-net mq ─ eth0
//
// A -smp 1 Linux guest starts with one pair (min(max pairs, CPUs)): pair 1's rings are
// disabled and tapgro keeps its TAP queue detached. `ethtool -L eth0 combined 2` makes
// QEMU enable pair 1 (VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET → SET_VRING_ENABLE 1), tapgro
// attaches its queue, and flows spread over both pairs by hash. Which pair a TCP flow
// takes is the guest's hash (its XPS/skb_tx_hash), and the TAP sends a flow back on the
// queue it was last written on (drivers/net/tun.c tun_flow_update,
// tun_automq_select_queue), so the guest runs rounds of two parallel iperf3 streams each
// way until the per-pair counters show both pairs carrying stream data both ways (two
// streams land on one pair half the time; eight rounds fail by chance with p < 1e-4);
// then a SHA-256-checked file goes each way, both at once.

var mqRoundRe = regexp.MustCompile(`GUEST-ROUND-(\d+)`)

// mqMinBytes per pair and direction means a pair carried an iperf3 stream's data that
// way (a 3 s stream moves hundreds of MB even under TCG), not only its ACKs.
const mqMinBytes = 32 << 20

func queueKey(name, dir string, q int) string {
	if dir == "" {
		return fmt.Sprintf(`%s{queue="%d"}`, name, q)
	}
	return fmt.Sprintf(`%s{direction="%s",queue="%d"}`, name, dir, q)
}

// tellGuest connects to the guest's nc -l on guestGo and sends word. The guest prints
// its marker line before it starts nc, so a refused connection is retried until the
// guest's listener is up (or guestLimit passes).
func tellGuest(t *testing.T, ns *netnstest.NS, word string) {
	t.Helper()
	addr := net.JoinHostPort(guestIP4, strconv.Itoa(guestGo))
	deadline := time.Now().Add(guestLimit)
	err := ns.Do(func() error {
		for {
			c, err := net.DialTimeout("tcp", addr, 20*time.Second)
			if err == nil {
				defer c.Close()
				_, err = c.Write([]byte(word + "\n"))
				return err
			}
			if !errors.Is(err, syscall.ECONNREFUSED) || time.Now().After(deadline) {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	if err != nil {
		t.Fatalf("tell guest %q: %v", word, err)
	}
}

func mqGuestCmd() string {
	return fmt.Sprintf(`set -e
ethtool -l eth0
echo GUEST-ONE-PAIR
nc -l -p %[3]d </dev/null >/dev/null
ethtool -L eth0 combined 2
ethtool -l eth0
ping -c 3 %[1]s
i=0
while :; do
  i=$((i+1))
  iperf3 -c %[1]s -t 3 -P 2
  iperf3 -c %[1]s -t 3 -P 2 -R
  echo GUEST-ROUND-$i
  r=$(nc -l -p %[3]d </dev/null)
  if [ "$r" = done ] || [ $i -ge 8 ]; then break; fi
done
dd if=/dev/urandom of=up bs=64k count=%[4]d 2>/dev/null
echo "GUEST-UP-SHA=$(sha256sum <up | cut -d' ' -f1)"
nc %[1]s %[5]d <up &
echo "GUEST-DOWN-SHA=$(nc %[1]s %[6]d </dev/null | sha256sum | cut -d' ' -f1)"
wait
`, hostIP4, hostIP6, guestGo, guestFile/(64<<10), guestUp, guestDown)
}

// TestQEMUVhostMQ: two queue pairs with the real guest; see the comment above.
func TestQEMUVhostMQ(t *testing.T) {
	netnstest.RequirePriv(t)
	tapgroBin(t)
	forEachFlavour(t, testQEMUVhostMQ)
}

func testQEMUVhostMQ(t *testing.T, f *qemuFlavour) {
	start := time.Now()
	s := &qemuSetup{f: f, ns: netnstest.New(t, "vumq"), dir: t.TempDir()}
	sock := filepath.Join(s.dir, "vu.sock")
	s.args = []string{"--tap", "tg0", "--mtu", "1500", "--addr", hostIP4 + "/24", "--addr", hostIP6 + "/64",
		"--netdev", "vhost-user,path=" + sock + ",queues=2", "--metrics-addr", metricsAddr}
	startIperf3Server(t, s.ns)
	s.startTapgro(t, "tapgro")
	if out := s.tg.out.String(); !strings.Contains(out, "-netdev vhost-user,id=n0,chardev=vu0,queues=2 -device virtio-net-pci,netdev=n0,mq=on") {
		t.Errorf("tapgro's ready line does not give QEMU queues=2 and mq=on:\n%s", out)
	}
	if out := s.ns.MustRun(t, "ip", "-d", "link", "show", "tg0"); !strings.Contains(string(out), "multi_queue") {
		t.Errorf("tg0 is not a multiqueue TAP: %s", out)
	}
	args, netdev, dev := vhostUserGuest(f, sock)
	files := serveGuestFiles(t, s.ns, guestFile)
	g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: netdev + ",queues=2", QEMUArgs: args, DevOpts: ",mq=on" + dev,
		IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: mqGuestCmd()})

	// One pair in use: pair 1's TAP queue is detached.
	g.waitConsole(regexp.MustCompile(`GUEST-ONE-PAIR`), guestLimit)
	m := scrape(t, s.ns, metricsAddr)
	if a0, a1 := m.get(t, queueKey("tapgro_vhost_queue_attached", "", 0)), m.get(t, queueKey("tapgro_vhost_queue_attached", "", 1)); a0 != 1 || a1 != 0 {
		t.Errorf("with one pair in use: queue 0 attached %v, queue 1 %v; want 1, 0", a0, a1)
	}
	if out := s.ns.MustRun(t, "ip", "-d", "link", "show", "tg0"); !strings.Contains(string(out), "numqueues 1 numdisabled 1") {
		t.Logf("tg0 (one pair): %s", out)
	}
	tellGuest(t, s.ns, "go")

	// Rounds of iperf3 until both pairs carry traffic both ways.
	var perQ, perQB [2][2]float64 // frames, bytes: [pair][port_to_tap, tap_to_port]
	for round := 1; ; round++ {
		deadline := time.Now().Add(guestLimit)
		for {
			if ms := mqRoundRe.FindAllStringSubmatch(g.console(), -1); len(ms) >= round {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no GUEST-ROUND-%d after %v:\n%s", round, guestLimit, g.console())
			}
			time.Sleep(100 * time.Millisecond)
		}
		m = scrape(t, s.ns, metricsAddr)
		if a := m.get(t, queueKey("tapgro_vhost_queue_attached", "", 1)); a != 1 {
			t.Errorf("round %d: queue 1 attached %v after ethtool -L combined 2", round, a)
		}
		ok := true
		for q := 0; q < 2; q++ {
			for d, dir := range []string{"port_to_tap", "tap_to_port"} {
				perQ[q][d] = m.get(t, queueKey("tapgro_vhost_queue_frames_total", dir, q))
				perQB[q][d] = m.get(t, queueKey("tapgro_vhost_queue_bytes_total", dir, q))
				ok = ok && perQB[q][d] >= mqMinBytes
			}
		}
		t.Logf("round %d: per pair (port_to_tap, tap_to_port) frames %v bytes %v", round, perQ, perQB)
		if ok || round >= 8 {
			tellGuest(t, s.ns, "done")
			if !ok {
				t.Errorf("after %d rounds of two iperf3 streams each way a pair carried no stream one way: bytes %v", round, perQB)
			}
			break
		}
		tellGuest(t, s.ns, "more")
	}
	console := g.mustSucceed(guestLimit)
	if !regexp.MustCompile(`(?s)Current hardware settings:.*Combined:\s+2`).MatchString(console) {
		t.Errorf("guest ethtool -l does not show 2 combined channels after ethtool -L:\n%s", console)
	}
	for _, line := range iperfSummaryRe.FindAllString(console, -1) {
		t.Logf("guest iperf3: %s", strings.TrimSpace(line))
	}
	files.check(t, console, guestFile)
	m = scrape(t, s.ns, metricsAddr)
	for q := 0; q < 2; q++ {
		t.Logf("pair %d: frames port_to_tap %v tap_to_port %v, bytes port_to_tap %v tap_to_port %v", q,
			m.get(t, queueKey("tapgro_vhost_queue_frames_total", "port_to_tap", q)),
			m.get(t, queueKey("tapgro_vhost_queue_frames_total", "tap_to_port", q)),
			m.get(t, queueKey("tapgro_vhost_queue_bytes_total", "port_to_tap", q)),
			m.get(t, queueKey("tapgro_vhost_queue_bytes_total", "tap_to_port", q)))
	}
	// The pairs' counters add up to the totals.
	for _, dir := range []string{"port_to_tap", "tap_to_port"} {
		sum := m.get(t, queueKey("tapgro_vhost_queue_frames_total", dir, 0)) + m.get(t, queueKey("tapgro_vhost_queue_frames_total", dir, 1))
		if tot := m.get(t, `tapgro_frames_total{direction="`+dir+`"}`); sum != tot {
			t.Errorf("%s: pairs' frames add up to %v, total %v", dir, sum, tot)
		}
	}
	s.tg.stop()
	line := vhostExitRe.FindString(s.tg.out.String())
	t.Logf("tapgro: %s; took %v", line, time.Since(start).Round(time.Millisecond))
}
