//go:build linux

package integration

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// The harness runs the real tapgro binary, each instance in its own network namespace,
// exactly as a user would: `ip netns exec NS tapgro --tap ... --netdev ...`.

// builds are the tapgro binaries built so far, by build tags ("" is the product).
var builds sync.Map // string → *build

type build struct {
	once sync.Once
	path string
	err  error
}

// tapgroBin builds tapgro once per test binary.
func tapgroBin(t testing.TB) string { return tapgroBinTags(t, "") }

// tapgroBinTags builds tapgro with build tags (comma-separated; "" for none) once per
// test binary: tapgro_unlogged_rx is the migration tests' control.
func tapgroBinTags(t testing.TB, tags string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(tags, &build{})
	b := v.(*build)
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "tapgro-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.path = filepath.Join(dir, "tapgro")
		gobin := "go"
		if _, err := exec.LookPath(gobin); err != nil {
			gobin = "/usr/local/go/bin/go"
		}
		out, err := exec.Command(gobin, "build", "-tags", tags, "-o", b.path, "tapgro").CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build -tags %q: %v: %s", tags, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// syncBuffer collects a process's output; the process writes while the test reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is one running tapgro.
type proc struct {
	t    testing.TB
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startTapgro runs tapgro inside ns. The process is killed at the end of the test if it
// is still running; its log is printed when the test failed.
func startTapgro(t testing.TB, ns *netnstest.NS, name string, args ...string) *proc {
	t.Helper()
	return startTapgroBin(t, tapgroBin(t), ns, name, args...)
}

// startTapgroBin is startTapgro with another build of tapgro (tapgroBinTags).
func startTapgroBin(t testing.TB, bin string, ns *netnstest.NS, name string, args ...string) *proc {
	t.Helper()
	if !slices.Contains(args, "--ctl-socket") {
		// The default control socket, /run/tapgro/<tap>.ctl, is shared by every
		// namespace: tests whose TAPs share a name would race for it, and a killed
		// tapgro would leave it behind on the host.
		args = append(slices.Clip(args), "--ctl-socket", "")
	}
	// ip netns exec execs in place, so the PID we hold is tapgro's own.
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name, bin}, args...)...)
	// Every goroutine's stack in the SIGQUIT dump a failed test asks for (below).
	cmd.Env = append(os.Environ(), "GOTRACEBACK=all")
	p := &proc{t: t, name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		if t.Failed() {
			p.dumpStacks()
		}
		p.kill()
		if t.Failed() {
			t.Logf("--- log of %s ---\n%s", name, p.out.String())
			if sum := goroutineSummary(p.out.String()); sum != "" {
				// Last, so that a log cut in the middle (CI prints the ends) keeps it.
				t.Logf("--- %s's goroutines at the failure, innermost tapgro frame ---\n%s", name, sum)
			}
		}
	})
	return p
}

// goroutineSummary is one line per goroutine of the runtime's stack dump in log: its
// state and the innermost frame in tapgro's own code (the runtime's frames say only
// that it waits).
func goroutineSummary(log string) string {
	var b strings.Builder
	for _, g := range strings.Split(log, "\ngoroutine ")[1:] {
		lines := strings.Split(g, "\n")
		head, frame := lines[0], "(no tapgro frame)"
		for _, l := range lines[1:] {
			if strings.HasPrefix(l, "tapgro/") || strings.HasPrefix(l, "main.") {
				frame = l
				break
			}
		}
		fmt.Fprintf(&b, "goroutine %s %s\n", head, frame)
	}
	return b.String()
}

// dumpStacks asks a still running tapgro for its goroutines' stacks (the Go runtime's
// SIGQUIT dump, into the log) before a failed test kills it: a test that timed out
// waiting for traffic then shows where tapgro's workers were.
func (p *proc) dumpStacks() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
	}
}

func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Kill()
		<-p.done
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.kill()
		p.t.Fatalf("%s did not exit within 10s of SIGTERM", p.name)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		p.t.Fatalf("%s exited %d after SIGTERM\n%s", p.name, code, p.out.String())
	}
}

