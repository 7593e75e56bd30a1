package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"tapgro/datapath"
	"tapgro/netdev"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

func TestParseCtlRequest(t *testing.T) {
	on, off := true, false
	good := []struct {
		line    string
		want    ctlRequest
		choice  string // "" for no whole choice
		onBits  vnethdr.Offloads
		offBits vnethdr.Offloads
	}{
		{line: "status", want: ctlRequest{status: true}},
		{line: "  status\r", want: ctlRequest{status: true}},
		{line: "offload auto", choice: "auto"},
		{line: "offload off", choice: "off"},
		{line: "offload none", choice: "off"},
		{line: "offload csum,tso4,tso6", choice: "csum,tso4,tso6"},
		{line: "offload tso4=off csum=on", onBits: oCSUM, offBits: oTSO4},
		{line: "tso4=off tso6=0 ecn=no uso=false", offBits: oTSO4 | oTSO6 | oECN | oUSO},
		{line: "offload csum tso_ecn=off", choice: "csum", offBits: oECN},
		{line: "gro=off", want: ctlRequest{gro: &off}},
		{line: "udp-gro=on", want: ctlRequest{udpGRO: &on}},
		{line: "udp_gro=off gro=on tso4=off", want: ctlRequest{gro: &on, udpGRO: &off}, offBits: oTSO4},
	}
	for _, c := range good {
		r, err := parseCtlRequest(c.line)
		if err != nil {
			t.Errorf("%q: %v", c.line, err)
			continue
		}
		choice := ""
		if r.choice != nil {
			choice = r.choice.String()
		}
		boolEq := func(a, b *bool) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
		if r.status != c.want.status || choice != c.choice || r.on != c.onBits || r.off != c.offBits ||
			!boolEq(r.gro, c.want.gro) || !boolEq(r.udpGRO, c.want.udpGRO) {
			t.Errorf("%q parsed as %+v (choice %q)", c.line, r, choice)
		}
	}
	bad := []struct{ line, msg string }{
		{"", "empty request"},
		{"   ", "empty request"},
		{"status now", "status takes no arguments"},
		{"offload", "offload: want auto"},
		{"offload tso4", "needs csum"},
		{"offload csum,gso", `unknown offload "gso"`},
		{"offload csum,", `unknown offload ""`},
		{"gro=maybe", `gro="maybe": want on or off`},
		{"gro", `"gro": want status`},
		{"gro=on gro=off", `"gro" is given twice`},
		{"ecn=on tso_ecn=off", `"tso_ecn" is given twice`},
		{"offload gro=off frob=on", `unknown switch "frob"`},
		{"uso4=on", `unknown switch "uso4"`}, // half of a pair the kernel sets only whole
		{"reboot", `"reboot": want status`},
		{"status\x00", `"status\x00": want status`},
	}
	for _, c := range bad {
		if _, err := parseCtlRequest(c.line); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: err = %v, want one containing %q", c.line, err, c.msg)
		}
	}
}

// newCtlTest is a control server for a bridge on an in-memory TAP whose kernel offers
// every offload, negotiated for a plain port with --offload auto.
func newCtlTest(t testing.TB) (*ctlServer, *datapath.Engine, *taptest.TAP) {
	return newCtlTestProbed(t, oCSUM|oTSO4|oTSO6|oECN|oUSO)
}

func newCtlTestProbed(t testing.TB, probed vnethdr.Offloads) (*ctlServer, *datapath.Engine, *taptest.TAP) {
	eng, tap := newTestEngine(t, probed, nil)
	log := logrus.New()
	log.SetOutput(tlogWriter{t})
	if _, fuzz := t.(*testing.F); fuzz {
		log.SetOutput(io.Discard) // F.Log may not be called from the fuzz function
	}
	return newCtlServer(eng, "tg0", "unix:/test.sock", log), eng, tap
}

