//go:build linux

package integration

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
)

// Operating tapgro (issue 7): socket security, privilege drop, inherited sockets,
// metrics scraped with the Prometheus parser, and shutdown under load.

// startTapgroFiles is startTapgro with descriptors passed from 3 on (exec.Cmd.ExtraFiles).
// With listenFDs the command runs under a shell that sets LISTEN_PID to its own PID and
// then execs tapgro in place, so LISTEN_PID is tapgro's PID as systemd's contract wants.
func startTapgroFiles(t *testing.T, ns *netnstest.NS, name string, files []*os.File, listenFDs bool, args ...string) *proc {
	t.Helper()
	bin := tapgroBin(t)
	argv := []string{"netns", "exec", ns.Name}
	if listenFDs {
		argv = append(argv, "sh", "-c", fmt.Sprintf(`LISTEN_PID=$$ LISTEN_FDS=%d exec "$0" "$@"`, len(files)))
	}
	argv = append(append(argv, bin), args...)
	cmd := exec.Command("ip", argv...)
	cmd.ExtraFiles = files
	p := &proc{t: t, name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- log of %s ---\n%s", name, p.out.String())
		}
	})
	return p
}

// twoNS is two namespaces, each to get a tapgro on TAP tg0.
func twoNS(t *testing.T) (*netnstest.NS, *netnstest.NS) {
	return netnstest.New(t, "a"), netnstest.New(t, "b")
}

func tapArgs(addr4, addr6 string, more ...string) []string {
	return append([]string{"--tap", "tg0", "--mtu", "1500", "--addr", addr4, "--addr", addr6, "--log-level", "debug"}, more...)
}

func pingBoth(t *testing.T, a, b *netnstest.NS) {
	t.Helper()
	waitPing(t, a, "198.18.0.2", 20*time.Second)
	waitPing(t, b, "198.18.0.1", 10*time.Second)
}

// openDir makes a directory any user may traverse, owned by uid (sockets in t.TempDir
// would be unreachable for other users because of the directory, not the socket mode).
func openDir(t *testing.T, uid int) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tapgro-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, -1); err != nil {
		t.Fatal(err)
	}
	return dir
}

