//go:build linux

// Package netnstest gives tests a throwaway network namespace each.
//
// A namespace is created with `ip netns add` (so it is visible to `ip netns exec`, ethtool,
// iperf3 and friends, and can be inspected by hand while a test is paused), its loopback is
// brought up, and t.Cleanup deletes it again. All names start with "tapgro-test-" so a
// crashed run can be cleaned up by prefix.
//
// Code runs inside a namespace in one of two ways: (*NS).Do switches one locked OS thread
// into the namespace for the duration of a Go function (the cilium/ebpf NetNS.Do pattern:
// a fresh goroutine, runtime.LockOSThread, and the thread is abandoned rather than reused
// if switching back fails), and (*NS).Run execs a command under `ip netns exec`.
// Anything created inside Do — file descriptors, sockets, TAP devices — stays bound to
// the namespace after Do returns and may be used from any goroutine.
//
// Privileged tests call RequirePriv first: it skips when not root or /dev/net/tun is
// missing, unless TAPGRO_REQUIRE_PRIV=1, in which case it fails.
package netnstest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"
)

// Prefix starts the name of every namespace this package creates.
const Prefix = "tapgro-test-"

// RequirePriv skips tb (or fails it when TAPGRO_REQUIRE_PRIV=1) unless the process is
// root, /dev/net/tun exists and the ip(8) and ping(8) tools are installed (ping: the
// namespace tests send their probes with it, and a missing one would read as lost
// traffic rather than as a missing tool).
func RequirePriv(tb testing.TB) {
	tb.Helper()
	var why string
	switch {
	case os.Geteuid() != 0:
		why = fmt.Sprintf("needs root (euid is %d)", os.Geteuid())
	default:
		if _, err := os.Stat("/dev/net/tun"); err != nil {
			why = fmt.Sprintf("needs /dev/net/tun: %v", err)
		} else if _, err := exec.LookPath("ip"); err != nil {
			why = "needs the ip tool (apt-get install iproute2)"
		} else if _, err := exec.LookPath("ping"); err != nil {
			why = "needs the ping tool (apt-get install iputils-ping)"
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("TAPGRO_REQUIRE_PRIV") == "1" {
		tb.Fatalf("%s, and TAPGRO_REQUIRE_PRIV=1 forbids skipping", why)
	}
	tb.Skip(why)
}

// NS is a named network namespace that lives until the end of the test that created it.
type NS struct {
	// Name is the namespace name as `ip netns` knows it.
	Name string
	// Path is its bind mount, /run/netns/<Name>.
	Path string
}

var seq atomic.Uint32

// New creates the namespace "tapgro-test-<name>-<pid>-<n>" (unique across parallel test
// binaries), brings its loopback up and registers its deletion with tb.Cleanup. It calls
// RequirePriv first.
func New(tb testing.TB, name string) *NS {
	tb.Helper()
	RequirePriv(tb)
	full := fmt.Sprintf("%s%s-%d-%d", Prefix, name, os.Getpid(), seq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", full).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", full, err, trim(out))
	}
	ns := &NS{Name: full, Path: "/run/netns/" + full}
	tb.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", full).CombinedOutput(); err != nil {
			tb.Errorf("ip netns del %s: %v: %s", full, err, trim(out))
		}
	})
	if out, err := ns.Run("ip", "link", "set", "lo", "up"); err != nil {
		tb.Fatalf("netns %s: ip link set lo up: %v: %s", full, err, trim(out))
	}
	return ns
}

// Do runs fn on a locked OS thread that has been switched into the namespace and returns
// fn's error. The calling goroutine is not affected. If the thread cannot be switched
// back, it is left locked so the runtime destroys it instead of reusing it elsewhere.
func (ns *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netnstest: current netns: %w", err)
			return
		}
		defer orig.Close()
		target, err := netns.GetFromPath(ns.Path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netnstest: open %s: %w", ns.Path, err)
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netnstest: enter %s: %w", ns.Name, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			// Keep the thread locked: it exits with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("netnstest: leave %s: %w", ns.Name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Run executes args under `ip netns exec` and returns the combined output.
func (ns *NS) Run(args ...string) ([]byte, error) {
	if len(args) == 0 {
		return nil, errors.New("netnstest: Run needs a command")
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("%s: %w", strings.Join(args, " "), err)
	}
	return out, err
}

// MustRun is Run that fails tb on error.
func (ns *NS) MustRun(tb testing.TB, args ...string) []byte {
	tb.Helper()
	out, err := ns.Run(args...)
	if err != nil {
		tb.Fatalf("netns %s: %v: %s", ns.Name, err, trim(out))
	}
	return out
}

func trim(out []byte) string { return strings.TrimSpace(string(out)) }