// waitLog waits until tapgro's log matches re and returns the first submatch.
func (p *proc) waitLog(re *regexp.Regexp, limit time.Duration) string {
	p.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			if len(m) > 1 {
				return m[1]
			}
			return m[0]
		}
		select {
		case <-p.done:
			p.t.Fatalf("%s exited while waiting for %q:\n%s", p.name, re, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: no log line matching %q after %v:\n%s", p.name, re, limit, p.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitPing pings dst from ns until it answers.
func waitPing(t testing.TB, ns *netnstest.NS, dst string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		out, err := ns.Run("ping", "-c", "1", "-W", "1", dst)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ping %s from %s: no answer after %v: %v\n%s", dst, ns.Name, limit, err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// veth joins two namespaces with a veth pair named wire0 on each side, addressed
// 198.19.0.1/24 and 198.19.0.2/24: the "network between two hosts" that inet ports use.
func veth(t testing.TB, a, b *netnstest.NS, mtu int) {
	t.Helper()
	a.MustRun(t, "ip", "link", "add", "wire0", "mtu", fmt.Sprint(mtu), "type", "veth", "peer", "name", "wire1", "mtu", fmt.Sprint(mtu))
	a.MustRun(t, "ip", "link", "set", "wire1", "netns", b.Name)
	b.MustRun(t, "ip", "link", "set", "wire1", "name", "wire0")
	a.MustRun(t, "ip", "addr", "add", "198.19.0.1/24", "dev", "wire0")
	b.MustRun(t, "ip", "addr", "add", "198.19.0.2/24", "dev", "wire0")
	a.MustRun(t, "ip", "link", "set", "wire0", "up")
	b.MustRun(t, "ip", "link", "set", "wire0", "up")
}

// transfer sends size bytes of seeded pseudo-random data over TCP from ns `from` to
// dst:port in ns `to`, and fails unless the receiver's SHA-256 equals the sender's.
func transfer(t testing.TB, from, to *netnstest.NS, dst string, port int, size int64) time.Duration {
	t.Helper()
	var ln net.Listener
	if err := to.Do(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort(dst, fmt.Sprint(port)))
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", to.Name, err)
	}
	defer ln.Close()

	type result struct {
		sum [32]byte
		n   int64
		err error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		h := sha256.New()
		n, err := io.Copy(h, c)
		var r result
		copy(r.sum[:], h.Sum(nil))
		r.n, r.err = n, err
		got <- r
	}()

	var c net.Conn
	if err := from.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", net.JoinHostPort(dst, fmt.Sprint(port)), 10*time.Second)
		return err
	}); err != nil {
		t.Fatalf("dial %s:%d from %s: %v", dst, port, from.Name, err)
	}
	start := time.Now()
	h := sha256.New()
	rng := rand.New(rand.NewPCG(uint64(size), uint64(port)))
	buf := make([]byte, 256<<10)
	for sent := int64(0); sent < size; {
		chunk := buf[:min(int64(len(buf)), size-sent)]
		for i := 0; i+8 <= len(chunk); i += 8 {
			v := rng.Uint64()
			for j := 0; j < 8; j++ {
				chunk[i+j] = byte(v >> (8 * j))
			}
		}
		h.Write(chunk)
		c.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(chunk); err != nil {
			t.Fatalf("send after %d bytes: %v", sent, err)
		}
		sent += int64(len(chunk))
	}
	c.Close()
	var want [32]byte
	copy(want[:], h.Sum(nil))
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("receive: %v after %d bytes", r.err, r.n)
		}
		if r.n != size || r.sum != want {
			t.Fatalf("received %d bytes with sha256 %x; sent %d bytes with sha256 %x", r.n, r.sum, size, want)
		}
	case <-time.After(120 * time.Second):
		t.Fatalf("receiver did not finish within 120s")
	}
	return time.Since(start)
}

var offloadsRe = regexp.MustCompile(`tap_offloads="?([a-z0-9_,]+)"?`)

// ethtoolOffloads reads the TAP's offload features back from the kernel, named the way
// tapgro names them, so the test compares what tapgro says with what the kernel did.
func ethtoolOffloads(t testing.TB, ns *netnstest.NS, dev string) string {
	t.Helper()
	out := ns.MustRun(t, "ethtool", "-k", dev)
	feat := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok {
			feat[k] = strings.HasPrefix(strings.TrimSpace(v), "on")
		}
	}
	var names []string
	for _, m := range []struct{ name, feature string }{
		{"csum", "tx-checksum-ip-generic"},
		{"tso4", "tx-tcp-segmentation"},
		{"tso6", "tx-tcp6-segmentation"},
		{"tso_ecn", "tx-tcp-ecn-segmentation"},
		{"uso4", "tx-udp-segmentation"},
		{"uso6", "tx-udp-segmentation"},
	} {
		if feat[m.feature] {
			names = append(names, m.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

func TestGoroutineSummary(t *testing.T) {
	dump := "level=info msg=x\nSIGQUIT: quit\n\ngoroutine 1 gp=0x1 m=nil [select, 4 minutes]:\nruntime.gopark(0x0)\n\t/usr/local/go/src/runtime/proc.go:460\ntapgro/sockport.(*StreamPort).Read(0xc0)\n\t/w/sockport/stream.go:10\nmain.main()\n\ngoroutine 7 gp=0x2 m=nil [running]:\nruntime.futex()\n"
	want := "goroutine 1 gp=0x1 m=nil [select, 4 minutes]: tapgro/sockport.(*StreamPort).Read(0xc0)\ngoroutine 7 gp=0x2 m=nil [running]: (no tapgro frame)\n"
	if got := goroutineSummary(dump); got != want {
		t.Errorf("goroutineSummary:\n%s\nwant\n%s", got, want)
	}
}
