//go:build linux

package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// backend is one way of joining two tapgro instances: the spec each side is given.
// QEMU's socket-family backends are symmetric enough that tapgro can talk to itself with
// them, which puts the exact QEMU wire format between two real TAPs.
type backend struct {
	name string
	a, b func(dir string) string
}

var backends = []backend{
	{"stream-unix",
		func(d string) string {
			return "stream,server=on,addr.type=unix,addr.path=" + filepath.Join(d, "s.sock")
		},
		func(d string) string {
			return "stream,server=off,addr.type=unix,addr.path=" + filepath.Join(d, "s.sock")
		}},
	{"stream-inet",
		func(string) string { return "stream,server=on,addr.type=inet,addr.host=198.19.0.1,addr.port=5600" },
		func(string) string { return "stream,server=off,addr.type=inet,addr.host=198.19.0.1,addr.port=5600" }},
	{"socket-tcp",
		func(string) string { return "socket,listen=198.19.0.1:5601" },
		func(string) string { return "socket,connect=198.19.0.1:5601" }},
	{"socket-udp",
		func(string) string { return "socket,udp=198.19.0.2:5603,localaddr=198.19.0.1:5602" },
		func(string) string { return "socket,udp=198.19.0.1:5602,localaddr=198.19.0.2:5603" }},
	{"dgram-unix",
		func(d string) string {
			return "dgram,local.type=unix,local.path=" + filepath.Join(d, "a.dg") + ",remote.type=unix,remote.path=" + filepath.Join(d, "b.dg")
		},
		func(d string) string {
			return "dgram,local.type=unix,local.path=" + filepath.Join(d, "b.dg") + ",remote.type=unix,remote.path=" + filepath.Join(d, "a.dg")
		}},
	{"dgram-udp",
		func(string) string {
			return "dgram,local.type=inet,local.host=198.19.0.1,local.port=5604,remote.type=inet,remote.host=198.19.0.2,remote.port=5605"
		},
		func(string) string {
			return "dgram,local.type=inet,local.host=198.19.0.2,local.port=5605,remote.type=inet,remote.host=198.19.0.1,remote.port=5604"
		}},
}

var readyRe = regexp.MustCompile(`tapgro ready`)

// pairSetup is two namespaces, each with a tapgro on TAP tg0, joined by one backend.
type pairSetup struct {
	dir          string
	a, b         *netnstest.NS
	pa, pb       *proc
	argsA, argsB []string
}

func newPair(t *testing.T, be backend, extra ...string) *pairSetup {
	t.Helper()
	s := &pairSetup{a: netnstest.New(t, "a"), b: netnstest.New(t, "b")}
	// The wire between the "hosts" carries whole frames in one datagram for the UDP
	// backends, so it needs room for a 1514-byte frame plus UDP/IP headers.
	veth(t, s.a, s.b, 9000)
	dir := t.TempDir()
	s.dir = dir
	// The inet backends listen on the veth between the namespaces, not on loopback.
	s.argsA = append([]string{"--tap", "tg0", "--mtu", "1500", "--addr", "198.18.0.1/24", "--addr", "fd00:198:18::1/64",
		"--netdev", be.a(dir), "--log-level", "debug", "--allow-remote"}, extra...)
	s.argsB = append([]string{"--tap", "tg0", "--mtu", "1500", "--addr", "198.18.0.2/24", "--addr", "fd00:198:18::2/64",
		"--netdev", be.b(dir), "--log-level", "debug", "--allow-remote"}, extra...)
	s.pa = startTapgro(t, s.a, "tapgro A", s.argsA...)
	s.pa.waitLog(readyRe, 10*time.Second)
	s.pb = startTapgro(t, s.b, "tapgro B", s.argsB...)
	s.pb.waitLog(readyRe, 10*time.Second)
	return s
}

func (s *pairSetup) pingAll(t *testing.T) {
	t.Helper()
	waitPing(t, s.a, "198.18.0.2", 20*time.Second)
	waitPing(t, s.b, "198.18.0.1", 10*time.Second)
	waitPing(t, s.a, "fd00:198:18::2", 10*time.Second)
	waitPing(t, s.b, "fd00:198:18::1", 10*time.Second)
}

// TestBackends is the datapath foundation end to end, once per QEMU backend kind: ping
// v4 and v6 both ways, 200 MB each way with SHA-256 compared, the TAP's offloads as the
// kernel reports them equal to what tapgro says it set, and each side restarted (killed
// hard, so a stale socket file is left behind) while the other keeps running.
func TestBackends(t *testing.T) {
	netnstest.RequirePriv(t)
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			s := newPair(t, be)
			s.pingAll(t)

			const size = 200 << 20
			d := transfer(t, s.a, s.b, "198.18.0.2", 7001, size)
			t.Logf("A->B %d MB in %v (%.2f Gbit/s)", size>>20, d, float64(size)*8/d.Seconds()/1e9)
			d = transfer(t, s.b, s.a, "198.18.0.1", 7002, size)
			t.Logf("B->A %d MB in %v (%.2f Gbit/s)", size>>20, d, float64(size)*8/d.Seconds()/1e9)

			said := s.pa.waitLog(offloadsRe, time.Second)
			if got := ethtoolOffloads(t, s.a, "tg0"); got != said {
				t.Errorf("tapgro says it set TAP offloads %q; ethtool -k shows %q", said, got)
			}

			// The client (or B) dies and comes back: A keeps its TAP and waits.
			s.pb.kill()
			s.pb = startTapgro(t, s.b, "tapgro B (restarted)", s.argsB...)
			s.pb.waitLog(readyRe, 10*time.Second)
			s.pingAll(t)

			// The server (or A) dies and comes back: B reconnects by itself.
			s.pa.kill()
			s.pa = startTapgro(t, s.a, "tapgro A (restarted)", s.argsA...)
			s.pa.waitLog(readyRe, 10*time.Second)
			s.pingAll(t)
			transfer(t, s.a, s.b, "198.18.0.2", 7003, 20<<20)

			s.pa.stop()
			s.pb.stop()
			// A clean shutdown removes the UNIX socket it created (the kill above left a
			// stale one, which the restarted server replaced because nobody answered).
			if be.name == "stream-unix" {
				if _, err := os.Stat(filepath.Join(s.dir, "s.sock")); !os.IsNotExist(err) {
					t.Errorf("socket path still there after SIGTERM: %v", err)
				}
			}
		})
	}
}

// TestBackendsJumbo carries 9000-byte frames through the stream backend: a guest given
// a jumbo MTU takes the faster path, and QEMU accepts records up to 69632 bytes.
func TestBackendsJumbo(t *testing.T) {
	netnstest.RequirePriv(t)
	for _, mtu := range []int{9000, 65521} {
		t.Run(fmt.Sprint(mtu), func(t *testing.T) {
			s := newPair(t, backends[0], "--mtu", fmt.Sprint(mtu))
			s.pingAll(t)
			out := s.a.MustRun(t, "ping", "-c", "1", "-W", "2", "-M", "do", "-s", fmt.Sprint(mtu-28), "198.18.0.2")
			t.Logf("%s", out)
			transfer(t, s.a, s.b, "198.18.0.2", 7004, 100<<20)
			transfer(t, s.b, s.a, "198.18.0.1", 7005, 100<<20)
		})
	}
}
