//go:build linux

package integration

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// Guest-driven offload changes on a vhost-user port, in the middle of traffic.
//
// Inside the guest, `ethtool -K eth0 tso off` changes only what the guest's stack hands
// its driver (it sends MTU segments from then on, which tapgro's GRO coalesces again);
// `ethtool -K eth0 rx-gro-hw off` sends VIRTIO_NET_CTRL_GUEST_OFFLOADS_SET, which QEMU
// (7.2 as 10.0) handles alone — net/vhost-user.c has no set_offload, so qemu_set_offload is a
// no-op — and tapgro keeps handing the guest the GSO kinds it acked at start, which
// Linux's virtio_net accepts whatever its offload setting (drivers/net/virtio_net.c
// receive_buf → virtio_net_hdr_to_skb). A driver reload (rmmod/insmod virtio_net)
// resets the device: QEMU stops the rings (GET_VRING_BASE), and the new driver's
// DRIVER_OK brings SET_FEATURES and the rings again within the same session, so
// tapgro renegotiates the TAP between two batches. Nothing may stall or be corrupted
// through any of it.
func TestQEMUVhostGuestOffloads(t *testing.T) {
	netnstest.RequirePriv(t)
	tapgroBin(t)
	forEachFlavour(t, testQEMUVhostGuestOffloads)
}

func testQEMUVhostGuestOffloads(t *testing.T, f *qemuFlavour) {
	start := time.Now()
	s, sock := newVhostUserSetup(t, f, 1500)
	s.startTapgro(t, "tapgro")
	files := serveGuestFiles(t, s.ns, guestFile)
	args, netdev, dev := vhostUserGuest(f, sock)
	// Offloads flipped while iperf3 runs, each way; then the driver reloaded, eth0
	// configured again, and the hashed files moved over the new driver instance.
	cmd := fmt.Sprintf(`set -e
ping -c 1 -W 30 %[1]s
iperf3 -c %[1]s -t 6 >/tmp/up.txt 2>&1 &
sleep 2
ethtool -K eth0 tso off gso off
sleep 2
ethtool -K eth0 tso on gso on
wait $!
cat /tmp/up.txt
iperf3 -c %[1]s -t 6 -R >/tmp/down.txt 2>&1 &
sleep 2
ethtool -K eth0 rx-gro-hw off
echo "GUEST-RXGRO: $(ethtool -k eth0 | grep rx-gro-hw)"
sleep 2
ethtool -K eth0 rx-gro-hw on
wait $!
cat /tmp/down.txt
rmmod virtio_net
insmod /lib/modules/virtio_net.ko
i=0
while [ ! -e /sys/class/net/eth0 ]; do i=$((i+1)); [ $i -gt 100 ] && exit 7; sleep 0.1; done
echo 0 >/proc/sys/net/ipv6/conf/eth0/accept_dad
ip link set eth0 mtu 1500
ip addr add %[2]s/24 dev eth0
ip link set eth0 up
echo GUEST-RELOADED
ping -c 1 -W 30 %[1]s
iperf3 -c %[1]s -t 3
dd if=/dev/urandom of=up bs=64k count=%[3]d 2>/dev/null
echo "GUEST-UP-SHA=$(sha256sum <up | cut -d' ' -f1)"
nc %[1]s %[4]d <up
echo "GUEST-DOWN-SHA=$(nc %[1]s %[5]d </dev/null | sha256sum | cut -d' ' -f1)"
`, hostIP4, guestIP4, guestFile/(64<<10), guestUp, guestDown)
	g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: netdev, QEMUArgs: args, DevOpts: dev,
		IP: guestIP4 + "/24", MTU: 1500, Cmd: cmd})
	console := g.mustSucceed(guestLimit)
	for _, m := range iperfSummaryRe.FindAllString(console, -1) {
		t.Logf("guest iperf3: %s", strings.TrimSpace(m))
	}
	if !strings.Contains(console, "GUEST-RXGRO: rx-gro-hw: off") {
		t.Errorf("the guest did not switch rx-gro-hw off (its driver may not offer it):\n%s", console)
	}
	if n := len(iperfSummaryRe.FindAllString(console, -1)); n < 6 {
		t.Errorf("%d iperf3 summary lines, want 6 (three runs): a run stalled or failed", n)
	}
	files.check(t, console, guestFile) // after the driver reload
	m := scrape(t, s.ns, metricsAddr)
	if v := m.get(t, "tapgro_port_connects_total"); v != 1 {
		t.Errorf("tapgro_port_connects_total = %v: the driver reload must stay within the session", v)
	}
	if v := m.get(t, "tapgro_gro_gso_packets_total"); v < 1 {
		t.Errorf("tapgro_gro_gso_packets_total = %v: the guest's MTU segments (tso off) were not coalesced", v)
	}
	s.tg.stop()
	log := s.tg.out.String()
	if n := len(regexp.MustCompile(`guest features acked`).FindAllString(log, -1)); n < 2 {
		t.Errorf("tapgro logged %d feature negotiations, want one per driver start (2):\n%s", n, log)
	}
	t.Logf("took %v", time.Since(start).Round(time.Millisecond))
}
