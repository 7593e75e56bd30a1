package netdev

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"tapgro/sockport"
	"testing"

	"golang.org/x/sys/unix"
	"tapgro/port/porttest"
)

func TestParseSpecFD(t *testing.T) {
	for _, tc := range []struct {
		in   string
		role Role
		want string
	}{
		{"stream,server=on,addr.type=fd,addr.str=3", RoleServer, "stream,server=on,addr.type=fd,addr.str=3"},
		{"stream,id=x,addr.type=fd,addr.str=7", RoleClient, "stream,server=off,addr.type=fd,addr.str=7"},
		{"socket,fd=4", RoleClient, "socket,fd=4"},
	} {
		sp, err := ParseSpec(tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if sp.Role != tc.role || sp.String() != tc.want {
			t.Errorf("%s: role %v spec %q, want %v %q", tc.in, sp.Role, sp.String(), tc.role, tc.want)
		}
		if back, err := ParseSpec(sp.String()); err != nil || back != sp {
			t.Errorf("%s: round trip %+v, %v", tc.in, back, err)
		}
		if q := sp.QEMUOption("n0"); q != "" {
			t.Errorf("%s: QEMUOption %q before the endpoint resolved the fd", tc.in, q)
		}
	}
	for _, tc := range []struct{ in, msg string }{
		{"stream,server=on,addr.type=fd", `needs key "addr.str"`},
		{"stream,addr.type=fd,addr.str=2", "want a file descriptor number >= 3"},
		{"stream,addr.type=fd,addr.str=x", "want a file descriptor number >= 3"},
		{"stream,addr.type=fd,addr.str=3,addr.path=/x", `does not go with addr.type=fd`},
		{"stream,addr.type=unix,addr.path=/x,addr.str=3", `goes with addr.type=fd only`},
		{"socket,fd=3,connect=127.0.0.1:5", "only one of"},
		{"socket,fd=3,localaddr=127.0.0.1:5", "only goes with udp="},
		{"dgram,local.type=fd,local.str=3,remote.type=fd,remote.str=4", "unknown key"},
	} {
		if _, err := ParseSpec(tc.in); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: error %v, want one containing %q", tc.in, err, tc.msg)
		}
	}
}

// rawUnixListener creates a listening AF_UNIX socket bound to path the way a service
// manager would, and returns its descriptor.
func rawUnixListener(t *testing.T, path string) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 8); err != nil {
		t.Fatal(err)
	}
	return fd
}

