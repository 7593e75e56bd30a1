package netdev

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"tapgro/sockport"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"tapgro/port/porttest"
)

// requireRoot skips t unless the test runs as root, or fails it under
// TAPGRO_REQUIRE_PRIV=1, where a missing privilege must not pass as a skip.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	why := fmt.Sprintf("needs root to run a helper as another user and to chown (euid is %d)", os.Geteuid())
	if os.Getenv("TAPGRO_REQUIRE_PRIV") == "1" {
		t.Fatalf("%s, and TAPGRO_REQUIRE_PRIV=1 forbids skipping", why)
	}
	t.Skip(why)
}

// dirWithMode returns a fresh directory with exactly mode (chmod after mkdir: the umask
// would strip the group and other write bits).
func dirWithMode(t *testing.T, mode fs.FileMode) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A socket path in a directory others may write without the sticky bit is refused
// before anything is created there, for the control socket (ListenUnix), a port's
// listener and a datagram port alike; the sticky bit or AllowUnsafeDir lets it through.
func TestSocketDirUnsafe(t *testing.T) {
	porttest.CheckLeaks(t)
	open := map[string]func(path string, opt Options) (func(), error){
		"ListenUnix": func(path string, opt Options) (func(), error) {
			ln, remove, err := ListenUnix(path, opt)
			if err != nil {
				return nil, err
			}
			return func() { ln.Close(); remove() }, nil
		},
		"server": func(path string, opt Options) (func(), error) {
			sp, err := ParseSpec("stream,server=on,addr.type=unix,addr.path=" + path)
			if err != nil {
				return nil, err
			}
			ep, err := OpenWith(sp, Events{}, opt)
			if err != nil {
				return nil, err
			}
			return func() { ep.Close() }, nil
		},
		"dgram": func(path string, opt Options) (func(), error) {
			sp, err := ParseSpec("dgram,local.type=unix,local.path=" + path + ",remote.type=unix,remote.path=" + path + ".peer")
			if err != nil {
				return nil, err
			}
			ep, err := OpenWith(sp, Events{}, opt)
			if err != nil {
				return nil, err
			}
			return func() { ep.Close() }, nil
		},
	}
	cases := []struct {
		name   string
		mode   fs.FileMode
		allow  bool
		refuse bool
	}{
		{"0777 refused", 0o777, false, true},
		{"0770 refused", 0o770, false, true},
		{"0733 refused", 0o733, false, true},
		{"0777 allowed by option", 0o777, true, false},
		{"1777 sticky", 0o777 | fs.ModeSticky, false, false},
		{"1770 sticky", 0o770 | fs.ModeSticky, false, false},
		{"0755", 0o755, false, false},
		{"0700", 0o700, false, false},
	}
	for kind, fn := range open {
		for _, c := range cases {
			t.Run(kind+"/"+c.name, func(t *testing.T) {
				dir := dirWithMode(t, c.mode)
				path := filepath.Join(dir, "s")
				if len(path) > sockport.MaxUnixPath {
					t.Skipf("temp dir too deep for a UNIX socket path: %s", path)
				}
				closeFn, err := fn(path, Options{AllowUnsafeDir: c.allow})
				if c.refuse {
					if err == nil {
						closeFn()
						t.Fatalf("socket created in a mode %v directory", c.mode)
					}
					if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "--allow-unsafe-dir") ||
						!strings.Contains(err.Error(), dir) {
						t.Fatalf("error %q: want ErrUnsafeDir naming the directory and --allow-unsafe-dir", err)
					}
					if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("refused, yet %s exists: %v", path, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("mode %v directory: %v", c.mode, err)
				}
				fi, err := os.Lstat(path)
				if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
					t.Errorf("socket %v, %v; want a 0600 socket", fi, err)
				}
				closeFn()
				if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("close left %s behind: %v", path, err)
				}
			})
		}
	}
}

