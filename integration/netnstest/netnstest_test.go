//go:build linux

package netnstest

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

func TestNamespaceIsolated(t *testing.T) {
	ns := New(t, "self")
	if !strings.HasPrefix(ns.Name, Prefix) {
		t.Fatalf("name %q lacks prefix %q", ns.Name, Prefix)
	}
	host, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()

	var inside netns.NsHandle
	err = ns.Do(func() error {
		h, err := netns.Get()
		inside = h
		if err != nil {
			return err
		}
		// A fresh namespace has only lo, which New brought up.
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		if len(ifs) != 1 || ifs[0].Name != "lo" || ifs[0].Flags&net.FlagUp == 0 {
			t.Errorf("interfaces in fresh netns = %+v, want only lo, up", ifs)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	if inside.Equal(host) {
		t.Fatal("Do ran in the host namespace")
	}
	// The calling thread must not have moved.
	now, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer now.Close()
	if !now.Equal(host) {
		t.Fatal("caller's namespace changed")
	}

	out := ns.MustRun(t, "ip", "-o", "link")
	if strings.Count(strings.TrimSpace(string(out)), "\n") != 0 || !strings.Contains(string(out), "lo:") {
		t.Fatalf("ip link inside netns: %q, want only lo", out)
	}
}

func TestCleanupDeletes(t *testing.T) {
	var path string
	t.Run("inner", func(t *testing.T) {
		path = New(t, "cleanup").Path
		if _, err := os.Stat(path); err != nil {
			t.Fatal(err)
		}
	})
	if path == "" {
		t.Skip("inner test skipped")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("%s still exists after cleanup (stat err %v)", path, err)
	}
}
