package sockport

import (
	"errors"
	"math"
	"net"
	"syscall"
	"tapgro/port"
	"time"

	"golang.org/x/sys/unix"
)

// writeWaiter waits for a socket to become writable from inside RawConn.Write, so the
// netpoller parks the goroutine and nothing spins. The poll(2) with a zero timeout comes
// first because the netpoller is edge-triggered: RawConn.Write clears the write-ready
// flag before calling fn, so an edge that arrives after the poll still wakes us, but a
// socket that is already writable produces no new edge and would wait forever.
type writeWaiter struct {
	pfd    [1]unix.PollFd
	waited bool // fn returned false at least once: the socket really was full
	fn     func(fd uintptr) bool

	// nextEdge makes fn wait for the next write-space event even if the socket polls
	// writable (datagram ports, see DgramPort.WaitWritable).
	nextEdge bool
}

func newWriteWaiter() *writeWaiter {
	w := &writeWaiter{}
	w.fn = w.check
	return w
}

func (w *writeWaiter) check(fd uintptr) bool {
	if w.nextEdge {
		if w.waited {
			return true
		}
		w.waited = true
		return false
	}
	for {
		w.pfd[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLOUT}
		n, err := unix.Poll(w.pfd[:], 0)
		if err == unix.EINTR {
			continue
		}
		// POLLERR or POLLHUP also end the wait: the next write reports the error.
		if err != nil || n > 0 {
			return true
		}
		w.waited = true
		return false
	}
}

// wait blocks until the socket is writable, the deadline passes, or it is closed.
func (w *writeWaiter) wait(c net.Conn, rc syscall.RawConn, deadline time.Time) error {
	w.waited = false
	if !deadline.IsZero() {
		if err := c.SetWriteDeadline(deadline); err != nil {
			return closedErr(err)
		}
		defer c.SetWriteDeadline(time.Time{})
	}
	return closedErr(rc.Write(w.fn))
}

// closedErr maps the runtime's "use of closed network connection" to port.ErrClosed and
// leaves everything else (os.ErrDeadlineExceeded above all) as it is.
func closedErr(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return port.ErrClosed
	}
	return err
}

// sockRoom reads a socket's send-queue occupancy and size for Room. The method value
// fn is bound once so a Room call allocates nothing.
type sockRoom struct {
	outq, sndbuf int
	err          error
	fn           func(fd uintptr)
}

func newSockRoom() *sockRoom {
	r := &sockRoom{}
	r.fn = r.read
	return r
}

func (r *sockRoom) read(fd uintptr) {
	// SIOCOUTQ is the unsent (TCP: unacknowledged) bytes for TCP and the bytes charged
	// to the sender's buffer for AF_UNIX and UDP, which for AF_UNIX stay charged until
	// the peer reads them: exactly "how much has the peer not taken yet".
	r.outq, r.err = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
	if r.err == nil {
		r.sndbuf, r.err = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	}
}

func (r *sockRoom) room(rc syscall.RawConn) (free, size int) {
	if err := rc.Control(r.fn); err != nil || r.err != nil || r.sndbuf <= 0 {
		return math.MaxInt, math.MaxInt
	}
	return max(0, r.sndbuf-r.outq), r.sndbuf
}