// The handler changes exactly what each request asks for, refuses bad requests without
// changing anything, and reports the state after the change.
func TestCtlHandle(t *testing.T) {
	s, b, tap := newCtlTest(t)
	all := oCSUM | oTSO4 | oTSO6 | oECN | oUSO
	steps := []struct {
		req     string
		err     string
		mask    vnethdr.Offloads // the TAP's mask afterwards
		choice  string
		gro     bool
		udpGRO  bool
		applied string
	}{
		{req: "status", mask: all, choice: "auto", gro: true, udpGRO: true},
		{req: "offload tso4=off", mask: oCSUM | oTSO6 | oECN | oUSO, choice: "csum,tso6,tso_ecn,uso4,uso6", gro: true, udpGRO: true,
			applied: "the TAP now hands tapgro csum,tso6,tso_ecn,uso4,uso6"},
		{req: "tso6=off", mask: oCSUM | oUSO, choice: "csum,uso4,uso6", gro: true, udpGRO: true},
		{req: "csum=off", err: "without csum", mask: oCSUM | oUSO, choice: "csum,uso4,uso6", gro: true, udpGRO: true},
		{req: "offload off", mask: 0, choice: "off", gro: true, udpGRO: true, applied: "offloads off: the TAP now hands tapgro none"},
		{req: "tso4=on csum=on", mask: oCSUM | oTSO4, choice: "csum,tso4", gro: true, udpGRO: true},
		{req: "gro=off", mask: oCSUM | oTSO4, choice: "csum,tso4", gro: false, udpGRO: true, applied: "gro off"},
		// A bad request in the middle of good ones changes nothing at all.
		{req: "gro=on frob=1", err: "unknown switch", mask: oCSUM | oTSO4, choice: "csum,tso4", gro: false, udpGRO: true},
		{req: "udp-gro=off gro=on", mask: oCSUM | oTSO4, choice: "csum,tso4", gro: true, udpGRO: false},
		{req: "offload auto", mask: all, choice: "auto", gro: true, udpGRO: false},
		{req: "udp-gro=on", mask: all, choice: "auto", gro: true, udpGRO: true,
			applied: "udp-gro on, but it is inactive: it needs gro on and a TAP that accepts USO on write"},
	}
	for _, st := range steps {
		resp := s.handle(st.req, nil)
		if st.err != "" {
			if resp.OK || !strings.Contains(resp.Error, st.err) || resp.Status != nil {
				t.Errorf("%q: %+v, want an error containing %q", st.req, resp, st.err)
			}
		} else if !resp.OK || resp.Status == nil {
			t.Fatalf("%q: %+v", st.req, resp)
		}
		if got := tap.Offloads(); got != st.mask {
			t.Errorf("%q: TAP mask %s, want %s", st.req, got, st.mask)
		}
		status := s.status()
		if status.OffloadChoice != st.choice || status.TapOffloads != st.mask.String() || status.GRO != st.gro || status.UDPGRO != st.udpGRO {
			t.Errorf("%q: status choice %s offloads %s gro %v udp-gro %v; want %s %s %v %v",
				st.req, status.OffloadChoice, status.TapOffloads, status.GRO, status.UDPGRO, st.choice, st.mask, st.gro, st.udpGRO)
		}
		n := b.Snapshot().Negotiation
		if status.Negotiated != n.String() || !strings.HasPrefix(status.Negotiated, "tap offloads="+st.mask.String()+" ") {
			t.Errorf("%q: status negotiated %q; engine %q", st.req, status.Negotiated, n)
		}
		if (n.P2T&datapath.StepGRO != 0) != st.gro {
			t.Errorf("%q: the GRO engine's TCP coalescing does not follow gro=%v", st.req, st.gro)
		}
		if st.applied != "" && !strings.Contains(strings.Join(resp.Applied, "\n"), st.applied) {
			t.Errorf("%q: applied %q, want it to say %q", st.req, resp.Applied, st.applied)
		}
	}
}

// An offload the kernel does not offer is named as such in the reply.
func TestCtlHandleUnsupported(t *testing.T) {
	s, _, tap := newCtlTestProbed(t, oCSUM|oTSO4|oTSO6|oECN) // a kernel before 6.2: no USO
	resp := s.handle("offload csum,tso4,uso", nil)
	if !resp.OK || tap.Offloads() != oCSUM|oTSO4 || !strings.Contains(resp.Applied[0], "uso4,uso6: not offered by this kernel") {
		t.Fatalf("%+v; TAP mask %s", resp, tap.Offloads())
	}
}

