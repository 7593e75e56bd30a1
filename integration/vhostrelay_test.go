//go:build linux

package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"tapgro/integration/netnstest"
	"tapgro/vhostnet"
)

// The benchmark's vhost-user row puts the bench front-end (integration/vhostrelay) where
// QEMU would be. This test keeps that row honest: the front-end must carry TCP both ways
// intact, with GSO frames crossing whole in both directions (else the row would measure
// segmentation, not tapgro), and nothing dropped on either side.
//
//	ns host: 198.18.0.1 ─ tg0 ─ tapgro ══ vhost-user ══ vhostrelay ─ vr0 ─ 198.18.0.2 :ns guest

var (
	relayOnce sync.Once
	relayPath string
	relayErr  error
)

func vhostrelayBin(t testing.TB) string {
	t.Helper()
	relayOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tapgro-vhostrelay-")
		if err != nil {
			relayErr = err
			return
		}
		relayPath = filepath.Join(dir, "vhostrelay")
		gobin := "go"
		if _, err := exec.LookPath(gobin); err != nil {
			gobin = "/usr/local/go/bin/go"
		}
		if out, err := exec.Command(gobin, "build", "-o", relayPath, "tapgro/integration/vhostrelay").CombinedOutput(); err != nil {
			relayErr = fmt.Errorf("go build vhostrelay: %v: %s", err, out)
		}
	})
	if relayErr != nil {
		t.Fatal(relayErr)
	}
	return relayPath
}

var relayExitRe = regexp.MustCompile(`vhostrelay: to TAP: (\d+) frames \d+ bytes \(\d+ over several buffers, (\d+) refused by the TAP\); from TAP: (\d+) frames \d+ bytes \((\d+) truncated\)`)

func TestVhostRelay(t *testing.T) {
	netnstest.RequirePriv(t)
	tapgroBin(t)
	bin := vhostrelayBin(t)
	host, guest := netnstest.New(t, "vrh"), netnstest.New(t, "vrg")
	sock := filepath.Join(t.TempDir(), "vu.sock")
	tg := startTapgro(t, host, "tapgro", "--tap", "tg0", "--mtu", "1500", "--addr", hostIP4+"/24",
		"--netdev", "vhost-user,path="+sock, "--metrics-addr", metricsAddr)

	cmd := exec.Command("ip", "netns", "exec", guest.Name, bin, "-connect", sock, "-tap", "vr0", "-addr", guestIP4+"/24", "-mtu", "1500")
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("--- log of vhostrelay ---\n%s", out.String())
		}
	})

	waitPing(t, guest, hostIP4, 30*time.Second)
	const size = 64 << 20
	up := transfer(t, guest, host, hostIP4, guestUp, size)
	down := transfer(t, host, guest, guestIP4, guestDown, size)
	t.Logf("64 MiB guest→host in %v, host→guest in %v", up.Round(time.Millisecond), down.Round(time.Millisecond))

	m := scrape(t, host, metricsAddr)
	for _, dir := range []string{"port_to_tap", "tap_to_port"} {
		if v := m.get(t, `tapgro_gso_passthrough_total{direction="`+dir+`"}`); v < 100 {
			t.Errorf("%s: %v GSO frames: GSO did not cross whole", dir, v)
		}
	}
	for r := vhostnet.Drop(0); r < vhostnet.NumDrops; r++ {
		if v := m.get(t, `tapgro_dropped_total{direction="`+r.Dir()+`",reason="`+r.String()+`"}`); v != 0 {
			t.Errorf("tapgro dropped %v frames (%s)", v, r.String())
		}
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("vhostrelay did not exit within 10 s of SIGTERM")
	}
	c := relayExitRe.FindStringSubmatch(out.String())
	if c == nil {
		t.Fatalf("no exit counters from vhostrelay:\n%s", out.String())
	}
	n := func(i int) uint64 { v, _ := strconv.ParseUint(c[i], 10, 64); return v }
	if n(1) < 1000 || n(3) < 1000 || n(2) != 0 || n(4) != 0 {
		t.Errorf("vhostrelay: %s", c[0])
	}
	tg.stop()
}
