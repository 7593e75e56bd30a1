package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnits checks contrib/systemd's units with systemd-analyze verify, as
// instances for a TAP named tg0, with ExecStart pointing at an executable that exists
// here.
func TestSystemdUnits(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("TAPGRO_REQUIRE_PRIV") != "" {
			t.Fatal("systemd-analyze is missing (test.sh installs systemd)")
		}
		t.Skip("systemd-analyze is missing: apt-get install systemd")
	}
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var units []string
	for _, name := range []string{"tapgro@.service", "tapgro@.socket", "tapgro-vhost@.service", "tapgro-vhost@.socket"} {
		b, err := os.ReadFile(filepath.Join("contrib/systemd", name))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "/usr/local/bin/tapgro", exe)
		inst := strings.Replace(name, "@.", "@tg0.", 1)
		if err := os.WriteFile(filepath.Join(dir, inst), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		units = append(units, filepath.Join(dir, inst))
	}
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, units...)...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "tapgro") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