// Counters and the port's state reach the status reply.
func TestCtlStatusCounters(t *testing.T) {
	e := newStubEngine()
	e.snap.Connected, e.snap.Peer = true, "unix:/test.sock pid=1"
	e.snap.TapToPort.Frames, e.snap.TapToPort.Bytes = 7, 7000
	e.snap.TapToPort.Drops[datapath.DropNoPeer] = 2
	e.snap.PortToTap.Reads = 40
	e.snap.PortToTap.Drops[datapath.DropTapEIO] = 1
	e.snap.GRO.Segments.Add(40)
	e.snap.GRO.Packets.Add(2)
	s := newCtlServer(e, "tg0", "unix:/test.sock", logrus.New())
	st := s.status()
	c := st.Counters
	if !st.PortConnected || c.TapToPort.Frames != 7 || c.TapToPort.Bytes != 7000 || c.TapToPort.Dropped != 2 ||
		c.PortToTap.Reads != 40 || c.PortToTap.Dropped != 1 || c.GROSegments != 40 || c.GROPackets != 2 {
		t.Fatalf("status %+v", st)
	}
	var out bytes.Buffer
	writeStatus(&out, st)
	for _, want := range []string{"negotiated:         tap offloads=", "gro coalesced:      40 segments into 2 packets (20.0 per packet)",
		"tap->port:          7 frames, 7000 bytes (read 0, dropped 2)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}
}

// ctlListen starts a control server on a fresh socket path.
func ctlListen(t *testing.T, s *ctlServer) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sub", "tg0.ctl")
	stop, err := startCtl(&options{ctlSocket: path}, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return path
}

func runCtlArgs(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = realMain(append([]string{"ctl"}, args...), &o, &e)
	return code, o.String(), e.String()
}

// The socket end to end: permissions, `tapgro ctl` output, errors, oversized and silent
// clients, and the path removed on stop.
func TestCtlSocket(t *testing.T) {
	s, _, tap := newCtlTest(t)
	path := ctlListen(t, s)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("control socket mode %v, want a socket with 0600", fi.Mode())
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("created directory: %v, %v; want 0700", di.Mode(), err)
	}

	code, out, errOut := runCtlArgs("--socket", path, "status")
	if code != 0 || !strings.Contains(out, "negotiated:") || !strings.Contains(out, "tap offloads=csum,tso4,tso6,tso_ecn,uso4,uso6") {
		t.Fatalf("ctl status: %d\n%s%s", code, out, errOut)
	}
	// Aligned: every value starts in the same column.
	col := -1
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		i := strings.Index(l, ": ")
		j := i + 2 + len(l[i+2:]) - len(strings.TrimLeft(l[i+2:], " "))
		if col == -1 {
			col = j
		}
		if j != col {
			t.Errorf("status not aligned: %q", l)
		}
	}

	code, out, errOut = runCtlArgs("--socket", path, "offload", "tso4=off")
	if code != 0 || !strings.Contains(out, "the TAP now hands tapgro csum,tso6,tso_ecn,uso4,uso6") ||
		!strings.Contains(out, "negotiated: tap offloads=csum,tso6,tso_ecn,uso4,uso6 ") || tap.Offloads() != oCSUM|oTSO6|oECN|oUSO {
		t.Fatalf("ctl offload tso4=off: %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCtlArgs("--socket", path, "offload", "tso4=maybe")
	if code != 1 || !strings.Contains(errOut, `tso4="maybe": want on or off`) || out != "" {
		t.Fatalf("bad request: %d %q %q", code, out, errOut)
	}
	code, out, _ = runCtlArgs("--socket", path, "--json", "gro=off")
	var resp ctlResponse
	if err := json.Unmarshal([]byte(out), &resp); code != 0 || err != nil || !resp.OK || resp.Status == nil || resp.Status.GRO {
		t.Fatalf("--json gro=off: %d %v %s", code, err, out)
	}
	if code, _, errOut := runCtlArgs("--socket", filepath.Join(t.TempDir(), "none.ctl"), "status"); code != 1 || !strings.Contains(errOut, "is tapgro running") {
		t.Errorf("missing socket: %d %q", code, errOut)
	}
	if code, _, _ := runCtlArgs("--socket", path); code != 2 {
		t.Errorf("no request: exit %d, want 2", code)
	}
	if code, _, _ := runCtlArgs("--socket", path, "--tap", "tg0", "status"); code != 2 {
		t.Errorf("--socket and --tap: exit %d, want 2", code)
	}

	// A request longer than the limit is refused; the daemon answers the next one.
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c.Write(bytes.Repeat([]byte("x"), 64<<10))
	body, _ := io.ReadAll(c)
	c.Close()
	if !bytes.Contains(body, []byte(`request longer than 1024 bytes`)) {
		t.Errorf("oversized request answered %q", body)
	}
	// A request without a newline, write side closed, is served.
	c, _ = net.Dial("unix", path)
	c.Write([]byte("status"))
	c.(*net.UnixConn).CloseWrite()
	body, _ = io.ReadAll(c)
	c.Close()
	if !bytes.Contains(body, []byte(`"ok":true`)) {
		t.Errorf("status without newline answered %q", body)
	}

	// Silent clients hold at most ctlMaxConns slots; one more is turned away at once, and
	// once they leave the socket serves again.
	// Replies are sent before a connection's slot is given back: wait for the last
	// client's to be free.
	deadline := time.Now().Add(10 * time.Second)
	for len(s.slots) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	var silent []net.Conn
	for i := 0; i < ctlMaxConns; i++ {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	for len(s.slots) < ctlMaxConns && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if code, _, errOut := runCtlArgs("--socket", path, "status"); code != 1 || !strings.Contains(errOut, "busy") {
		t.Errorf("with every slot taken: %d %q, want busy", code, errOut)
	}
	for _, c := range silent {
		c.Close()
	}
	for len(s.slots) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if code, _, errOut := runCtlArgs("--socket", path, "status"); code != 0 {
		t.Errorf("after the silent clients left: %d %q", code, errOut)
	}
}

// A client that connects and sends nothing is cut off by the deadline with an error.
func TestCtlReadDeadline(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	b.SetDeadline(time.Now().Add(time.Millisecond))
	if _, err := readCtlRequest(b); err == nil || !strings.Contains(err.Error(), "no complete request line") {
		t.Fatalf("err = %v", err)
	}
}

// Stale and foreign paths: a dead socket is replaced, a live one or a file is not; the
// default path only warns when it cannot be created.
func TestCtlSocketPath(t *testing.T) {
	s, _, _ := newCtlTest(t)
	dir := t.TempDir()
	stale := filepath.Join(dir, "stale.ctl")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: stale}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd) // bound, never listened on, closed: nobody answers
	stop, err := startCtl(&options{ctlSocket: stale}, s)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	if code, _, errOut := runCtlArgs("--socket", stale, "status"); code != 0 {
		t.Errorf("status on the replaced socket: %d %q", code, errOut)
	}
	// Live: a second server on the same path is refused; as the default path it warns.
	if _, err := startCtl(&options{ctlSocket: stale}, s); !errors.Is(err, netdev.ErrAddrInUse) {
		t.Errorf("second server on a live socket: %v, want ErrAddrInUse", err)
	}
	if stop2, err := startCtl(&options{ctlSocket: stale, ctlSocketDefault: true}, s); err != nil {
		t.Errorf("default path in use: %v, want a warning only", err)
	} else {
		stop2()
	}
	stop()
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket path left behind after stop: %v", err)
	}
	file := filepath.Join(dir, "file.ctl")
	os.WriteFile(file, []byte("keep"), 0o600)
	if _, err := startCtl(&options{ctlSocket: file}, s); err == nil {
		t.Error("a regular file at the path was accepted")
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Error("a regular file at the path was touched")
	}
	if stop, err := startCtl(&options{ctlSocket: ""}, s); err != nil {
		t.Error(err)
	} else {
		stop()
	}
}

