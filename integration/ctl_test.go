//go:build linux

package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// ctlPair is newPair with a control socket per side (the default path is per TAP name,
// and both TAPs are called tg0).
func ctlPair(t *testing.T, be backend) (s *pairSetup, ctlA, ctlB string) {
	t.Helper()
	s = &pairSetup{a: netnstest.New(t, "a"), b: netnstest.New(t, "b")}
	veth(t, s.a, s.b, 9000)
	s.dir = t.TempDir()
	ctlA, ctlB = filepath.Join(s.dir, "a.ctl"), filepath.Join(s.dir, "b.ctl")
	s.argsA = []string{"--tap", "tg0", "--mtu", "1500", "--addr", "198.18.0.1/24", "--addr", "fd00:198:18::1/64",
		"--netdev", be.a(s.dir), "--log-level", "debug", "--allow-remote", "--ctl-socket", ctlA, "--metrics-addr", metricsAddr}
	s.argsB = []string{"--tap", "tg0", "--mtu", "1500", "--addr", "198.18.0.2/24", "--addr", "fd00:198:18::2/64",
		"--netdev", be.b(s.dir), "--log-level", "debug", "--allow-remote", "--ctl-socket", ctlB, "--metrics-addr", metricsAddr}
	s.pa = startTapgro(t, s.a, "tapgro A", s.argsA...)
	s.pa.waitLog(readyRe, 10*time.Second)
	s.pb = startTapgro(t, s.b, "tapgro B", s.argsB...)
	s.pb.waitLog(readyRe, 10*time.Second)
	return s, ctlA, ctlB
}

// ctl runs `tapgro ctl --socket sock ARGS` inside ns, as an operator would.
func ctl(t testing.TB, ns *netnstest.NS, sock string, args ...string) (string, error) {
	out, err := ns.Run(append([]string{tapgroBin(t), "ctl", "--socket", sock}, args...)...)
	return string(out), err
}

// ctlStatusJSON is the part of `tapgro ctl --json status` the test reads.
type ctlStatusJSON struct {
	OK     bool `json:"ok"`
	Status struct {
		Negotiated    string `json:"negotiated"`
		TapOffloads   string `json:"tap_offloads"`
		PortConnected bool   `json:"port_connected"`
		GRO           bool   `json:"gro"`
	} `json:"status"`
}

func ctlStatus(t testing.TB, ns *netnstest.NS, sock string) ctlStatusJSON {
	t.Helper()
	out, err := ctl(t, ns, sock, "--json", "status")
	if err != nil {
		t.Fatalf("tapgro ctl status: %v\n%s", err, out)
	}
	var st ctlStatusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil || !st.OK {
		t.Fatalf("tapgro ctl --json status: %v\n%s", err, out)
	}
	return st
}

// toggler flips offloads on the sending side and GRO on the receiving side, one change
// every interval, until stop is closed; it returns the errors of failed changes.
func toggler(t testing.TB, send, recv *netnstest.NS, sendCtl, recvCtl string, stop <-chan struct{}) <-chan []string {
	changes := []struct {
		ns   *netnstest.NS
		sock string
		args []string
	}{
		{send, sendCtl, []string{"offload", "tso4=off"}},
		{recv, recvCtl, []string{"gro=off"}},
		{send, sendCtl, []string{"offload", "csum=on", "tso6=off", "tso4=on"}}, // csum=on: a previous phase may have left offloads off
		{recv, recvCtl, []string{"udp-gro=off", "gro=on"}},
		{send, sendCtl, []string{"offload", "off"}},
		{recv, recvCtl, []string{"offload", "csum"}},
		{send, sendCtl, []string{"offload", "csum,tso4"}},
		{recv, recvCtl, []string{"offload", "auto", "udp-gro=on"}},
		{send, sendCtl, []string{"offload", "auto"}},
	}
	done := make(chan []string, 1)
	go func() {
		var errs []string
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- errs
				return
			case <-tick.C:
			}
			c := changes[i%len(changes)]
			if out, err := ctl(t, c.ns, c.sock, c.args...); err != nil {
				errs = append(errs, strings.Join(c.args, " ")+": "+err.Error()+": "+out)
			}
		}
	}()
	return done
}

