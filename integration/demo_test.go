//go:build linux

package integration

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"tapgro/integration/netnstest"
)

// demoRowRe is one row of `tapgro demo`'s table: port, direction, Gbit/s, GRO
// segments/packet ("-" where a guest receives), drops.
var demoRowRe = regexp.MustCompile(`(?m)^(vhost-user|stream)\s+(host -> guest|guest -> host|A -> B|B -> A)\s+([0-9.]+)\s+([0-9.]+|-)\s+(\d+)$`)

// TestDemo runs `tapgro demo` whole, as a new user would (README's first command), short:
// both ports pass traffic both ways with no drop, the table has its four rows, -v adds
// every process's raw counters, and nothing it made is left behind.
func TestDemo(t *testing.T) {
	netnstest.RequirePriv(t)
	out, err := exec.Command(tapgroBin(t), "demo", "--seconds", "2", "-v").CombinedOutput()
	t.Logf("tapgro demo --seconds 2 -v:\n%s", out)
	if err != nil {
		t.Fatalf("tapgro demo: %v", err)
	}
	rows := demoRowRe.FindAllStringSubmatch(string(out), -1)
	if len(rows) != 4 {
		t.Fatalf("the table has %d rows, want 4", len(rows))
	}
	for _, r := range rows {
		gbps, _ := strconv.ParseFloat(r[3], 64)
		if gbps <= 0 {
			t.Errorf("%s %s: %s Gbit/s", r[1], r[2], r[3])
		}
		if r[5] != "0" {
			t.Errorf("%s %s: %s drops", r[1], r[2], r[5])
		}
		// Where a tapgro receives, its GRO saw every frame: the stream port's MTU
		// segments coalesced (many per packet), vhost-user's TSO frames whole (one).
		switch {
		case r[2] == "host -> guest":
			if r[4] != "-" {
				t.Errorf("%s %s: GRO %s, but a guest receives", r[1], r[2], r[4])
			}
		case r[4] == "-":
			// ctl status of a vhost-user tapgro once had no GRO counters.
			t.Errorf("%s %s: no GRO counts, but tapgro writes this direction to its TAP", r[1], r[2])
		case r[1] == "stream":
			if seg, _ := strconv.ParseFloat(r[4], 64); seg < 2 {
				t.Errorf("%s %s: %s segments per packet; the stream port's GRO coalesced nothing", r[1], r[2], r[4])
			}
		}
	}
	for _, who := range []string{"tapgro counters: gro_", "built-in guest counters: to TAP:", "tapgro A counters: gro_", "tapgro B counters: gro_"} {
		if !strings.Contains(string(out), who) {
			t.Errorf("-v printed no %q line", who)
		}
	}
	if ns, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(ns), "tapgro-demo-") {
		t.Errorf("namespaces left behind:\n%s", ns)
	}
}
