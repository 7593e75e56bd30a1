package tapdev

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"tapgro/rawsys"
	"time"

	"golang.org/x/sys/unix"
)

// Vectored I/O: one frame per readv(2)/writev(2), straight between the TAP and
// caller-owned segments (a vhost-user guest's descriptor buffers), with no copy through a
// staging buffer. The tun driver treats the iovec array as one buffer
// (drivers/net/tun.c tun_chr_read_iter / tun_chr_write_iter take an iov_iter), so a frame
// and its vnet header may be split anywhere across the segments.

// MaxIov is the most segments one Readv or Writev takes: UIO_MAXIOV (1024,
// include/uapi/linux/uio.h), above which readv/writev fail with EINVAL.
const MaxIov = 1024

var (
	// ErrTruncated: the frame was longer than the segments handed to Readv; the
	// kernel copied what fit and dropped the rest (drivers/net/tun.c tun_put_user
	// copies into the iov_iter until it is full).
	ErrTruncated = errors.New("tapdev: frame longer than the read buffer: truncated")
	// ErrWouldBlock: TryReadv found no frame queued, or TryWritev no room in the
	// socket buffer.
	ErrWouldBlock = errors.New("tapdev: would block")
	errTooManyIov = fmt.Errorf("tapdev: more than %d segments", MaxIov)
)

// vecIO is the per-call scratch of one vectored call: the iovec array and the
// RawConn callbacks (method values built once, so a call allocates nothing). The Device
// struct is shared by many goroutines and has no room for it, so it comes from a pool:
// concurrent Readv and Writev each take their own.
type vecIO struct {
	iov     [MaxIov + 1]unix.Iovec
	sink    [1]byte // Readv's extra byte after the caller's segments
	niov    int
	total   int
	park    bool // wait on the poller on EAGAIN, or return ErrWouldBlock
	d       *Device
	n       int
	err     error
	waited  bool
	readFn  func(fd uintptr) bool
	writeFn func(fd uintptr) bool
	waitFn  func(fd uintptr) bool
	pollFn  func(fd uintptr)
	pfd     [1]unix.PollFd
	events  int16 // what poll waits for: POLLIN or POLLOUT
}

var vecPool = sync.Pool{New: func() any {
	v := new(vecIO)
	v.readFn = v.readv
	v.writeFn = v.writev
	v.waitFn = v.wait
	v.pollFn = v.poll
	return v
}}

func getVec(d *Device) *vecIO {
	v := vecPool.Get().(*vecIO)
	v.events = unix.POLLIN
	v.d, v.n, v.err, v.niov, v.total, v.waited = d, 0, nil, 0, 0, false
	return v
}

func putVec(v *vecIO) {
	for i := range v.niov {
		v.iov[i] = unix.Iovec{} // do not pin the caller's buffers
	}
	v.niov = 0
	v.d = nil
	vecPool.Put(v)
}

// fill loads segs into the iovec array, skipping empty ones.
func (v *vecIO) fill(segs [][]byte) error {
	k, total := 0, 0
	for _, s := range segs {
		if len(s) == 0 {
			continue
		}
		if k == MaxIov {
			return errTooManyIov
		}
		v.iov[k].Base = &s[0]
		v.iov[k].SetLen(len(s))
		k++
		total += len(s)
	}
	v.niov, v.total = k, total
	return nil
}

// addSink appends the one-byte segment that tells a frame that fits exactly from one
// that was truncated: the tun driver returns only what it copied (checked on 6.18), so
// the kernel writing into the sink means the frame was longer than the caller's room.
func (v *vecIO) addSink() {
	v.iov[v.niov].Base = &v.sink[0]
	v.iov[v.niov].SetLen(1)
	v.niov++
}

func (v *vecIO) readv(fd uintptr) bool {
	for {
		n, e := rawsys.Readv(fd, v.iov[:v.niov])
		v.d.stats.ReadCalls.Add(1)
		switch e {
		case 0:
			v.n = n
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if v.park {
				return false
			}
			v.err = ErrWouldBlock
			return true
		}
		v.d.stats.ReadErrors.Add(1)
		v.err = e
		return true
	}
}

func (v *vecIO) writev(fd uintptr) bool {
	for {
		n, e := rawsys.Writev(fd, v.iov[:v.niov])
		v.d.stats.WriteCalls.Add(1)
		switch e {
		case 0:
			v.n = n
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if v.park {
				return false
			}
			v.err = ErrWouldBlock
			return true
		}
		v.err = e
		return true
	}
}

// wait is the callback of WaitReadable/WaitWritable. RawConn.Read/Write reset the
// poller's readiness before the first call (internal/poll prepareRead), so a frame that
// arrived after the caller's EAGAIN and before this wait would be forgotten: the first
// call therefore polls the fd itself and asks the poller to wait only if it is not
// ready; the second call (after the poller woke us) reports readiness.
func (v *vecIO) wait(fd uintptr) bool {
	if v.waited {
		return true
	}
	v.waited = true
	v.poll(fd)
	return v.err == nil && v.n > 0 && v.pfd[0].Revents != 0
}

// Readv reads one frame, [vnet header][Ethernet frame], into the concatenation of iov
// with one readv(2). If none is queued it parks on the poller like ReadBatch (and
// returns os.ErrClosed after Close, os.ErrDeadlineExceeded after a read deadline). It
// returns the bytes placed in iov. A frame longer than iov is truncated by the kernel
// (the rest is lost): Readv then returns the length of iov and ErrTruncated, counted in
// Stats.Truncated. Unlike ReadBatch it tells an exact fit from a truncation, by reading
// into one private byte past iov. At most MaxIov-1 segments.
// Segments must hold at least the vnet header (the kernel refuses the read otherwise).
// It allocates nothing; one goroutine at a time.
func (d *Device) Readv(iov [][]byte) (int, error) { return d.readvMode(iov, true) }

