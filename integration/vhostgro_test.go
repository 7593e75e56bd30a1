//go:build linux

package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// GRO and RSC on the vhost-user path (vhostnet/gro.go, rsc.go), with the real guest.
//
// tx-gro: the guest switches TSO and GSO off inside (`ethtool -K eth0 tso off gso off`;
// QEMU, 7.2 as 10.0, never tells a vhost-user back-end, so the features stay acked) and sends MTU
// segments: tapgro's GRO engine must hand the TAP GSO packets (tapgro_gro_*), and a
// hashed file must arrive intact.
//
// rsc: tapgro --offload off sets TUNSETOFFLOAD to 0, so the TAP hands MTU frames
// although the guest acked GUEST_TSO4: tapgro coalesces them into GSO packets in the
// guest's buffers (tapgro_vhost_rsc_*), the TAP handing none whole
// (tapgro_gso_passthrough_total{direction="tap_to_port"} stays 0), and a hashed file
// must arrive intact.

const (
	mVhostRSCSegments = `tapgro_vhost_rsc_segments_total`
	mVhostRSCPackets  = `tapgro_vhost_rsc_packets_total`
	mVhostRSCGSO      = `tapgro_vhost_rsc_gso_packets_total`
	mVhostRXPassGSO   = `tapgro_gso_passthrough_total{direction="tap_to_port"}`
	mVhostTXPassGSO   = `tapgro_gso_passthrough_total{direction="port_to_tap"}`
)

func TestQEMUVhostGRO(t *testing.T) {
	netnstest.RequirePriv(t)
	tapgroBin(t)
	forEachFlavour(t, testQEMUVhostGRO)
}

func testQEMUVhostGRO(t *testing.T, f *qemuFlavour) {
	t.Run("tx-gro", func(t *testing.T) {
		start := time.Now()
		s, sock := newVhostUserSetup(t, f, 1500)
		s.startTapgro(t, "tapgro")
		files := serveGuestFiles(t, s.ns, guestFile)
		args, netdev, dev := vhostUserGuest(f, sock)
		cmd := fmt.Sprintf(`set -e
ethtool -K eth0 tso off gso off
ethtool -k eth0 | grep -E '^(tcp-segmentation-offload|generic-segmentation-offload):'
ping -c 2 %[1]s
iperf3 -c %[1]s -t 4
dd if=/dev/urandom of=up bs=64k count=%[2]d 2>/dev/null
echo "GUEST-UP-SHA=$(sha256sum <up | cut -d' ' -f1)"
nc %[1]s %[3]d <up
`, hostIP4, guestFile/(64<<10), guestUp)
		g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: netdev, QEMUArgs: args, DevOpts: dev,
			IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: cmd})
		console := g.mustSucceed(guestLimit)
		for _, m := range iperfSummaryRe.FindAllString(console, -1) {
			t.Logf("guest iperf3: %s", strings.TrimSpace(m))
		}
		if !strings.Contains(console, "tcp-segmentation-offload: off") {
			t.Errorf("the guest's TSO is not off:\n%s", console)
		}
		files.checkUp(t, console, guestFile)
		c := scrape(t, s.ns, metricsAddr).pick(t, mGROSegments, mGROPackets, mGROGSOPackets, mVhostTXPassGSO)
		s.tg.stop()
		line := vhostExitRe.FindString(s.tg.out.String())
		t.Logf("metrics %v; tapgro: %s; took %v", c, line, time.Since(start).Round(time.Millisecond))
		if c[mGROPackets] == 0 || c[mGROGSOPackets] == 0 {
			t.Fatalf("no GSO packets were written to the TAP: %v", c)
		}
		perPacket := c[mGROSegments] / c[mGROPackets]
		t.Logf("%.1f segments per packet toward the TAP", perPacket)
		if perPacket < 8 {
			t.Errorf("%.1f segments per packet, want >= 8", perPacket)
		}
		if c[mVhostTXPassGSO] > 10 {
			t.Errorf("the guest sent %v GSO frames with TSO and GSO off", c[mVhostTXPassGSO])
		}
		if vhostCounter(t, line, "gro_gso_packets") != uint64(c[mGROGSOPackets]) {
			t.Errorf("exit line and /metrics disagree on gro_gso_packets")
		}
	})

	t.Run("rsc", func(t *testing.T) {
		start := time.Now()
		s, sock := newVhostUserSetup(t, f, 1500)
		s.args = append(s.args, "--offload", "off")
		s.startTapgro(t, "tapgro")
		files := serveGuestFiles(t, s.ns, guestFile)
		args, netdev, dev := vhostUserGuest(f, sock)
		cmd := fmt.Sprintf(`set -e
cat /sys/class/net/eth0/device/features
ping -c 2 %[1]s
iperf3 -c %[1]s -t 4 -R
echo "GUEST-DOWN-SHA=$(nc %[1]s %[2]d </dev/null | sha256sum | cut -d' ' -f1)"
`, hostIP4, guestDown)
		g := startGuest(t, guestOpts{Flavour: f, NS: s.ns, Netdev: netdev, QEMUArgs: args, DevOpts: dev,
			IP: guestIP4 + "/24", IP6: guestIP6 + "/64", MTU: 1500, Cmd: cmd})
		console := g.mustSucceed(guestLimit)
		for _, m := range iperfSummaryRe.FindAllString(console, -1) {
			t.Logf("guest iperf3: %s", strings.TrimSpace(m))
		}
		if m := guestDownRe.FindStringSubmatch(console); m == nil || m[1] != files.downSum {
			t.Errorf("host->guest file: guest says sha256 %v; host sent %d bytes sha256 %s", m, files.downSize, files.downSum)
		}
		// Feature bits as the guest's sysfs lists them, bit 0 first: GUEST_TSO4 is bit 7.
		if f := strings.Fields(console); !guestHasFeature(console, 7) {
			t.Errorf("the guest did not ack GUEST_TSO4: %v", f[:min(len(f), 3)])
		}
		c := scrape(t, s.ns, metricsAddr).pick(t, mVhostRSCSegments, mVhostRSCPackets, mVhostRSCGSO, mVhostRXPassGSO)
		s.tg.stop()
		line := vhostExitRe.FindString(s.tg.out.String())
		t.Logf("metrics %v; tapgro: %s; took %v", c, line, time.Since(start).Round(time.Millisecond))
		if c[mVhostRSCGSO] == 0 {
			t.Fatalf("no GSO packets were handed the guest: %v", c)
		}
		if c[mVhostRXPassGSO] != 0 {
			t.Errorf("the TAP handed %v GSO frames with --offload off", c[mVhostRXPassGSO])
		}
		t.Logf("%.1f segments per packet toward the guest", c[mVhostRSCSegments]/c[mVhostRSCPackets])
	})
}

// guestHasFeature finds the guest's /sys/class/net/eth0/device/features line (a string
// of 0 and 1, bit 0 first) in console and reports bit.
func guestHasFeature(console string, bit int) bool {
	for _, l := range strings.Fields(console) {
		if len(l) >= 64 && strings.Trim(l, "01") == "" {
			return len(l) > bit && l[bit] == '1'
		}
	}
	return false
}
