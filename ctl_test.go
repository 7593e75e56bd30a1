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
	"tapgro/datapath/datapathtest"
	"tapgro/netdev"
	"tapgro/ops"
	"tapgro/port"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

// ctlListen starts a control server on a fresh socket path.
func ctlListen(t *testing.T, s *ops.CtlServer) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sub", "tg0.ctl")
	stop, err := startCtl(&options{ctlSocket: path}, s, logrus.New())
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
		!strings.Contains(out, "negotiated: tap offloads=csum,tso6,tso_ecn,uso4,uso6 ") || tap.Offloads() != vnethdr.OffloadCSUM|vnethdr.OffloadTSO6|vnethdr.OffloadTSOECN|vnethdr.OffloadUSO {
		t.Fatalf("ctl offload tso4=off: %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCtlArgs("--socket", path, "offload", "tso4=maybe")
	if code != 1 || !strings.Contains(errOut, `tso4="maybe": want on or off`) || out != "" {
		t.Fatalf("bad request: %d %q %q", code, out, errOut)
	}
	code, out, _ = runCtlArgs("--socket", path, "--json", "gro=off")
	var resp ops.Response
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

	// Silent clients hold at most ops.MaxConns slots; one more is turned away at once, and
	// once they leave the socket serves again.
	// Replies are sent before a connection's slot is given back: wait for the last
	// client's to be free.
	deadline := time.Now().Add(10 * time.Second)
	for s.Serving() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	var silent []net.Conn
	for i := 0; i < ops.MaxConns; i++ {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	for s.Serving() < ops.MaxConns && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if code, _, errOut := runCtlArgs("--socket", path, "status"); code != 1 || !strings.Contains(errOut, "busy") {
		t.Errorf("with every slot taken: %d %q, want busy", code, errOut)
	}
	for _, c := range silent {
		c.Close()
	}
	for s.Serving() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if code, _, errOut := runCtlArgs("--socket", path, "status"); code != 0 {
		t.Errorf("after the silent clients left: %d %q", code, errOut)
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
	stop, err := startCtl(&options{ctlSocket: stale}, s, logrus.New())
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	if code, _, errOut := runCtlArgs("--socket", stale, "status"); code != 0 {
		t.Errorf("status on the replaced socket: %d %q", code, errOut)
	}
	// Live: a second server on the same path is refused; as the default path it warns.
	if _, err := startCtl(&options{ctlSocket: stale}, s, logrus.New()); !errors.Is(err, netdev.ErrAddrInUse) {
		t.Errorf("second server on a live socket: %v, want ErrAddrInUse", err)
	}
	if stop2, err := startCtl(&options{ctlSocket: stale, ctlSocketDefault: true}, s, logrus.New()); err != nil {
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
	if _, err := startCtl(&options{ctlSocket: file}, s, logrus.New()); err == nil {
		t.Error("a regular file at the path was accepted")
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Error("a regular file at the path was touched")
	}
	if stop, err := startCtl(&options{ctlSocket: ""}, s, logrus.New()); err != nil {
		t.Error(err)
	} else {
		stop()
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
	go func() { s.Serve(ln); close(done) }()
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
		var resp ops.Response
		if err := json.Unmarshal([]byte(reply), &resp); err != nil {
			t.Fatalf("reply %q: %v", reply, err)
		}
		if resp.OK || !strings.HasPrefix(resp.Error, "permission denied") {
			t.Fatalf("reply %+v, want a permission denied error", resp)
		}
	}
}

// newCtlTest is a control server for a real engine on an in-memory TAP whose kernel
// offers every offload, negotiated for a plain port with --offload auto.
func newCtlTest(t testing.TB) (*ops.CtlServer, *datapath.Engine, *taptest.TAP) {
	eng, tap := datapathtest.NewEngine(t, vnethdr.OffloadCSUM|vnethdr.OffloadTSO4|vnethdr.OffloadTSO6|vnethdr.OffloadTSOECN|vnethdr.OffloadUSO, nil)
	return ops.NewCtlServer(ops.EngineDatapath(eng, new(port.Stats), nil, "tg0", "unix:/test.sock"), version, datapath.NopLogger{}), eng, tap
}
