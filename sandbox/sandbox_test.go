package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// probeEnv makes the test binary a probe: it confines itself with tapgro's own filter
// and Landlock ruleset (Enter, as a vhost-user back-end in client mode would) and then
// tries one thing a compromised tapgro would want.
const probeEnv = "TAPGRO_SANDBOX_PROBE"

func TestMain(m *testing.M) {
	if what := os.Getenv(probeEnv); what != "" {
		os.Exit(probe(what))
	}
	os.Exit(m.Run())
}

func probe(what string) int {
	r, err := Enter(Plan{Mode: On, Needs: NeedVhostUser | NeedDial})
	if err != nil {
		fmt.Println("enter:", err)
		return 3
	}
	fmt.Println("confined:", r)
	switch what {
	case "execve":
		err = syscall.Exec("/bin/true", []string{"true"}, nil)
	case "open":
		_, err = unix.Open("/etc/passwd", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	case "packet":
		_, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	case "ptrace":
		err = unix.PtraceAttach(1)
	case "unix":
		// Allowed for a client port: shows the filter lets the listed calls through.
		var fd int
		if fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
			unix.Close(fd)
		}
	}
	fmt.Printf("result: %v\n", err)
	return 0
}

// TestRefused: after Enter, execve, ptrace and an AF_PACKET socket stop the process
// (seccomp: SIGSYS, which the Go runtime reports as "bad system call"), opening a host
// file is refused (Landlock: EACCES), and a UNIX socket, which a client port needs, is
// still allowed.
func TestRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the probe drops capabilities it must first have (run the suite as root)")
	}
	for _, c := range []struct {
		what string
		want string
	}{
		{"execve", "bad system call"},
		{"ptrace", "bad system call"},
		{"packet", "bad system call"},
		{"open", "result: permission denied"},
		{"unix", "result: <nil>"},
	} {
		t.Run(c.what, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), probeEnv+"="+c.what)
			out, _ := cmd.CombinedOutput()
			if !strings.Contains(string(out), "confined:") {
				t.Fatalf("the probe did not confine itself:\n%s", out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("%s: want %q in the probe's output:\n%s", c.what, c.want, out)
			}
			first, _, _ := strings.Cut(string(out), "\n")
			t.Logf("%s: %s; %s", c.what, first, strings.TrimSpace(lastLine(string(out), c.want)))
		})
	}
}

func lastLine(out, sub string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// TestAllowListSize holds the goal: at most 70 system calls for any port kind.
func TestAllowListSize(t *testing.T) {
	for _, n := range []Needs{NeedVhostUser, NeedVhostUser | NeedDial, NeedDial, 0, NeedNetmap} {
		calls := Calls(n)
		if len(calls) > 70 {
			t.Errorf("needs %#x: %d calls, want at most 70: %v", n, len(calls), calls)
		}
		pol := policy(n, 0)
		if _, err := pol.Assemble(); err != nil {
			t.Errorf("needs %#x: %v", n, err)
		}
	}
}
