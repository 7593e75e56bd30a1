package netmapio

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// unixSocketMode is the mode of every socket path tapgro creates: only its own user may
// connect or send (gvisor-tap-vsock had to learn this late, PR #683, ecosystem.md B5).
const unixSocketMode = 0o600

// ErrAddrInUse is wrapped by Open when a UNIX socket path is bound by a live process.
var ErrAddrInUse = errors.New("address in use by a running process")

// prepareUnixPath makes path free for bind(2). A leftover socket that nobody answers on
// (the previous tapgro was killed) is removed; a socket with a live owner is left alone
// and reported with ErrAddrInUse; anything that is not a socket is never removed
// (gvisor-tap-vsock PR #681 deleted arbitrary files this way, ecosystem.md B4).
// Between the probe and the bind another process could take the path; bind then fails
// with EADDRINUSE, which is reported as is.
func prepareUnixPath(path string, sotype int) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("netmapio: %w", err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("netmapio: %s exists and is not a socket (%s); not removing it", path, fi.Mode().Type())
	}
	// Non-blocking, so a live listener with a full backlog answers EAGAIN at once
	// instead of hanging the probe; that still means "in use".
	fd, err := unix.Socket(unix.AF_UNIX, sotype|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netmapio: probe %s: %w", path, err)
	}
	err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
	unix.Close(fd)
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("netmapio: remove stale socket: %w", err)
		}
		return nil
	case err == nil, errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINPROGRESS):
		return fmt.Errorf("netmapio: %s: %w", path, ErrAddrInUse)
	case errors.Is(err, unix.EPROTOTYPE):
		// A socket of the other type (stream vs datagram) is bound there: someone
		// else's, and alive or not it is not ours to remove.
		return fmt.Errorf("netmapio: %s is a socket of another type; not removing it", path)
	}
	return fmt.Errorf("netmapio: probe %s: %w", path, err)
}

// bindUnix creates a socket of sotype bound to path with mode 0600 (or opt's mode and
// owner) and returns it as a *os.File together with the path's identity (for removing
// exactly what we created). The chown and chmod happen between bind and listen, so no
// client can connect while the path still has umask permissions.
func bindUnix(path string, sotype int, opt Options) (*os.File, fs.FileInfo, error) {
	if err := prepareUnixPath(path, sotype); err != nil {
		return nil, nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, sotype|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("netmapio: socket: %w", err)
	}
	fail := func(op string, err error) (*os.File, fs.FileInfo, error) {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("netmapio: %s %s: %w", op, path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return fail("bind", err)
	}
	created := func(op string, err error) (*os.File, fs.FileInfo, error) {
		os.Remove(path)
		return fail(op, err)
	}
	if opt.SocketUID > 0 || opt.SocketGID > 0 {
		uid, gid := -1, -1
		if opt.SocketUID > 0 {
			uid = opt.SocketUID
		}
		if opt.SocketGID > 0 {
			gid = opt.SocketGID
		}
		if err := os.Lchown(path, uid, gid); err != nil {
			return created("chown", err)
		}
	}
	if err := os.Chmod(path, opt.mode()); err != nil {
		return created("chmod", err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return created("stat", err)
	}
	if sotype == unix.SOCK_STREAM {
		// QEMU's own listener uses a backlog of 0 (wire.md §3.2); a few slots let
		// extra clients be accepted and turned away with a reason instead of hanging.
		if err := unix.Listen(fd, 8); err != nil {
			return created("listen", err)
		}
	}
	return os.NewFile(uintptr(fd), "unix:"+path), fi, nil
}

// listenUnix is bindUnix for a stream listener.
func listenUnix(path string, opt Options) (*net.UnixListener, fs.FileInfo, error) {
	f, fi, err := bindUnix(path, unix.SOCK_STREAM, opt)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close() // FileListener holds its own dup
	ln, err := net.FileListener(f)
	if err != nil {
		os.Remove(path)
		return nil, nil, fmt.Errorf("netmapio: listen %s: %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // we unlink ourselves, and only our own inode
	return ul, fi, nil
}

// bindUnixgram is bindUnix for a datagram socket.
func bindUnixgram(path string, opt Options) (*net.UnixConn, fs.FileInfo, error) {
	f, fi, err := bindUnix(path, unix.SOCK_DGRAM, opt)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		os.Remove(path)
		return nil, nil, fmt.Errorf("netmapio: bind %s: %w", path, err)
	}
	return c.(*net.UnixConn), fi, nil
}

// removeOurs unlinks path if it is still the socket we created (same inode), so a path
// someone else has since bound is left alone.
func removeOurs(path string, fi fs.FileInfo) {
	if fi == nil {
		return
	}
	if cur, err := os.Lstat(path); err == nil && os.SameFile(fi, cur) {
		os.Remove(path)
	}
}