// TryReadv is Readv that never waits: ErrWouldBlock when no frame is queued. Use it
// where waiting would hold something up (a vhost-user ring batch), then WaitReadable.
func (d *Device) TryReadv(iov [][]byte) (int, error) { return d.readvMode(iov, false) }

func (d *Device) readvMode(iov [][]byte, park bool) (int, error) {
	v := getVec(d)
	defer putVec(v)
	if err := v.fill(iov); err != nil || v.niov == MaxIov {
		return 0, errTooManyIov
	}
	if v.total < d.vnetHdrLen {
		return 0, fmt.Errorf("tapdev: Readv: %d bytes cannot hold the %d-byte vnet header", v.total, d.vnetHdrLen)
	}
	v.addSink()
	v.park = park
	err := d.rc.Read(v.readFn)
	n, verr := v.n, v.err
	if err == nil {
		err = verr
	}
	if err != nil {
		if err == ErrWouldBlock {
			return 0, err
		}
		return 0, d.ioErr(err, "readv")
	}
	d.stats.FramesRead.Add(1)
	if n > v.total {
		// The kernel reached the sink byte: the frame was longer than iov.
		d.stats.Truncated.Add(1)
		d.stats.BytesRead.Add(uint64(v.total))
		return v.total, ErrTruncated
	}
	d.stats.BytesRead.Add(uint64(n))
	return n, nil
}

// WaitReadable returns at once if a frame is queued, else parks until one is. A read
// deadline (or Close) ends the wait with os.ErrDeadlineExceeded (os.ErrClosed).
func (d *Device) WaitReadable() error {
	v := getVec(d)
	defer putVec(v)
	if err := d.rc.Read(v.waitFn); err != nil {
		return d.ioErr(err, "wait")
	}
	return nil
}

// Writev writes one frame, [vnet header][Ethernet frame], gathered from iov with one
// writev(2). Errors are Write's: EINVAL (frame or header refused by the kernel) and EIO
// (link down) are counted and returned wrapped; EAGAIN parks on the poller (a write
// deadline ends that). It allocates nothing; one goroutine at a time.
func (d *Device) Writev(iov [][]byte) (int, error) { return d.writevMode(iov, true) }

// TryWritev is Writev that returns ErrWouldBlock instead of waiting when the TAP's
// socket buffer is full (tun's default sndbuf is INT_MAX, so that is rare); then
// WaitWritable.
func (d *Device) TryWritev(iov [][]byte) (int, error) { return d.writevMode(iov, false) }

func (d *Device) writevMode(iov [][]byte, park bool) (int, error) {
	v := getVec(d)
	defer putVec(v)
	if err := v.fill(iov); err != nil {
		d.stats.WriteErrOther.Add(1)
		return 0, err
	}
	v.park = park
	err := d.rc.Write(v.writeFn)
	n, verr := v.n, v.err
	if err == nil {
		err = verr
	}
	if err != nil {
		switch {
		case err == ErrWouldBlock:
			return 0, err
		case errors.Is(err, unix.EINVAL):
			d.stats.WriteErrEINVAL.Add(1)
			return 0, d.errWriteEINVAL
		case errors.Is(err, unix.EIO):
			d.stats.WriteErrEIO.Add(1)
			return 0, d.errWriteEIO
		}
		d.stats.WriteErrOther.Add(1)
		return 0, d.ioErr(err, "writev")
	}
	if n != v.total {
		d.stats.WriteErrOther.Add(1)
		return n, fmt.Errorf("tapdev: writev %s: %d of %d bytes: %w", d.name, n, v.total, io.ErrShortWrite)
	}
	d.stats.FramesWritten.Add(1)
	d.stats.BytesWritten.Add(uint64(n))
	return n, nil
}

// WaitWritable returns at once if the TAP is writable, else parks until it is. A write
// deadline ends it with os.ErrDeadlineExceeded.
func (d *Device) WaitWritable() error {
	v := getVec(d)
	defer putVec(v)
	v.events = unix.POLLOUT
	if err := d.rc.Write(v.waitFn); err != nil {
		return d.ioErr(err, "wait")
	}
	return nil
}

// SetWriteDeadline makes a parked Writev or WaitWritable return
// os.ErrDeadlineExceeded at t; the zero time clears it.
func (d *Device) SetWriteDeadline(t time.Time) error { return d.file.SetWriteDeadline(t) }

// Readable reports whether a frame is queued now (poll(2) with no timeout). It does
// not consume the poller's readiness, and allocates nothing.
func (d *Device) Readable() (bool, error) {
	v := getVec(d)
	defer putVec(v)
	if err := d.rc.Control(v.pollFn); err != nil {
		return false, d.ioErr(err, "poll")
	}
	if v.err != nil {
		return false, d.ioErr(v.err, "poll")
	}
	return v.n > 0 && v.pfd[0].Revents&unix.POLLIN != 0, nil
}

func (v *vecIO) poll(fd uintptr) {
	v.pfd[0] = unix.PollFd{Fd: int32(fd), Events: v.events}
	for {
		// Raw: a zero-timeout poll never sleeps, and the scheduler's system-call
		// bookkeeping would wake sysmon on every wait (package rawsys says why).
		n, e := rawsys.PollNow(v.pfd[:])
		if e == unix.EINTR {
			continue
		}
		v.n, v.err = n, nil
		if e != 0 {
			v.err = e
		}
		return
	}
}