// connectAsNobody connects to a UNIX socket as uid/gid 65534 (socat in a child with those
// credentials) and returns its error output.
func connectAsNobody(t *testing.T, path string) (string, error) {
	t.Helper()
	cmd := exec.Command("socat", "-u", "OPEN:/dev/null", "UNIX-CONNECT:"+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestSocketSecurity: the socket is 0600, a user other than tapgro's cannot connect
// (EACCES), and --socket-mode widens it (then the same user can, and is logged with its
// SO_PEERCRED uid). A path that is not a socket is refused and left alone.
func TestSocketSecurity(t *testing.T) {
	netnstest.RequirePriv(t)
	if _, err := exec.LookPath("socat"); err != nil {
		if os.Getenv("TAPGRO_REQUIRE_PRIV") == "1" {
			t.Fatal("socat not installed (apt-get install socat), and TAPGRO_REQUIRE_PRIV=1 forbids skipping")
		}
		t.Skip("socat not installed (apt-get install socat)")
	}
	a, _ := twoNS(t)
	dir := openDir(t, 0)
	path := filepath.Join(dir, "s.sock")
	nd := "stream,server=on,addr.type=unix,addr.path=" + path

	p := startTapgro(t, a, "tapgro 0600", tapArgs("198.18.0.1/24", "fd00:198:18::1/64", "--netdev", nd)...)
	p.waitLog(readyRe, 10*time.Second)
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %v, want a socket with mode 0600", fi.Mode())
	}
	out, err := connectAsNobody(t, path)
	if err == nil || !strings.Contains(out, "Permission denied") {
		t.Errorf("uid 65534 connecting to a 0600 socket: %v %s; want EACCES", err, out)
	}
	p.stop()

	// Not a socket: refused at start-up, file untouched.
	if err := os.WriteFile(path, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	q := startTapgro(t, a, "tapgro over a file", tapArgs("198.18.0.1/24", "fd00:198:18::1/64", "--netdev", nd)...)
	<-q.done
	if q.cmd.ProcessState.ExitCode() == 0 || !strings.Contains(q.out.String(), "is not a socket") {
		t.Errorf("tapgro over a regular file: exit %d\n%s", q.cmd.ProcessState.ExitCode(), q.out.String())
	}
	if b, _ := os.ReadFile(path); string(b) != "keep" {
		t.Errorf("the file was changed: %q", b)
	}
	os.Remove(path)

	// Widened: the other user gets in, and the accept names it.
	w := startTapgro(t, a, "tapgro 0666", tapArgs("198.18.0.1/24", "fd00:198:18::1/64", "--netdev", nd, "--socket-mode", "0666", "--socket-group", "nogroup")...)
	w.waitLog(readyRe, 10*time.Second)
	fi, _ = os.Lstat(path)
	if fi.Mode().Perm() != 0o666 {
		t.Errorf("--socket-mode 0666: mode %v", fi.Mode().Perm())
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Gid != 65534 {
		t.Errorf("--socket-group nogroup: gid %d", st.Gid)
	}
	if out, err := connectAsNobody(t, path); err != nil {
		t.Errorf("uid 65534 connecting to a 0666 socket: %v %s", err, out)
	}
	w.waitLog(regexp.MustCompile(`port connected.*uid=65534`), 5*time.Second)
	w.stop()
}

// TestPrivilegeDrop: with --user nobody both tapgro end up uid 65534 with no
// capabilities, and the datapath still carries ping and a checked transfer both ways.
func TestPrivilegeDrop(t *testing.T) {
	netnstest.RequirePriv(t)
	a, b := twoNS(t)
	// The directory belongs to nobody so the dropped server can unlink its socket at exit.
	dir := openDir(t, 65534)
	path := filepath.Join(dir, "s.sock")
	pa := startTapgro(t, a, "tapgro A", tapArgs("198.18.0.1/24", "fd00:198:18::1/64",
		"--netdev", "stream,server=on,addr.type=unix,addr.path="+path, "--user", "nobody")...)
	pa.waitLog(readyRe, 10*time.Second)
	pb := startTapgro(t, b, "tapgro B", tapArgs("198.18.0.2/24", "fd00:198:18::2/64",
		"--netdev", "stream,server=off,addr.type=unix,addr.path="+path, "--user", "nobody")...)
	pb.waitLog(readyRe, 10*time.Second)

	for _, p := range []*proc{pa, pb} {
		// Every thread, not just the main one: the datapath runs on others.
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", p.cmd.Process.Pid))
		if len(tasks) < 2 {
			t.Fatalf("%s: %d threads found", p.name, len(tasks))
		}
		for _, task := range tasks {
			st, err := os.ReadFile(task)
			if err != nil {
				continue // the thread exited
			}
			if !strings.Contains(string(st), "Uid:\t65534\t65534\t65534\t65534") || !strings.Contains(string(st), "CapEff:\t0000000000000000") {
				t.Errorf("%s: %s still privileged:\n%s", p.name, task, st)
			}
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"Uid:\t65534\t65534\t65534\t65534", "Gid:\t65534\t65534\t65534\t65534", "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000"} {
			if !strings.Contains(string(st), want) {
				t.Errorf("%s: /proc status lacks %q:\n%s", p.name, want, st)
			}
		}
	}
	if fi, err := os.Lstat(path); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 65534 {
		t.Errorf("socket path not owned by the --user account: %v", err)
	}
	pingBoth(t, a, b)
	transfer(t, a, b, "198.18.0.2", 7101, 50<<20)
	transfer(t, b, a, "198.18.0.1", 7102, 50<<20)
	pb.stop()
	pa.stop()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("socket path left after SIGTERM: %v", err)
	}
}

// TestSystemdActivation passes a listening socket the way systemd does (fd 3,
// LISTEN_FDS=1, LISTEN_PID = tapgro's PID). tapgro must use it, not bind its own; the
// path belongs to the "service manager" and survives tapgro's exit, and a restarted
// tapgro given the same socket (addr.type=fd this time) serves the client again.
func TestSystemdActivation(t *testing.T) {
	netnstest.RequirePriv(t)
	a, b := twoNS(t)
	path := filepath.Join(t.TempDir(), "act.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lf, err := ln.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	before, _ := os.Lstat(path)

	pa := startTapgroFiles(t, a, "tapgro A (activated)", []*os.File{lf}, true,
		tapArgs("198.18.0.1/24", "fd00:198:18::1/64", "--netdev", "stream,server=on,addr.type=unix,addr.path="+path)...)
	pa.waitLog(readyRe, 10*time.Second)
	if after, err := os.Lstat(path); err != nil || !os.SameFile(before, after) {
		t.Fatalf("tapgro replaced the passed socket's path instead of using it: %v", err)
	}
	pb := startTapgro(t, b, "tapgro B", tapArgs("198.18.0.2/24", "fd00:198:18::2/64",
		"--netdev", "stream,server=off,addr.type=unix,addr.path="+path)...)
	pb.waitLog(readyRe, 10*time.Second)
	pingBoth(t, a, b)
	pa.stop()
	if after, err := os.Lstat(path); err != nil || !os.SameFile(before, after) {
		t.Fatalf("tapgro removed the service manager's socket path at exit: %v", err)
	}

	pa = startTapgroFiles(t, a, "tapgro A (fd=3)", []*os.File{lf}, true,
		tapArgs("198.18.0.1/24", "fd00:198:18::1/64", "--netdev", "stream,server=on,addr.type=fd,addr.str=3")...)
	pa.waitLog(regexp.MustCompile(`tapgro ready.*addr.path=`+regexp.QuoteMeta(path)), 10*time.Second)
	pingBoth(t, a, b)
	pa.stop()
	pb.stop()

	// Without LISTEN_* for it, fd 3 is just an open descriptor: tapgro binds its own
	// socket for addr.path (refused here: the path is live) and never touches fd 3.
	cmdOut := startTapgroFiles(t, a, "tapgro A (foreign LISTEN_PID)", []*os.File{lf}, false,
		tapArgs("198.18.0.1/24", "fd00:198:18::1/64", "--netdev", "stream,server=on,addr.type=unix,addr.path="+path)...)
	<-cmdOut.done
	if !strings.Contains(cmdOut.out.String(), "address in use") {
		t.Errorf("without LISTEN_*, tapgro should have tried to bind the live path:\n%s", cmdOut.out.String())
	}
}

// TestInheritedConnection joins two tapgro through a socketpair they inherit, in QEMU's
// two spellings (socket,fd=N and stream,addr.type=fd). When one side exits, the other
// cannot redial a connection it was given, and exits 0.
func TestInheritedConnection(t *testing.T) {
	netnstest.RequirePriv(t)
	a, b := twoNS(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	fa, fb := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	pa := startTapgroFiles(t, a, "tapgro A (socket,fd=3)", []*os.File{fa}, false,
		tapArgs("198.18.0.1/24", "fd00:198:18::1/64", "--netdev", "socket,fd=3")...)
	pb := startTapgroFiles(t, b, "tapgro B (stream fd)", []*os.File{fb}, false,
		tapArgs("198.18.0.2/24", "fd00:198:18::2/64", "--netdev", "stream,server=off,addr.type=fd,addr.str=3")...)
	fa.Close()
	fb.Close()
	pa.waitLog(regexp.MustCompile(`tapgro ready.*inherited connection fd:3`), 10*time.Second)
	pb.waitLog(readyRe, 10*time.Second)
	pingBoth(t, a, b)
	transfer(t, a, b, "198.18.0.2", 7111, 20<<20)
	pb.stop()
	select {
	case <-pa.done:
	case <-time.After(10 * time.Second):
		t.Fatal("A kept running after its inherited connection ended")
	}
	if code := pa.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(pa.out.String(), "the inherited connection has ended") {
		t.Errorf("A exited %d:\n%s", code, pa.out.String())
	}
}

// scrapeNS fetches /metrics from inside ns and parses it with the Prometheus text parser.
func scrapeNS(t *testing.T, ns *netnstest.NS, addr, path string) (int, string) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		var c net.Conn
		err := ns.Do(func() (err error) { c, err = net.Dial(network, a); return err })
		return c, err
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s%s in %s: %v", addr, path, ns.Name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

type families map[string]*familyValues

type familyValues struct {
	kind   string
	values map[string]float64 // by rendered label set, e.g. `direction="tap_to_port"`
}

func parseMetrics(t *testing.T, body string) families {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("Prometheus text parser: %v\n%s", err, body)
	}
	out := families{}
	for name, f := range fams {
		fv := &familyValues{kind: f.GetType().String(), values: map[string]float64{}}
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+strconv.Quote(l.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
			if h := m.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			fv.values[strings.Join(ls, ",")] = v
		}
		out[name] = fv
	}
	return out
}

func (f families) get(t *testing.T, name, labels string) float64 {
	t.Helper()
	fv, ok := f[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	v, ok := fv.values[labels]
	if !ok {
		t.Fatalf("metric %s{%s} missing; have %v", name, labels, fv.values)
	}
	return v
}

// documentedMetrics reads the metric names from docs/metrics.md's table.
func documentedMetrics(t *testing.T) []string {
	f, err := os.Open("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	re := regexp.MustCompile("^\\| `(tapgro_[a-z0-9_]+)`")
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			names = append(names, m[1])
		}
	}
	if len(names) < 20 {
		t.Fatalf("found only %d metric names in docs/metrics.md", len(names))
	}
	return names
}

// TestMetricsScrape scrapes both tapgro after real traffic and checks every documented
// name is there (netmap- and vhost-user-only ones excepted), the values agree with the traffic sent and
// with each other across the link, and /healthz is 200.
func TestMetricsScrape(t *testing.T) {
	netnstest.RequirePriv(t)
	const maddr = "127.0.0.1:9109"
	s := newPair(t, backends[0], "--metrics-addr", maddr)
	s.pingAll(t)
	const size = 30 << 20
	transfer(t, s.a, s.b, "198.18.0.2", 7121, size)
	transfer(t, s.b, s.a, "198.18.0.1", 7122, size)

	code, body := scrapeNS(t, s.a, maddr, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	ma := parseMetrics(t, body)
	for _, name := range documentedMetrics(t) {
		if strings.HasPrefix(name, "tapgro_netmap_") || strings.HasPrefix(name, "tapgro_vhost_") {
			continue // exported for netmap ports / --netdev vhost-user only
		}
		if _, ok := ma[name]; !ok {
			t.Errorf("documented metric %s missing from the scrape", name)
		}
	}
	for name := range ma {
		if strings.HasPrefix(name, "tapgro_") && !strings.Contains(metricsDocText(t), "`"+name+"`") {
			t.Errorf("scraped metric %s is not documented", name)
		}
	}
	const t2p, p2t = `direction="tap_to_port"`, `direction="port_to_tap"`
	// A sent `size` bytes of TCP payload through its TAP→port direction: at least that
	// many Ethernet bytes, in at least size/1448 MTU frames, all split from GSO frames.
	if v := ma.get(t, "tapgro_bytes_total", t2p); v < size {
		t.Errorf("tap_to_port bytes %v < %d sent", v, size)
	}
	if v := ma.get(t, "tapgro_frames_total", t2p); v < size/1448 {
		t.Errorf("tap_to_port frames %v < %d", v, size/1448)
	}
	if ma.get(t, "tapgro_gso_segmented_total", "") == 0 {
		t.Errorf("no GSO frame was segmented for %d bytes of TCP", size)
	}
	// B→A arrived through GRO: fewer TAP writes than frames read from the port.
	if w, r := ma.get(t, "tapgro_frames_total", p2t), ma.get(t, "tapgro_read_frames_total", p2t); w >= r || r < size/1448 {
		t.Errorf("port_to_tap wrote %v packets for %v frames read; want GRO to merge", w, r)
	}
	if v := ma.get(t, "tapgro_port_connected", ""); v != 1 {
		t.Errorf("tapgro_port_connected %v", v)
	}
	if v := ma.get(t, "tapgro_port_connects_total", ""); v < 1 {
		t.Errorf("tapgro_port_connects_total %v", v)
	}
	if len(ma["tapgro_port_peer_info"].values) != 1 {
		t.Errorf("tapgro_port_peer_info %v, want one peer", ma["tapgro_port_peer_info"].values)
	}
	for k := range ma["tapgro_port_peer_info"].values {
		if !strings.Contains(k, "pid=") {
			t.Errorf("peer %s lacks SO_PEERCRED", k)
		}
	}
	if v := ma.get(t, "tapgro_stalled", t2p) + ma.get(t, "tapgro_stalled", p2t); v != 0 {
		t.Errorf("tapgro_stalled %v after a healthy run", v)
	}
	if st := ma.get(t, "tapgro_start_time_seconds", ""); time.Since(time.Unix(int64(st), 0)) > time.Hour || st > float64(time.Now().Unix()) {
		t.Errorf("start time %v", st)
	}
	// A stream port starts on one P and the scaler keeps it within the CPUs.
	if v := ma.get(t, "tapgro_gomaxprocs", ""); v < 1 || v > float64(runtime.NumCPU()) {
		t.Errorf("tapgro_gomaxprocs %v, want 1..%d", v, runtime.NumCPU())
	}
	if ma["tapgro_gro_segments_per_packet"].kind != "HISTOGRAM" {
		t.Errorf("segments per packet is a %s", ma["tapgro_gro_segments_per_packet"].kind)
	}
	if code, body := scrapeNS(t, s.a, maddr, "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}

	// Across the link (a lossless stream): once traffic settles, every frame A delivered
	// to the port is a frame B read from it, apart from A's announcements (written to the
	// port directly, counted on neither side's datapath).
	announced := announcedFrames(t, s.pa)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ba := scrapeNS(t, s.a, maddr, "/metrics")
		_, bb := scrapeNS(t, s.b, maddr, "/metrics")
		sent := parseMetrics(t, ba).get(t, "tapgro_frames_total", t2p)
		got := parseMetrics(t, bb).get(t, "tapgro_read_frames_total", p2t)
		if got == sent+announced {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("A delivered %v frames (+%v announced) to the port, B read %v", sent, announced, got)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// metricsDocText is docs/metrics.md, where every exported series must be named.
func metricsDocText(t *testing.T) string {
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var announcedRe = regexp.MustCompile(`addrs=(\d+).*announced the TAP's addresses|announced the TAP's addresses.*addrs=(\d+)`)

// announcedFrames sums the announcement frames tapgro logged (one line per connection).
func announcedFrames(t *testing.T, p *proc) float64 {
	var n float64
	for _, m := range announcedRe.FindAllStringSubmatch(p.out.String(), -1) {
		v, _ := strconv.Atoi(m[1] + m[2])
		n += float64(v)
	}
	return n
}

// TestSIGTERMUnderLoad: numbered UDP datagrams stream from A to B while B is briefly
// frozen (SIGSTOP), so frames pile up in A's receive pool and socket. The sender stops,
// A gets SIGTERM while B is still frozen, and B thaws. A must exit 0 having delivered
// everything it read from its TAP: frames read == frames delivered + frames counted as
// dropped, with no port_error drops (the shutdown waited for the port), and B must have
// read exactly what A delivered. Kernel-side losses (the TAP's queue, B's UDP socket)
// are outside tapgro and only logged.
func TestSIGTERMUnderLoad(t *testing.T) {
	netnstest.RequirePriv(t)
	const maddr = "127.0.0.1:9110"
	s := newPair(t, backends[0], "--metrics-addr", maddr)
	s.pingAll(t)

	var rc *net.UDPConn
	if err := s.b.Do(func() (err error) {
		rc, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("198.18.0.2"), Port: 7130})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	rc.SetReadBuffer(32 << 20)
	seen := make(map[uint64]bool)
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		buf := make([]byte, 2048)
		for {
			rc.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := rc.Read(buf)
			if err != nil {
				return
			}
			if n >= 8 {
				seen[binary.BigEndian.Uint64(buf)] = true
			}
		}
	}()

	var sc *net.UDPConn
	if err := s.a.Do(func() (err error) {
		sc, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP("198.18.0.2"), Port: 7130})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	payload := make([]byte, 1200)
	var sent uint64
	send := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			binary.BigEndian.PutUint64(payload, sent)
			if _, err := sc.Write(payload); err == nil {
				sent++
			}
		}
	}
	send(300 * time.Millisecond)
	s.pb.cmd.Process.Signal(syscall.SIGSTOP)
	send(500 * time.Millisecond) // B reads nothing: A's socket and pool fill
	_, body := scrapeNS(t, s.a, maddr, "/metrics")
	m := parseMetrics(t, body)
	t.Logf("before SIGTERM: A's receive pool has %v buffers in use after %v stalls",
		m.get(t, "tapgro_rx_buffers_in_use", ""), m.get(t, "tapgro_rx_stalls_total", ""))
	s.pa.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond)
	s.pb.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case <-s.pa.done:
	case <-time.After(15 * time.Second):
		t.Fatal("A did not exit after SIGTERM")
	}
	if code := s.pa.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("A exited %d", code)
	}
	// A's counters come from its exit line: they are final only once the shutdown has
	// drained the receive pool into the port, and the metrics server stops right after.
	sa := exitSummary(t, s.pa)
	if sa["tap_to_port_gso_segmented"] != 0 {
		t.Fatalf("A segmented GSO frames; the balance below assumes plain UDP frames: %v", sa)
	}
	if sa["tap_to_port_reads"] != sa["tap_to_port_frames"]+sa["tap_to_port_dropped"] {
		t.Errorf("A read %d frames from its TAP but delivered %d and counted %d dropped: %d unexplained",
			sa["tap_to_port_reads"], sa["tap_to_port_frames"], sa["tap_to_port_dropped"],
			int64(sa["tap_to_port_reads"])-int64(sa["tap_to_port_frames"]+sa["tap_to_port_dropped"]))
	}
	if n := sa["tap_to_port_port_error"]; n != 0 {
		t.Errorf("A dropped %d frames it had read because the port was closed under them", n)
	}
	if strings.Contains(s.pa.out.String(), "dropping what is still queued") {
		t.Errorf("A's shutdown gave up on the port although B came back within the drain time")
	}
	// B reads A's stream to its end, then goes back to dialling: its port→TAP pipeline
	// has returned before it logs that, so its read count is final and /metrics has it.
	s.pb.waitLog(regexp.MustCompile(`port (disconnected|connection ended)`), 10*time.Second)
	bReads := uint64(scrape(t, s.b, maddr).get(t, mP2TReads))
	s.pb.stop()
	if want := sa["tap_to_port_frames"] + uint64(announcedFrames(t, s.pa)); bReads != want {
		t.Errorf("B read %d frames from the port; A delivered %d (with announcements)", bReads, want)
	}
	<-recvDone
	t.Logf("sender wrote %d datagrams; the receiving socket got %d; A read %d frames from its TAP, delivered %d, dropped %d (no peer etc.)",
		sent, len(seen), sa["tap_to_port_reads"], sa["tap_to_port_frames"], sa["tap_to_port_dropped"])
}

// TestSIGHUPReopensLog: logrotate's move-then-SIGHUP. The old file keeps what was
// written before the signal, the new one gets everything after, and tapgro keeps running.
func TestSIGHUPReopensLog(t *testing.T) {
	netnstest.RequirePriv(t)
	a, _ := twoNS(t)
	dir := t.TempDir()
	logPath := filepath.Join(dir, "tapgro.log")
	p := startTapgro(t, a, "tapgro", tapArgs("198.18.0.1/24", "fd00:198:18::1/64",
		"--netdev", "stream,server=on,addr.type=unix,addr.path="+filepath.Join(dir, "s.sock"), "--log-file", logPath)...)
	waitFile := func(path, want string) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			b, _ := os.ReadFile(path)
			if strings.Contains(string(b), want) {
				return string(b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never contained %q:\n%s\nstderr:\n%s", path, want, b, p.out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFile(logPath, "tapgro ready")
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	p.cmd.Process.Signal(syscall.SIGHUP)
	waitFile(logPath, "SIGHUP: reopened")
	p.stop()
	cur := waitFile(logPath, "tapgro exiting")
	old, _ := os.ReadFile(logPath + ".1")
	if strings.Contains(string(old), "tapgro exiting") || strings.Contains(cur, "tapgro ready") {
		t.Errorf("lines in the wrong file:\n--- old ---\n%s--- new ---\n%s", old, cur)
	}
	if p.out.String() != "" {
		t.Errorf("tapgro wrote to stderr despite --log-file:\n%s", p.out.String())
	}
}
