package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDebianPackage builds the package with contrib/deb/build.sh (the one command),
// installs it on this machine with dpkg, checks what a host then has, and purges it:
// the binary answers QEMU's --print-capabilities, the descriptor names it, systemd
// accepts the installed units, the man page lists every flag, the account the units
// drop to exists, and the docs are where the units' Documentation= points.
func TestDebianPackage(t *testing.T) {
	strict := os.Getenv("TAPGRO_REQUIRE_PRIV") != ""
	need := func(why string) {
		t.Helper()
		if strict {
			t.Fatalf("%s, and TAPGRO_REQUIRE_PRIV forbids skipping", why)
		}
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		need("installing a package needs root")
	}
	for _, tool := range []string{"dpkg", "dpkg-deb", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			need(tool + " is missing (test.sh installs systemd; dpkg comes with Debian)")
		}
	}
	if out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", "tapgro").Output(); err == nil && strings.Contains(string(out), "installed") {
		t.Fatalf("a tapgro package is already installed here (%s); this test installs and purges its own", out)
	}
	if _, err := os.Stat("/usr/bin/tapgro"); err == nil {
		t.Fatal("/usr/bin/tapgro exists and belongs to no package; this test would overwrite it")
	}

	dir := t.TempDir()
	build := exec.Command("contrib/deb/build.sh", dir)
	build.Env = append(os.Environ(), "GO="+filepath.Join(runtime.GOROOT(), "bin", "go"), "VERSION=0~test1")
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("contrib/deb/build.sh: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	deb := lines[len(lines)-1]
	if filepath.Base(deb) != "tapgro_0~test1_"+debArch(t)+".deb" {
		t.Fatalf("build.sh made %q", deb)
	}
	contents := mustRun(t, "dpkg-deb", "--contents", deb)
	t.Logf("%s:\n%s", filepath.Base(deb), contents)

	t.Cleanup(func() {
		if out, err := exec.Command("dpkg", "--purge", "tapgro").CombinedOutput(); err != nil {
			t.Errorf("dpkg --purge tapgro: %v\n%s", err, out)
		}
		if _, err := os.Stat("/usr/bin/tapgro"); err == nil {
			t.Errorf("/usr/bin/tapgro is still there after the purge")
		}
	})
	mustRun(t, "dpkg", "--install", deb)
	if st := mustRun(t, "dpkg-query", "-W", "-f=${Status} ${Version}", "tapgro"); st != "install ok installed 0~test1" {
		t.Errorf("dpkg-query: %q", st)
	}

	// QEMU's back-end program conventions (docs/interop/vhost-user.rst): the descriptor
	// under /usr/share/qemu/vhost-user/ names the binary, which prints its capabilities.
	var desc struct{ Type, Binary string }
	readJSON(t, "/usr/share/qemu/vhost-user/50-tapgro.json", &desc)
	if desc.Type != "net" || desc.Binary != "/usr/bin/tapgro" {
		t.Errorf("installed descriptor: %+v", desc)
	}
	var caps map[string]any
	if err := json.Unmarshal([]byte(mustRun(t, desc.Binary, "--print-capabilities")), &caps); err != nil || caps["type"] != "net" {
		t.Errorf("%s --print-capabilities: %v %v", desc.Binary, caps, err)
	}

	// The units as installed, ExecStart=/usr/bin/tapgro and all, as instances for a TAP
	// named tg0 (systemd-analyze verifies instances, not templates).
	units := t.TempDir()
	var inst []string
	for _, name := range []string{"tapgro@.service", "tapgro@.socket", "tapgro-vhost@.service", "tapgro-vhost@.socket"} {
		b, err := os.ReadFile(filepath.Join("/lib/systemd/system", name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "/usr/local/bin") {
			t.Errorf("%s still points at /usr/local/bin", name)
		}
		for _, doc := range strings.Fields(strings.TrimPrefix(grepLine(string(b), "Documentation="), "Documentation=")) {
			if p, ok := strings.CutPrefix(doc, "file://"); ok {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("%s: Documentation=%s: %v", name, doc, err)
				}
			}
		}
		p := filepath.Join(units, strings.Replace(name, "@.", "@tg0.", 1))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		inst = append(inst, p)
	}
	if out, err := exec.Command("systemd-analyze", append([]string{"verify", "--man=no"}, inst...)...).CombinedOutput(); err != nil || strings.Contains(string(out), "tapgro") {
		t.Errorf("systemd-analyze verify of the installed units: %v\n%s", err, out)
	}

	// The man page: gzip'd roff with every flag of this tree.
	f, err := os.Open("/usr/share/man/man8/tapgro.8.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte(`"tapgro 0~test1"`)) {
		t.Errorf("the man page does not carry the package's version: %.80q", page)
	}
	checkManPageFlags(t, string(page))

	if out, err := exec.Command("getent", "passwd", "tapgro").Output(); err != nil {
		t.Errorf("postinst made no tapgro account (getent: %v)", err)
	} else {
		t.Logf("account: %s", strings.TrimSpace(string(out)))
	}
	for _, p := range []string{"README.md", "docs/vhost-user.md", "docs/flags.md", "copyright"} {
		if _, err := os.Stat(filepath.Join("/usr/share/doc/tapgro", p)); err != nil {
			t.Errorf("doc: %v", err)
		}
	}
}

func debArch(t *testing.T) string {
	return mustRun(t, "dpkg", "--print-architecture")
}

// mustRun runs a command and returns its trimmed output; any failure fails t.
func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// grepLine is the first line of s that starts with prefix, or "".
func grepLine(s, prefix string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
