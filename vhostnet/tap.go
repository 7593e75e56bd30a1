//go:build linux

package vhostnet

import (
	"time"

	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// TAP is one queue of the TAP as the workers drive it: vectored reads and writes
// straight from and into guest memory that never wait (a ring batch must not), waits
// outside any batch, and the device-wide settings a session makes. *tapdev.Device is
// the TAP; tapdev/taptest's in-memory one lets the device's tests run without root or
// a kernel TAP, as the socket engine's do.
//
// The errors are tapdev's: TryReadv and TryWritev return tapdev.ErrWouldBlock when the
// TAP has nothing queued or no room, and TryReadv returns tapdev.ErrTruncated, with the
// length it filled, for a frame longer than iov.
type TAP interface {
	Name() string
	VnetHdrLen() int
	SetVnetHdrLen(n int) error
	ProbeOffloads() vnethdr.Offloads
	SetOffloads(want vnethdr.Offloads) (vnethdr.Offloads, error)
	// SetQueueEnabled attaches or detaches the queue (TUNSETQUEUE); a single-queue
	// device refuses it.
	SetQueueEnabled(on bool) error
	TryReadv(iov [][]byte) (int, error)
	TryWritev(iov [][]byte) (int, error)
	// WaitReadable and WaitWritable park until the queue can be read or written, a
	// deadline passes (os.ErrDeadlineExceeded) or the TAP is closed.
	WaitReadable() error
	WaitWritable() error
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
}

var _ TAP = (*tapdev.Device)(nil)