// The mode and owner are set on the socket the descriptor is bound to, found without
// following the path: a symlink or another socket put in its place is refused and left
// exactly as it is.
func TestSocketOwnInode(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s")
	if len(path) > sockport.MaxUnixPath {
		t.Skipf("temp dir too deep for a UNIX socket path: %s", path)
	}
	bound := func() int {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	first := bound()
	node, err := ownSocketInode(path, first)
	if err != nil {
		t.Fatalf("own socket not recognised: %v", err)
	}
	node.Close()

	// Moved away, another socket bound in its place.
	if err := os.Rename(path, path+".away"); err != nil {
		t.Fatal(err)
	}
	second := bound()
	if _, _, err := socketVFSInode(first); err != nil {
		t.Logf("sock_diag unavailable (%v): only the owner fallback is checked", err)
	} else if node, err := ownSocketInode(path, first); !errors.Is(err, ErrSocketReplaced) {
		if node != nil {
			node.Close()
		}
		t.Errorf("another socket at the path: %v, want ErrSocketReplaced", err)
	}
	if node, err := ownSocketInode(path, second); err != nil {
		t.Errorf("the second socket, now at the path: %v", err)
	} else {
		node.Close()
	}

	// A symlink in its place: refused, and what it points to is not touched.
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(target, 0o644)
	os.Remove(path)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	if node, err := ownSocketInode(path, second); !errors.Is(err, ErrSocketReplaced) || !strings.Contains(err.Error(), "symlink") {
		if node != nil {
			node.Close()
		}
		t.Errorf("a symlink at the path: %v, want ErrSocketReplaced naming a symlink", err)
	}
	if fi, err := os.Stat(target); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("symlink target: %v, %v; want 0644", fi, err)
	}
}

// Both ways of changing the mode through an O_PATH descriptor (fchmodat2 and, for
// kernels before 6.6, /proc/self/fd) reach the socket.
func TestSocketChmodPath(t *testing.T) {
	path := sockPath(t, "m.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	node, err := ownSocketInode(path, fd)
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	check := func(want fs.FileMode) {
		t.Helper()
		if fi, err := os.Lstat(path); err != nil || fi.Mode().Perm() != want {
			t.Errorf("mode %v, %v; want %v", fi.Mode(), err, want)
		}
	}
	if err := fchmodPath(node, 0o640); err != nil {
		t.Fatal(err)
	}
	check(0o640)
	if err := chmodProcFD(int(node.Fd()), 0o604); err != nil {
		t.Fatal(err)
	}
	check(0o604)
}

// Owner and mode options reach the socket (root only: chown to another user).
func TestSocketOwnerMode(t *testing.T) {
	requireRoot(t)
	path := sockPath(t, "o.sock")
	ln, remove, err := ListenUnix(path, Options{SocketMode: 0o660, SocketUID: 65534, SocketGID: 65534})
	if err != nil {
		t.Fatal(err)
	}
	defer remove()
	defer ln.Close()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm() != 0o660 || st.Uid != 65534 || st.Gid != 65534 {
		t.Errorf("socket %v %d:%d, want 0660 65534:65534", fi.Mode(), st.Uid, st.Gid)
	}
}

const (
	swapHelperEnv = "TAPGRO_SOCKSWAP_HELPER" // "path|target|stop"
	swapTries     = 3000
	swapTime      = 10 * time.Second
)

// TestSocketSwapHelper is the unprivileged user of TestSocketSwapRace, run in a
// process of its own as uid 65534. It does nothing in a normal test run.
func TestSocketSwapHelper(t *testing.T) {
	arg := os.Getenv(swapHelperEnv)
	if arg == "" {
		t.Skip("helper process of TestSocketSwapRace only")
	}
	parts := strings.Split(arg, "|")
	path, target, stop := parts[0], parts[1], parts[2]
	away := path + ".away"
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "ready"), nil, 0o644); err != nil {
		fmt.Printf("helper: %v\n", err)
		os.Exit(1)
	}
	swaps, links := 0, 0
	start := time.Now()
	for i := 0; time.Since(start) < 3*swapTime; i++ {
		if i%256 == 0 {
			if _, err := os.Stat(stop); err == nil {
				break
			}
		}
		// Take the socket tapgro just bound away and put a link to the victim in its
		// place for a moment (while tapgro would chmod), then clear the path so the
		// next bind can happen.
		if os.Rename(path, away) != nil {
			continue
		}
		swaps++
		if os.Symlink(target, path) == nil {
			links++
		}
		for t0 := time.Now(); time.Since(t0) < 50*time.Microsecond; {
		}
		os.Remove(path)
	}
	fmt.Printf("swaps=%d links=%d\n", swaps, links)
	os.Exit(0)
}

