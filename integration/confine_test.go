package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// TestConfinement starts tapgro for every port kind with the default --sandbox on and
// reads what the kernel says about the running process: no capability in any set
// (effective, permitted, inheritable, ambient, bounding), no_new_privs, a seccomp
// filter, and a root that is the empty tmpfs holding only what run time opens by name
// (here: the log file's directory). The whole suite runs confined too (the default),
// which is what shows the allow-list is enough.
func TestConfinement(t *testing.T) {
	netnstest.RequirePriv(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	logDir := filepath.Join(dir, "log")
	if err := os.Mkdir(logDir, 0o700); err != nil {
		t.Fatal(err)
	}
	kinds := []struct{ name, netdev string }{
		{"stream-server", "stream,server=on,addr.type=unix,addr.path=" + filepath.Join(dir, "s.sock")},
		{"stream-client", "stream,server=off,addr.type=inet,addr.host=127.0.0.1,addr.port=5790"},
		{"socket", "socket,listen=127.0.0.1:5791"},
		{"dgram", "dgram,local.type=inet,local.host=127.0.0.1,local.port=5792,remote.type=inet,remote.host=127.0.0.1,remote.port=5793"},
		{"vhost-user-server", "vhost-user,path=" + filepath.Join(dir, "vu.sock")},
		{"vhost-user-client", "vhost-user,path=" + filepath.Join(dir, "vuc.sock") + ",server=off"},
	}
	for i, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			ns := netnstest.New(t, fmt.Sprintf("tgcf%d", i))
			logFile := filepath.Join(logDir, k.name+".log")
			p := startTapgro(t, ns, "tapgro "+k.name, "--tap", "tgc0", "--netdev", k.netdev, "--log-file", logFile)
			waitFile(t, logFile, "tapgro ready", 10*time.Second)
			pid := p.cmd.Process.Pid
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"CapInh": "0000000000000000", "CapPrm": "0000000000000000",
				"CapEff": "0000000000000000", "CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
				"NoNewPrivs": "1", "Seccomp": "2"}
			for _, line := range strings.Split(string(status), "\n") {
				key, val, _ := strings.Cut(line, ":")
				if w, ok := want[key]; ok {
					if strings.TrimSpace(val) != w {
						t.Errorf("/proc/%d/status %s: %s, want %s", pid, key, strings.TrimSpace(val), w)
					}
					delete(want, key)
				}
			}
			if len(want) > 0 {
				t.Errorf("/proc/%d/status lacks %v", pid, want)
			}
			// The root: nothing but the path down to the kept log directory (and, in a
			// cgo build, the procfs psx needs: Landlock denies all of it but the
			// process's task list).
			var seen []string
			root := fmt.Sprintf("/proc/%d/root", pid)
			if _, err := os.ReadDir(root); err != nil {
				t.Fatalf("tapgro's root: %v", err)
			}
			// WalkDir does not follow a symlink at its root, and /proc/PID/root is one.
			filepath.WalkDir(root+"/", func(path string, d os.DirEntry, err error) error {
				rel := strings.TrimSuffix(strings.TrimPrefix(path, root), "/")
				if err != nil {
					t.Errorf("tapgro's root: %v", err)
					return nil
				}
				if rel == "" {
					return nil
				}
				if rel == "/proc" || rel == logDir {
					seen = append(seen, rel+" (kept)")
					return filepath.SkipDir
				}
				if !strings.HasPrefix(logDir, rel+"/") {
					t.Errorf("tapgro's root holds %s, which is not on the way to the kept %s", rel, logDir)
				}
				seen = append(seen, rel)
				return nil
			})
			log, _ := os.ReadFile(logFile)
			if !strings.Contains(string(log), "sandbox_seccomp=") || !strings.Contains(string(log), `sandbox_caps=none`) {
				t.Errorf("the start-up line does not report the sandbox:\n%s", log)
			}
			t.Logf("%s: root holds %v", k.name, seen)
			p.stop()
		})
	}
}

// waitFile waits until the file at path contains sub.
func waitFile(t *testing.T, path, sub string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), sub) {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(path)
			t.Fatalf("%s: no %q after %v:\n%s", path, sub, limit, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
