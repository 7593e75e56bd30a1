package netdev

import "net"

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
