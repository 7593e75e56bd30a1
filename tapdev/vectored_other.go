//go:build !linux

package tapdev

import (
	"errors"
	"time"
)

// MaxIov is UIO_MAXIOV on Linux.
const MaxIov = 1024

var (
	// ErrTruncated: see the Linux implementation.
	ErrTruncated = errors.New("tapdev: frame longer than the read buffer: truncated")
	// ErrWouldBlock: see the Linux implementation.
	ErrWouldBlock = errors.New("tapdev: would block")
)

// Readv returns ErrUnsupported.
func (d *Device) Readv(iov [][]byte) (int, error) { return 0, ErrUnsupported }

// TryReadv returns ErrUnsupported.
func (d *Device) TryReadv(iov [][]byte) (int, error) { return 0, ErrUnsupported }

// WaitReadable returns ErrUnsupported.
func (d *Device) WaitReadable() error { return ErrUnsupported }

// Writev returns ErrUnsupported.
func (d *Device) Writev(iov [][]byte) (int, error) { return 0, ErrUnsupported }

// TryWritev returns ErrUnsupported.
func (d *Device) TryWritev(iov [][]byte) (int, error) { return 0, ErrUnsupported }

// WaitWritable returns ErrUnsupported.
func (d *Device) WaitWritable() error { return ErrUnsupported }

// SetWriteDeadline returns ErrUnsupported.
func (d *Device) SetWriteDeadline(t time.Time) error { return ErrUnsupported }

// Readable returns ErrUnsupported.
func (d *Device) Readable() (bool, error) { return false, ErrUnsupported }