// An unprivileged user who can write the socket's directory keeps renaming tapgro's
// freshly bound socket away and putting a symlink to a root-owned 0644 file in its
// place, while a root tapgro (ListenUnix with mode 0666, the directory check waived)
// binds there again and again. The file's mode must never change: tapgro sets the mode
// on the inode it bound, never through the name.
func TestSocketSwapRace(t *testing.T) {
	requireRoot(t)
	base, err := os.MkdirTemp("", "tapgro-sockrace-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil { // the helper must reach the files
		t.Fatal(err)
	}
	target := filepath.Join(base, "precious")
	if err := os.WriteFile(target, []byte("root's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(target, 0o644); err != nil {
		t.Fatal(err)
	}
	shared := filepath.Join(base, "shared")
	if err := os.Mkdir(shared, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(shared, "s")
	stop := filepath.Join(base, "stop")

	// The test binary may sit in a directory only root can enter; the helper runs a copy.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(base, "helper.test")
	copyFile(t, self, bin)
	cmd := exec.Command(bin, "-test.run=^TestSocketSwapHelper$", "-test.count=1")
	cmd.Dir = base
	cmd.Env = append(os.Environ(), swapHelperEnv+"="+path+"|"+target+"|"+stop)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the helper as uid 65534: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	kill := func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill() // by pid: the process this test started
			<-exited
		}
	}
	t.Cleanup(kill)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(shared, "ready")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			kill()
			t.Fatalf("helper never became ready: %v: %s", waitErr, out.String())
		}
	}

	opt := Options{SocketMode: 0o666, AllowUnsafeDir: true}
	var ok, replaced, other int
	var otherErr error
	start := time.Now()
	for i := 0; i < swapTries && time.Since(start) < swapTime; i++ {
		ln, remove, err := ListenUnix(path, opt)
		switch {
		case err == nil:
			ok++
			ln.Close()
			remove()
		case errors.Is(err, ErrSocketReplaced):
			replaced++
		default:
			other++ // the path was a symlink, or taken, at bind time
			otherErr = err
		}
		if fi, err := os.Lstat(target); err != nil || fi.Mode().Perm() != 0o644 {
			t.Errorf("after %d tries the root-owned file is %v (%v), want 0644", i+1, fi.Mode(), err)
			break
		}
	}
	os.WriteFile(stop, nil, 0o644)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		kill()
	}
	t.Logf("%d listens in %v: %d kept their socket, %d found it replaced, %d failed otherwise (last: %v); helper: %s",
		ok+replaced+other, time.Since(start).Round(time.Millisecond), ok, replaced, other, otherErr, strings.TrimSpace(out.String()))
	fi, err := os.Lstat(target)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("root-owned file is now %v, uid %d; want a regular 0644 file of root's", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	swaps := 0
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		fmt.Sscanf(sc.Text(), "swaps=%d", &swaps)
	}
	if swaps == 0 {
		t.Fatalf("the helper never took a socket away, so the race was not exercised: %s", out.String())
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	os.Chmod(to, 0o755)
}