// FuzzCtlRequest: no request line crashes the handler, and one that does not parse
// changes nothing.
func FuzzCtlRequest(f *testing.F) {
	for _, s := range []string{"status", "offload auto", "offload tso4=off csum=on", "gro=off udp-gro=on",
		"offload csum,tso4,tso6,tso_ecn,uso", "csum=off", "offload off tso4=on", "udp_gro=1 ecn=0", "\x00=\xff", "=", "offload ="} {
		f.Add(s)
	}
	s, b, tap := newCtlTest(f)
	f.Fuzz(func(t *testing.T, line string) {
		before := s.status()
		mask := tap.Offloads()
		resp := s.handle(line, nil)
		if _, err := json.Marshal(resp); err != nil {
			t.Fatal(err)
		}
		if _, err := parseCtlRequest(line); err != nil {
			after := s.status()
			if resp.OK || after.Negotiated != before.Negotiated || after.GRO != before.GRO || after.UDPGRO != before.UDPGRO ||
				after.OffloadChoice != before.OffloadChoice || tap.Offloads() != mask {
				t.Fatalf("%q failed to parse (%v) but changed the state", line, err)
			}
		}
		_ = b
	})
}

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func TestParseCtlPcap(t *testing.T) {
	str := func(s string) *string { return &s }
	for _, c := range []struct {
		line      string
		tap, port *string
		err       string
	}{
		{line: "pcap tap=/tmp/t.pcap", tap: str("/tmp/t.pcap")},
		{line: "pcap port=off", port: str("")},
		{line: "pcap tap=off port=/var/tmp/../tmp/p.pcap", tap: str(""), port: str("/var/tmp/p.pcap")},
		{line: "pcap", err: "want tap=FILE|off"},
		{line: "pcap tap=rel.pcap", err: "absolute path"},
		{line: "pcap guest=/x", err: "unknown side"},
		{line: "pcap tap=/x tap=off", err: "given twice"},
		{line: "pcap tap=/x port=/x", err: "its own file"},
		{line: "pcap tap", err: "want tap=FILE|off"},
		{line: "pcap tap=", err: "want tap=FILE|off"},
	} {
		r, err := parseCtlRequest(c.line)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one with %q", c.line, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.line, err)
			continue
		}
		eq := func(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
		if !eq(r.pcapTap, c.tap) || !eq(r.pcapPort, c.port) || r.editsOffloads() || r.gro != nil {
			t.Errorf("%q: parsed %+v", c.line, r)
		}
	}
}

