//go:build linux

package integration

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// requireTool skips (or, under TAPGRO_REQUIRE_PRIV=1, fails) when a command is missing.
func requireTool(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err == nil {
		return
	}
	if os.Getenv("TAPGRO_REQUIRE_PRIV") == "1" {
		t.Fatalf("needs %s (apt-get install -y %s), and TAPGRO_REQUIRE_PRIV=1 forbids skipping", name, name)
	}
	t.Skipf("needs %s (apt-get install -y %s)", name, name)
}

// iperf3 runs a client in ns against a server started in srvNS, and returns its output.
func iperf3(t testing.TB, ns, srvNS *netnstest.NS, dst string, args ...string) string {
	t.Helper()
	srv := exec.Command("ip", "netns", "exec", srvNS.Name, "iperf3", "-s", "-1")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	var out []byte
	var err error
	for try := 0; try < 50; try++ {
		out, err = ns.Run(append([]string{"iperf3", "-c", dst}, args...)...)
		if err == nil || !bytes.Contains(out, []byte("refused")) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("iperf3 -c %s: %v\n%s", dst, err, out)
	}
	return string(out)
}

// TestGROBulk: a guest-like sender (A's TAP emits 64 KB TSO frames, A's tapgro puts MTU
// frames on the stream as a QEMU guest would) and a receiving tapgro that must hand its
// TAP GSO packets of 20 segments or more on average, with no GSO write refused.
func TestGROBulk(t *testing.T) {
	netnstest.RequirePriv(t)
	requireTool(t, "iperf3")
	s := newPair(t, backends[0], "--metrics-addr", metricsAddr)
	s.pingAll(t)
	t.Logf("v4: %s", lastLine(iperf3(t, s.a, s.b, "198.18.0.2", "-t", "3")))
	t.Logf("v6: %s", lastLine(iperf3(t, s.a, s.b, "fd00:198:18::2", "-t", "3")))
	c := scrape(t, s.b, metricsAddr).pick(t, mGROSegments, mGROPackets, mGROGSOPackets, mTapEINVAL, mGSOFallback)
	s.pb.stop()
	t.Logf("receiving tapgro: %v", c)
	if c[mGROPackets] == 0 || c[mGROGSOPackets] == 0 {
		t.Fatalf("no GSO packets were written: %v", c)
	}
	perPacket := c[mGROSegments] / c[mGROPackets]
	if perPacket < 20 {
		t.Errorf("%.1f segments per packet on a bulk stream, want >= 20", perPacket)
	}
	if c[mTapEINVAL] != 0 || c[mGSOFallback] != 0 {
		t.Errorf("the kernel refused GSO writes: %v", c)
	}
}

func lastLine(s string) string {
	lines := bytes.Split(bytes.TrimSpace([]byte(s)), []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		if bytes.Contains(lines[i], []byte("receiver")) {
			return string(bytes.TrimSpace(lines[i]))
		}
	}
	return string(lines[len(lines)-1])
}
