package netdev

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strconv"
	"tapgro/port"

	"golang.org/x/sys/unix"
)

// Sockets a supervisor hands tapgro instead of letting it bind or dial: QEMU's own
// addr.type=fd / socket,fd= (a libvirt-style manager holds the path or the connection),
// and systemd socket activation (LISTEN_FDS: systemd owns the listening socket, so it
// exists before tapgro starts and survives tapgro's restarts, so no stale socket path is
// left behind to clean up).

// Options are the endpoint settings that QEMU's -netdev syntax has no words for.
// The zero value is the safe default.
type Options struct {
	// SocketMode is the permission of every UNIX socket path the endpoint creates; 0
	// means 0600 (only tapgro's own user may connect or send; gvisor-tap-vsock moved to
	// 0600 after another local user could drive its API, containers/gvisor-tap-vsock#683).
	SocketMode fs.FileMode
	// SocketUID and SocketGID, when > 0, become the owner and group of the socket paths
	// created (chown right after bind, before listen): the user tapgro drops to (--user),
	// and a group widened with SocketMode (--socket-group). 0 leaves the creator's.
	SocketUID, SocketGID int
	// AllowUnsafeDir lets a socket path be created in a directory that users other than
	// its owner may write and that has no sticky bit (--allow-unsafe-dir). Such a
	// directory is refused by default: anyone who can write it can replace tapgro's
	// socket with their own listener, which QEMU would then connect to.
	AllowUnsafeDir bool
	// ListenFDs are listening sockets a supervisor passed (systemd's LISTEN_FDS; see
	// ListenFDs). A server whose Local address is the one a passed socket is bound to
	// uses that socket instead of binding its own; with addr.type=fd it must be one of
	// them. Nil means none were passed.
	ListenFDs []int
}

func (o Options) mode() fs.FileMode {
	if o.SocketMode == 0 {
		return unixSocketMode
	}
	return o.SocketMode & fs.ModePerm
}

// ErrInheritedClosed is returned by Next when the inherited connected socket (fd=N) has
// ended: it cannot be redialled, so the endpoint is done (passt with --fd exits too).
var ErrInheritedClosed = errors.New("the inherited connection has ended and cannot be re-established")

// ListenFDs implements systemd's sd_listen_fds(3) contract without libsystemd: when
// LISTEN_PID is this process's PID, descriptors 3 .. 3+LISTEN_FDS-1 are sockets passed
// by the service manager. Variables meant for another process (LISTEN_PID differs) are
// ignored, as the contract says. The variables are removed from the environment either
// way so no child misreads them, and the descriptors are marked close-on-exec.
func ListenFDs() ([]int, error) {
	pidS, nS := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_PID")
	os.Unsetenv("LISTEN_FDS")
	os.Unsetenv("LISTEN_FDNAMES")
	if nS == "" {
		return nil, nil
	}
	pid, err := strconv.Atoi(pidS)
	if err != nil || pid != os.Getpid() {
		return nil, nil
	}
	n, err := strconv.Atoi(nS)
	if err != nil || n < 0 || n > 1024 {
		return nil, fmt.Errorf("netdev: LISTEN_FDS=%q: want a count of passed sockets", nS)
	}
	fds := make([]int, n)
	for i := range fds {
		fds[i] = 3 + i
		unix.CloseOnExec(fds[i])
	}
	return fds, nil
}

// checkFD makes sure fd is an open stream socket that is listening (or not) as wanted,
// so a wrong number fails at start-up with a reason rather than later with EBADF/ENOTSOCK.
func checkFD(fd int, listening bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("netdev: inherited fd %d: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("netdev: inherited fd %d is not a socket", fd)
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("netdev: inherited fd %d: SO_TYPE: %w", fd, err)
	}
	if typ != unix.SOCK_STREAM {
		return fmt.Errorf("netdev: inherited fd %d is not a stream socket (SO_TYPE %d); datagram fds are not supported", fd, typ)
	}
	acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return fmt.Errorf("netdev: inherited fd %d: SO_ACCEPTCONN: %w", fd, err)
	}
	switch {
	case listening && acc == 0:
		return fmt.Errorf("netdev: inherited fd %d is not a listening socket (server=on needs one)", fd)
	case !listening && acc != 0:
		return fmt.Errorf("netdev: inherited fd %d is a listening socket; use server=on for it", fd)
	}
	return nil
}

