package netdev

import (
	"fmt"
	"net"
	"os"
)

// ListenUnix creates a UNIX stream listener at path for callers outside the port code
// (tapgro's control socket), with the same rules as a port's path: a directory others
// may write without the sticky bit is refused (ErrUnsafeDir) unless
// opt.AllowUnsafeDir, a stale socket that nobody answers on is replaced, a live one or
// anything that is not a socket is left alone (ErrAddrInUse, or an error naming what is
// there), and the socket gets opt's mode (0600 when unset) and owner before listen(2),
// so no client ever sees umask permissions. Mode and owner are set on the inode bound,
// never through the path, which another process may have replaced (ErrSocketReplaced).
// remove unlinks the path if it is still the socket created here.
func ListenUnix(path string, opt Options) (ln *net.UnixListener, remove func(), err error) {
	ln, fi, err := listenUnix(path, opt)
	if err != nil {
		return nil, nil, err
	}
	return ln, func() { removeOurs(path, fi) }, nil
}

// InheritedUnixListener is the UNIX stream listener a service manager passed for path
// (systemd socket activation: listenFDs from ListenFDs), for a port outside the
// endpoint code (vhost-user). ok is false when nothing was passed and the caller binds
// its own. The path belongs to the manager and is never removed.
func InheritedUnixListener(path string, listenFDs []int) (ln *net.UnixListener, ok bool, err error) {
	fd, _, ok, err := inheritedListener(Addr{Type: AddrUnix, Path: path}, listenFDs)
	if err != nil || !ok {
		return nil, false, err
	}
	f := os.NewFile(uintptr(fd), "inherited-listener")
	l, err := net.FileListener(f) // dups fd; the original is closed below
	f.Close()
	if err != nil {
		return nil, false, fmt.Errorf("netdev: inherited fd %d: %w", fd, err)
	}
	ul, isUnix := l.(*net.UnixListener)
	if !isUnix {
		l.Close()
		return nil, false, fmt.Errorf("netdev: inherited fd %d is not a UNIX stream listener", fd)
	}
	ul.SetUnlinkOnClose(false)
	return ul, true, nil
}