// TestCtlToggles: offloads and GRO flipped with `tapgro ctl` in the middle of an iperf3
// run and of SHA-256-checked transfers both ways: everything completes intact, neither
// port connection drops, `ethtool -k` shows what tapgro reports, and `tapgro ctl status`
// prints the negotiated line. Both over the plain stream (QEMU's format: software
// segmentation and GRO) and the vnet-hdr=on stream (GSO passthrough).
func TestCtlToggles(t *testing.T) {
	netnstest.RequirePriv(t)
	requireTool(t, "iperf3")
	requireTool(t, "ethtool")
	for _, be := range []backend{backends[0], vnetUnix} {
		t.Run(be.name, func(t *testing.T) {
			s, ctlA, ctlB := ctlPair(t, be)
			waitConnected(t, s)
			s.pingAll(t)
			for _, p := range []string{ctlA, ctlB} {
				fi, err := os.Lstat(p)
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
					t.Errorf("%s: mode %v, want a socket with 0600", p, fi.Mode())
				}
			}

			// status prints the negotiated line, the same as the log's last one.
			out, err := ctl(t, s.a, ctlA, "status")
			if err != nil {
				t.Fatalf("tapgro ctl status: %v\n%s", err, out)
			}
			logged := regexp.MustCompile(`negotiated: (.*?)"?\n`).FindAllStringSubmatch(s.pa.out.String(), -1)
			last := logged[len(logged)-1][1]
			if !regexp.MustCompile(`(?m)^negotiated: +` + regexp.QuoteMeta(last) + `$`).MatchString(out) {
				t.Errorf("tapgro ctl status lacks the negotiated line %q:\n%s", last, out)
			}
			t.Logf("tapgro ctl status (A):\n%s", out)

			run := func(what string, f func()) {
				stop := make(chan struct{})
				var once sync.Once
				errs := toggler(t, s.a, s.b, ctlA, ctlB, stop)
				defer once.Do(func() { close(stop) })
				f()
				once.Do(func() { close(stop) })
				for _, e := range <-errs {
					t.Errorf("%s: tapgro ctl %s", what, e)
				}
			}
			run("iperf3 A->B", func() {
				t.Logf("iperf3 with toggles: %s", lastLine(iperf3(t, s.a, s.b, "198.18.0.2", "-t", "5")))
			})
			run("transfer A->B", func() { transfer(t, s.a, s.b, "198.18.0.2", 7401, 400<<20) })
			run("transfer B->A", func() { transfer(t, s.b, s.a, "fd00:198:18::1", 7402, 400<<20) })

			// A last, known change; the kernel shows it and tapgro reports it.
			if out, err := ctl(t, s.a, ctlA, "offload", "tso4=off"); err != nil || !strings.Contains(out, "negotiated: tap offloads=") {
				t.Fatalf("tapgro ctl offload tso4=off: %v\n%s", err, out)
			}
			st := ctlStatus(t, s.a, ctlA)
			got := ethtoolOffloads(t, s.a, "tg0")
			if got != st.Status.TapOffloads || strings.Contains(got, "tso4") {
				t.Errorf("after tso4=off: ethtool -k shows %q, tapgro reports %q", got, st.Status.TapOffloads)
			}
			checkEthtool(t, s)
			if out, err := ctl(t, s.b, ctlB, "gro=off"); err != nil || !strings.Contains(out, "gro off") {
				t.Errorf("tapgro ctl gro=off: %v\n%s", err, out)
			}
			if st := ctlStatus(t, s.b, ctlB); st.Status.GRO || !st.Status.PortConnected {
				t.Errorf("B after gro=off: %+v", st.Status)
			}
			// A bad request is refused with the reason and changes nothing.
			if out, err := ctl(t, s.a, ctlA, "offload", "tso4=perhaps"); err == nil || !strings.Contains(out, `tso4="perhaps": want on or off`) {
				t.Errorf("bad request: %v\n%s", err, out)
			}
			if after := ctlStatus(t, s.a, ctlA); after.Status.Negotiated != st.Status.Negotiated {
				t.Errorf("a refused request changed the negotiation: %q -> %q", st.Status.Negotiated, after.Status.Negotiated)
			}
			transfer(t, s.a, s.b, "198.18.0.2", 7403, 50<<20)

			for _, p := range []*proc{s.pa, s.pb} {
				if n := strings.Count(p.out.String(), "port connected"); n != 1 {
					t.Errorf("%s: %d port connections, want 1: a toggle dropped the port", p.name, n)
				}
				if n := strings.Count(p.out.String(), "ctl: changed at run time"); n < 5 {
					t.Errorf("%s logged %d changes", p.name, n)
				}
			}
			for _, side := range []struct {
				ns *netnstest.NS
				p  *proc
			}{{s.a, s.pa}, {s.b, s.pb}} {
				c := scrape(t, side.ns, metricsAddr).pick(t, mP2TMalformed, mT2PPortError)
				t.Logf("%s: %v", side.p.name, c)
				if c[mP2TMalformed] != 0 || c[mT2PPortError] != 0 {
					t.Errorf("%s dropped frames: %v", side.p.name, c)
				}
			}
			s.pa.stop()
			s.pb.stop()
			for _, p := range []string{ctlA, ctlB} {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Errorf("%s left behind after exit: %v", p, err)
				}
			}
		})
	}
}
