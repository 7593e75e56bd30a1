package demo

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// stubPath makes a directory holding an executable stub for each name and returns it,
// so a test can give the tool check a PATH with exactly those programs.
func stubPath(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Issue 12: without iputils-ping the demo waited 20 s and blamed the bridge. The check
// must run up front and name the Debian package of each missing program.
func TestCheckDemoToolsNamesMissingPackages(t *testing.T) {
	t.Setenv("PATH", stubPath(t, "ip", "iperf3"))
	tools, notes, err := checkDemoTools(exec.LookPath)
	if err != nil {
		t.Fatalf("ip is there, so the check must not fail: %v", err)
	}
	if tools.ping || !tools.iperf3 {
		t.Errorf("tools = %+v, want ping false (built-in echo) and iperf3 true", tools)
	}
	all := strings.Join(notes, "\n")
	if !strings.Contains(all, "iputils-ping") {
		t.Errorf("notes do not name iputils-ping:\n%s", all)
	}
	if strings.Contains(all, "apt-get install -y iperf3") {
		t.Errorf("iperf3 is on the PATH but a note asks to install it:\n%s", all)
	}

	t.Setenv("PATH", stubPath(t, "ip"))
	_, notes, _ = checkDemoTools(exec.LookPath)
	if all := strings.Join(notes, "\n"); !strings.Contains(all, "iputils-ping") || !strings.Contains(all, "apt-get install -y iperf3") {
		t.Errorf("with only ip, notes must name iputils-ping and iperf3:\n%s", all)
	}

	t.Setenv("PATH", stubPath(t, "ping", "iperf3"))
	if _, _, err := checkDemoTools(exec.LookPath); err == nil || !strings.Contains(err.Error(), "iproute2") {
		t.Errorf("without ip: err = %v, want one naming iproute2", err)
	}
}

// Without ip the demo has no stand-in: it must stop at once, before creating anything,
// whether or not it runs as root.
func TestRunDemoWithoutIPFailsFast(t *testing.T) {
	t.Setenv("PATH", stubPath(t, "ping", "iperf3"))
	var stdout, stderr bytes.Buffer
	start := time.Now()
	if rc := Run(nil, &stdout, &stderr); rc != 2 {
		t.Errorf("rc = %d, want 2; stderr: %s", rc, stderr.String())
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("took %v; the tool check must come before any waiting", el)
	}
	if !strings.Contains(stderr.String(), "apt-get install -y iproute2") {
		t.Errorf("stderr does not name iproute2: %q", stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("nothing should have started, but stdout says: %q", stdout.String())
	}
}

// The built-in echo the demo uses instead of ping, against the namespace's own
// addresses (the kernel answers those itself), and its error when there is no route.
func TestDemoEchoInNamespace(t *testing.T) {
	ns := netnstest.New(t, "demoecho")
	for _, args := range [][]string{
		{"ip", "addr", "add", "198.18.0.9/32", "dev", "lo"},
		{"ip", "addr", "add", "fd00:198:18::9/128", "dev", "lo", "nodad"},
	} {
		if out, err := ns.Run(args...); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	for _, addr := range []string{"198.18.0.9", "fd00:198:18::9"} {
		e, err := newDemoEcho(ns.Name, net.ParseIP(addr))
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		// Under the full race run the first echo to a just-added IPv6 address once went
		// unanswered for a second (likely the address's setup, which Linux finishes from
		// its addrconf work queue, running late on a loaded machine): wait for the first
		// reply as the demo's own ping loop does, then every echo must be answered.
		var err0 error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
			if _, err0 = e.ping(time.Second); err0 == nil {
				break
			}
		}
		if err0 != nil {
			t.Errorf("no first echo reply from %s: %v", addr, err0)
		}
		for i := 0; i < 3; i++ {
			if _, err := e.ping(time.Second); err != nil {
				t.Errorf("echo %d to %s: %v", i, addr, err)
			}
		}
		e.close()
	}
	e, err := newDemoEcho(ns.Name, net.ParseIP("198.18.0.10"))
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	if _, err := e.ping(200 * time.Millisecond); err == nil {
		t.Error("echo to 198.18.0.10, which has no route in the namespace, succeeded")
	}
}
