package sockport

import (
	"errors"
	"net"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// MaxUnixPath is the longest pathname an AF_UNIX socket can bind or send to: sun_path is
// 108 bytes and we keep room for the terminating NUL (UNIX_PATH_MAX in
// include/uapi/linux/un.h; canonical/lxd#13320 had to shorten socket paths for this limit).
const MaxUnixPath = 107

var errNotSocket = errors.New("sockport: connection has no socket file descriptor")

// setBuffers raises the socket buffers; the kernel caps the request at
// net.core.{r,w}mem_max, and a smaller buffer only costs throughput, so errors are ignored.
func setBuffers(c any) {
	const size = 4 << 20
	if b, ok := c.(interface {
		SetReadBuffer(int) error
		SetWriteBuffer(int) error
	}); ok {
		_ = b.SetReadBuffer(size)
		_ = b.SetWriteBuffer(size)
	}
}

// PeerString describes the far end of a connection: the address for TCP, the SO_PEERCRED
// credentials for UNIX (an accepted UNIX socket has no useful address; passt logs the PID
// for the same reason, in tap.c tap_listen_handler).
func PeerString(c net.Conn) string {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return c.RemoteAddr().String()
	}
	name := ""
	if a, ok := c.LocalAddr().(*net.UnixAddr); ok && a.Name != "" {
		name = a.Name
	} else if a, ok := c.RemoteAddr().(*net.UnixAddr); ok {
		name = a.Name
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return "unix:" + name
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return "unix:" + name
	}
	return "unix:" + name + " pid=" + strconv.Itoa(int(cred.Pid)) + " uid=" + strconv.Itoa(int(cred.Uid)) + " gid=" + strconv.Itoa(int(cred.Gid))
}

// rawConn returns the syscall.RawConn of a socket-backed net.Conn.
func rawConn(c any) (syscall.RawConn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, errNotSocket
	}
	return sc.SyscallConn()
}

// sendChunks is the batch loop every writer here shares: frames go out in chunks of at
// most max (what one writev or sendmmsg takes). lay lays out the chunk's leading frames
// and returns how many (k) and, if it stopped early, why (a frame the port refuses);
// send sends those k and returns how many went. It returns the frames sent, stopping at
// the first send error, or at a refused frame once everything before it is sent.
func sendChunks[T any](frames []T, max int, lay func(chunk []T) (int, error), send func(chunk []T, k int) (int, error)) (int, error) {
	done := 0
	for done < len(frames) {
		chunk := frames[done:min(len(frames), done+max)]
		k, bad := lay(chunk)
		if k > 0 {
			sent, err := send(chunk, k)
			done += sent
			if err != nil {
				return done, err
			}
		}
		if bad != nil {
			return done, bad
		}
	}
	return done, nil
}