// pcap requests switch capture at run time and show in status; a file the other side
// already writes is refused and changes nothing.
func TestCtlPcap(t *testing.T) {
	s, b, _ := newCtlTest(t)
	dir := t.TempDir()
	tapFile, portFile := filepath.Join(dir, "tap.pcap"), filepath.Join(dir, "port.pcap")
	resp := s.handle("pcap tap="+tapFile+" port="+portFile, nil)
	if !resp.OK || len(resp.Applied) != 2 {
		t.Fatalf("start: %+v", resp)
	}
	if st := b.Snapshot().CaptureTap.State; !strings.HasPrefix(st, tapFile+" ") {
		t.Fatalf("tap capture %q, want %s", st, tapFile)
	}
	if !strings.HasPrefix(resp.Status.PcapTap, tapFile+" (0 frames") || !strings.HasPrefix(resp.Status.PcapPort, portFile) {
		t.Errorf("status pcap_tap %q pcap_port %q", resp.Status.PcapTap, resp.Status.PcapPort)
	}
	if resp := s.handle("pcap port="+tapFile, nil); resp.OK || !strings.Contains(resp.Error, "own file") {
		t.Errorf("same file for both sides: %+v", resp)
	}
	if st := b.Snapshot().CapturePort.State; !strings.HasPrefix(st, portFile+" ") {
		t.Errorf("a refused switch changed the port capture to %q", st)
	}
	if resp := s.handle("pcap tap=/nonexistent-dir/x.pcap", nil); resp.OK {
		t.Errorf("a file that cannot be created: %+v", resp)
	}
	if st := b.Snapshot().CaptureTap.State; !strings.HasPrefix(st, tapFile+" ") {
		t.Errorf("a failed switch lost the tap capture: %q", st)
	}
	resp = s.handle("pcap tap=off port=off", nil)
	if !resp.OK || resp.Status.PcapTap != "off" || resp.Status.PcapPort != "off" {
		t.Fatalf("stop: %+v", resp)
	}
	if snap := b.Snapshot(); snap.CaptureTap.State != "off" || snap.CapturePort.State != "off" {
		t.Fatal("capture still on after pcap tap=off port=off")
	}
	for _, f := range []string{tapFile, portFile} {
		if fi, err := os.Stat(f); err != nil || fi.Size() != 24 || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v; want an empty capture (file header only), mode 0600", f, fi, err)
		}
	}
}

