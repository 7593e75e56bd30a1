package sockport

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// InQueue reports the bytes waiting in the socket's receive queue (SIOCINQ) that
// ReadBatch has not taken yet. A health check uses it from another goroutine: data
// pending there while ReadBatch makes no progress means the port→TAP pipeline is stuck.
// It is a system call, not for the packet path.
func (s *StreamPort) InQueue() (int, error) { return inQueue(s.rc) }

// InQueue is StreamPort.InQueue for a datagram socket (the next datagram's size).
func (p *DgramPort) InQueue() (int, error) { return inQueue(p.rc) }

func inQueue(rc syscall.RawConn) (int, error) {
	var n int
	var ierr error
	if err := rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
		return 0, err
	}
	return n, ierr
}