// sockAddr describes the address fd is bound to (listening) or connected to, as an Addr.
func sockAddr(fd int, peer bool) (Addr, error) {
	var sa unix.Sockaddr
	var err error
	if peer {
		sa, err = unix.Getpeername(fd)
	} else {
		sa, err = unix.Getsockname(fd)
	}
	if err != nil {
		return Addr{}, err
	}
	switch a := sa.(type) {
	case *unix.SockaddrUnix:
		return Addr{Type: AddrUnix, Path: a.Name}, nil
	case *unix.SockaddrInet4:
		return Addr{Type: AddrInet, Host: netip.AddrFrom4(a.Addr).String(), Port: uint16(a.Port)}, nil
	case *unix.SockaddrInet6:
		return Addr{Type: AddrInet, Host: netip.AddrFrom16(a.Addr).String(), Port: uint16(a.Port)}, nil
	}
	return Addr{}, fmt.Errorf("address family %T is not supported", sa)
}

// sameAddr reports whether an inherited socket's address is the one a spec names.
func sameAddr(got, want Addr) bool {
	if got.Type != want.Type {
		return false
	}
	if got.Type == AddrUnix {
		return got.Path == want.Path
	}
	if got.Port != want.Port {
		return false
	}
	g, err1 := netip.ParseAddr(got.Host)
	w, err2 := netip.ParseAddr(want.Host)
	if err1 != nil || err2 != nil {
		return got.Host == want.Host
	}
	return g.Unmap() == w.Unmap()
}

// inheritedListener finds the listening socket for a server bound to want: the fd it
// names, or the passed socket (listenFDs) bound to its address. ok is false when none
// applies and the server should bind its own.
func inheritedListener(want Addr, listenFDs []int) (fd int, bound Addr, ok bool, err error) {
	if want.Type == AddrFD {
		if listenFDs != nil && !containsInt(listenFDs, want.FD) {
			return 0, Addr{}, false, fmt.Errorf("netdev: fd %d is not among the %d socket(s) the service manager passed (fd 3..%d)",
				want.FD, len(listenFDs), 2+len(listenFDs))
		}
		if err := checkFD(want.FD, true); err != nil {
			return 0, Addr{}, false, err
		}
		a, err := sockAddr(want.FD, false)
		if err != nil {
			return 0, Addr{}, false, fmt.Errorf("netdev: inherited fd %d: %w", want.FD, err)
		}
		return want.FD, a, true, nil
	}
	for _, fd := range listenFDs {
		if checkFD(fd, true) != nil {
			continue
		}
		if a, err := sockAddr(fd, false); err == nil && sameAddr(a, want) {
			return fd, a, true, nil
		}
	}
	if len(listenFDs) > 0 {
		return 0, Addr{}, false, fmt.Errorf("netdev: the service manager passed %d socket(s) but none is bound to %s", len(listenFDs), want)
	}
	return 0, Addr{}, false, nil
}

// inheritedConn is the role of a connected socket a supervisor passed (stream
// server=off,addr.type=fd or socket,fd=N). It is checked at Open, so a bad number stops
// tapgro at start-up, and handed out once by Next: it cannot be redialled, so once it
// ends Next returns ErrInheritedClosed.
type inheritedConn struct {
	*core
	gate gate
	conn net.Conn // under core.mu, until Next takes it
}

func openInheritedConn(c *core) (*inheritedConn, error) {
	fd := c.spec.Remote.FD
	if err := checkFD(fd, false); err != nil {
		return nil, err
	}
	peer, err := sockAddr(fd, true)
	if err != nil {
		return nil, fmt.Errorf("netdev: inherited fd %d is not connected: %w", fd, err)
	}
	f := os.NewFile(uintptr(fd), "inherited-conn")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("netdev: inherited fd %d: %w", fd, err)
	}
	c.addr = "fd:" + strconv.Itoa(fd) + " (" + peer.String() + ")"
	return &inheritedConn{core: c, gate: newGate(), conn: conn}, nil
}

func (e *inheritedConn) Close() error {
	e.shutdown(func() {
		e.mu.Lock()
		conn := e.conn
		e.conn = nil
		e.mu.Unlock()
		if conn != nil {
			conn.Close()
		}
	})
	return nil
}

func (e *inheritedConn) Next(ctx context.Context) (port.Port, error) {
	if err := e.gate.acquire(ctx, e.ctx); err != nil {
		return nil, err
	}
	e.mu.Lock()
	conn := e.conn
	e.conn = nil
	e.mu.Unlock()
	if conn == nil {
		e.gate.release()
		return nil, fmt.Errorf("netdev: %s: %w", e.Addr(), ErrInheritedClosed)
	}
	p, err := e.newStream(conn) // runs the vnet-hdr=on hello when asked for
	if err != nil {
		conn.Close()
		e.gate.release()
		return nil, err
	}
	return e.adopt(p, &p.Base, e.gate.release)
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