// ctlClientEnv turns the test binary into a ctl client: TestCtlRefusalIsReadable re-runs
// itself with the socket address in this variable, as another user, and the re-run
// calls ctlCall and prints what it got.
const ctlClientEnv = "TAPGRO_TEST_CTL_CLIENT"

// A client the peer-credential check refuses reads the "permission denied" reply and a
// clean end of stream, not ECONNRESET (or EPIPE on sending its request). The client must
// really be another user, since SO_PEERCRED is what connect(2) recorded: the test binary
// is re-run as nobody (65534) and dials an abstract socket, which has no file
// permissions to get past.
func TestCtlRefusalIsReadable(t *testing.T) {
	if addr := os.Getenv(ctlClientEnv); addr != "" {
		body, err := ctlCall(addr, "status", 5*time.Second)
		if err != nil {
			fmt.Printf("CTL-ERROR %v\n", err)
		} else {
			fmt.Printf("CTL-REPLY %s", body)
		}
		return
	}
	if os.Geteuid() != 0 {
		why := fmt.Sprintf("needs root to run a client as another user (euid is %d)", os.Geteuid())
		if os.Getenv("TAPGRO_REQUIRE_PRIV") == "1" {
			t.Fatalf("%s, and TAPGRO_REQUIRE_PRIV=1 forbids skipping", why)
		}
		t.Skip(why)
	}
	s, _, _ := newCtlTest(t)
	addr := fmt.Sprintf("@tapgro-ctl-test-%d", os.Getpid())
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.serve(ln); close(done) }()
	defer func() { ln.Close(); <-done }()

	// The build directory is root's (0700); nobody needs a copy it can execute.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "tapgro-ctl-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "ctl.test")
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}

	for i := 0; i < 3; i++ {
		cmd := exec.Command(bin, "-test.run=^TestCtlRefusalIsReadable$")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), ctlClientEnv+"="+addr)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			why := fmt.Sprintf("cannot run the client as uid 65534: %v\n%s", err, out)
			if os.Getenv("TAPGRO_REQUIRE_PRIV") == "1" || !errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EINVAL) {
				t.Fatal(why)
			}
			t.Skip(why)
		}
		var reply, cerr string
		for _, l := range strings.Split(string(out), "\n") {
			if r, ok := strings.CutPrefix(l, "CTL-REPLY "); ok {
				reply = r
			}
			if e, ok := strings.CutPrefix(l, "CTL-ERROR "); ok {
				cerr = e
			}
		}
		if cerr != "" || reply == "" {
			t.Fatalf("refused client: error %q, reply %q; want the refusal reply\n%s", cerr, reply, out)
		}
		var resp ctlResponse
		if err := json.Unmarshal([]byte(reply), &resp); err != nil {
			t.Fatalf("reply %q: %v", reply, err)
		}
		if resp.OK || !strings.HasPrefix(resp.Error, "permission denied") {
			t.Fatalf("reply %+v, want a permission denied error", resp)
		}
	}
}