// serveOne connects to ep's UNIX path, takes the port.Port from Next and checks one frame
// crosses each way.
func serveOne(t *testing.T, ep Endpoint, path string) {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := ep.Next(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	client, err := sockport.NewStreamPort(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := porttest.Frame(100, 1)
	if _, err := client.WriteBatch([][]byte{f}); err != nil {
		t.Fatal(err)
	}
	porttest.ReadFrames(t, p, [][]byte{f})
	if _, err := p.WriteBatch([][]byte{f}); err != nil {
		t.Fatal(err)
	}
	porttest.ReadFrames(t, client, [][]byte{f})
}

func TestInheritedListener(t *testing.T) {
	porttest.CheckLeaks(t)
	t.Run("addr.type=fd", func(t *testing.T) {
		path := sockPath(t, "fd.sock")
		fd := rawUnixListener(t, path)
		sp, err := ParseSpec("stream,server=on,addr.type=fd,addr.str=" + strconv.Itoa(fd))
		if err != nil {
			t.Fatal(err)
		}
		ep, err := OpenWith(sp, Events{}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := SpecOf(ep, sp); got.Local != (Addr{Type: AddrUnix, Path: path}) {
			t.Errorf("resolved Local %+v, want the inherited socket's path %s", got.Local, path)
		}
		if q := SpecOf(ep, sp).QEMUOption("n0"); !strings.Contains(q, "addr.path="+path) {
			t.Errorf("QEMU option %q does not name %s", q, path)
		}
		serveOne(t, ep, path)
		ep.Close()
		// The path belongs to the supervisor: Close must leave it.
		if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("Close removed the inherited socket path: %v", err)
		}
	})
	t.Run("systemd by address", func(t *testing.T) {
		path := sockPath(t, "sd.sock")
		fd := rawUnixListener(t, path)
		before, _ := os.Lstat(path)
		sp, _ := ParseSpec("stream,server=on,addr.type=unix,addr.path=" + path)
		ep, err := OpenWith(sp, Events{}, Options{ListenFDs: []int{fd}})
		if err != nil {
			t.Fatal(err)
		}
		after, _ := os.Lstat(path)
		if !os.SameFile(before, after) {
			t.Errorf("the endpoint bound its own socket instead of using the passed one")
		}
		serveOne(t, ep, path)
		ep.Close()
		if _, err := os.Lstat(path); err != nil {
			t.Errorf("Close removed the passed socket's path: %v", err)
		}
	})
	t.Run("systemd socket for another address", func(t *testing.T) {
		fd := rawUnixListener(t, sockPath(t, "other.sock"))
		defer unix.Close(fd)
		sp, _ := ParseSpec("stream,server=on,addr.type=unix,addr.path=" + sockPath(t, "mine.sock"))
		_, err := OpenWith(sp, Events{}, Options{ListenFDs: []int{fd}})
		if err == nil || !strings.Contains(err.Error(), "none is bound to") {
			t.Fatalf("OpenWith: %v, want a none-is-bound error", err)
		}
	})
	t.Run("fd not passed by systemd", func(t *testing.T) {
		fd := rawUnixListener(t, sockPath(t, "np.sock"))
		defer unix.Close(fd)
		sp, _ := ParseSpec(fmt.Sprintf("stream,server=on,addr.type=fd,addr.str=%d", fd))
		_, err := OpenWith(sp, Events{}, Options{ListenFDs: []int{fd + 1000}})
		if err == nil || !strings.Contains(err.Error(), "not among") {
			t.Fatalf("OpenWith: %v, want a not-among error", err)
		}
	})
}

func TestInheritedConn(t *testing.T) {
	porttest.CheckLeaks(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	peerF := os.NewFile(uintptr(fds[1]), "peer")
	peerC, err := net.FileConn(peerF)
	peerF.Close()
	if err != nil {
		t.Fatal(err)
	}
	peer, _ := sockport.NewStreamPort(peerC, nil)
	defer peer.Close()

	sp, _ := ParseSpec("socket,fd=" + strconv.Itoa(fds[0]))
	ep, err := OpenWith(sp, Events{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	p, err := ep.Next(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	f := porttest.Frame(60, 9)
	peer.WriteBatch([][]byte{f})
	porttest.ReadFrames(t, p, [][]byte{f})
	p.WriteBatch([][]byte{f})
	porttest.ReadFrames(t, peer, [][]byte{f})
	p.Close()
	if _, err := ep.Next(testCtx(t)); !errors.Is(err, ErrInheritedClosed) {
		t.Fatalf("Next after the inherited connection ended: %v, want ErrInheritedClosed", err)
	}
}

func TestInheritedBadFD(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	lfd := rawUnixListener(t, sockPath(t, "l.sock"))
	defer unix.Close(lfd)
	for _, tc := range []struct {
		spec, msg string
	}{
		{fmt.Sprintf("socket,fd=%d", r.Fd()), "not a socket"},
		{fmt.Sprintf("socket,fd=%d", lfd), "is a listening socket"},
		{fmt.Sprintf("stream,server=on,addr.type=fd,addr.str=%d", r.Fd()), "not a socket"},
		{"socket,fd=987654", "bad file descriptor"},
	} {
		sp, err := ParseSpec(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := OpenWith(sp, Events{}, Options{}); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want an error containing %q", tc.spec, err, tc.msg)
		}
	}
	// A connected socket given as a server is refused too.
	fds, _ := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	sp, _ := ParseSpec(fmt.Sprintf("stream,server=on,addr.type=fd,addr.str=%d", fds[0]))
	if _, err := OpenWith(sp, Events{}, Options{}); err == nil || !strings.Contains(err.Error(), "not a listening socket") {
		t.Errorf("connected fd as server: %v", err)
	}
}

func TestListenFDs(t *testing.T) {
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("LISTEN_FDS", "2")
	fds, err := ListenFDs()
	if err != nil || len(fds) != 2 || fds[0] != 3 || fds[1] != 4 {
		t.Fatalf("ListenFDs = %v, %v; want [3 4]", fds, err)
	}
	if os.Getenv("LISTEN_FDS") != "" || os.Getenv("LISTEN_PID") != "" {
		t.Errorf("LISTEN_* left in the environment")
	}
	// Meant for another process: ignored.
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()+1))
	t.Setenv("LISTEN_FDS", "1")
	if fds, err := ListenFDs(); fds != nil || err != nil {
		t.Errorf("foreign LISTEN_PID: %v, %v; want nothing", fds, err)
	}
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("LISTEN_FDS", "many")
	if _, err := ListenFDs(); err == nil {
		t.Errorf("LISTEN_FDS=many accepted")
	}
	os.Unsetenv("LISTEN_PID")
	os.Unsetenv("LISTEN_FDS")
	if fds, err := ListenFDs(); fds != nil || err != nil {
		t.Errorf("no LISTEN_FDS: %v, %v", fds, err)
	}
}

func TestSocketModeAndOwner(t *testing.T) {
	porttest.CheckLeaks(t)
	path := sockPath(t, "mode.sock")
	sp, _ := ParseSpec("stream,server=on,addr.type=unix,addr.path=" + path)
	gid := 0
	if os.Geteuid() == 0 {
		gid = 65534 // chown needs root; as a user only the mode is checked
	}
	ep, err := OpenWith(sp, Events{}, Options{SocketMode: 0o660, SocketGID: gid})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o660 {
		t.Errorf("mode %v, want 0660", fi.Mode().Perm())
	}
	if st := fi.Sys().(*syscall.Stat_t); gid > 0 && int(st.Gid) != gid {
		t.Errorf("group %d, want %d", st.Gid, gid)
	}
}

// FuzzParseSpec: any --netdev string either fails with an error or parses to a spec
// whose canonical form parses back to the same spec; nothing panics.
func FuzzParseSpec(f *testing.F) {
	for _, s := range []string{
		"stream,server=on,addr.type=fd,addr.str=3", "socket,fd=4", "stream,addr.type=fd,addr.str=3,vnet-hdr=on",
		"stream,server=on,addr.type=unix,addr.path=/tmp/a,,b", "socket,listen=:5000",
		"dgram,local.type=inet,local.host=127.0.0.1,local.port=1,remote.type=inet,remote.host=127.0.0.1,remote.port=2",
		"netmap,ifname=vale0:1,vnet-hdr=12", "stream,addr.type=fd,addr.str=99999999999999999999",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := ParseSpec(s)
		if err != nil {
			return
		}
		back, err := ParseSpec(sp.String())
		if err != nil {
			t.Fatalf("%q parsed to %q, which does not parse: %v", s, sp.String(), err)
		}
		if back != sp {
			t.Fatalf("%q: round trip %+v != %+v", s, back, sp)
		}
		_ = sp.QEMUOption("n0")
	})
}
