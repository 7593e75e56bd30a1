package taptest

import (
	"os"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// The vectored, non-blocking side of tapdev.Device, as vhostnet's workers use it: reads
// straight into a guest's buffers that never wait (ErrWouldBlock), waits outside a ring
// batch, and the per-queue settings. One goroutine reads (as with a real queue); writes
// may come from several.

// VnetHdrLen is the header length in front of every packet (12 until SetVnetHdrLen).
func (t *TAP) VnetHdrLen() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.hdrLen
}

// SetVnetHdrLen sets the header length, 10 or 12 as tapgro uses them (TUNSETVNETHDRSZ
// takes more; nothing here needs it). Injected packets must carry that many bytes.
func (t *TAP) SetVnetHdrLen(n int) error {
	if n != vnethdr.Len && n != vnethdr.LenMrgRxbuf {
		return unix.EINVAL
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.hdrLen = n
	return nil
}

// SetQueueEnabled records the queue's attachment (TUNSETQUEUE); QueueEnabled reads it.
func (t *TAP) SetQueueEnabled(on bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.detached = !on
	return nil
}

// QueueEnabled reports whether the queue is attached.
func (t *TAP) QueueEnabled() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.detached
}

// TryReadv copies the next injected packet into iov. With none queued it returns
// tapdev.ErrWouldBlock; a packet longer than iov fills it and returns its length with
// tapdev.ErrTruncated, as the kernel's readv does (tapdev tells by a sink byte).
func (t *TAP) TryReadv(iov [][]byte) (int, error) {
	p := t.peek
	t.peek = nil
	if p == nil {
		select {
		case p = <-t.in:
		case <-t.closed:
			return 0, os.ErrClosed
		default:
			return 0, tapdev.ErrWouldBlock
		}
	}
	n := 0
	for _, b := range iov {
		n += copy(b, p[n:])
		if n == len(p) {
			return n, nil
		}
	}
	return n, tapdev.ErrTruncated
}

// TryWritev is Writev: the in-memory TAP always has room.
func (t *TAP) TryWritev(iov [][]byte) (int, error) { return t.Writev(iov) }

// WaitReadable returns once a packet is queued, the read deadline passes
// (os.ErrDeadlineExceeded) or the TAP is closed (os.ErrClosed).
func (t *TAP) WaitReadable() error {
	for {
		if t.peek != nil {
			return nil
		}
		t.mu.Lock()
		dl := t.rdl
		t.mu.Unlock()
		var expire <-chan time.Time
		if !dl.IsZero() {
			d := time.Until(dl)
			if d <= 0 {
				return os.ErrDeadlineExceeded
			}
			tm := time.NewTimer(d)
			defer tm.Stop()
			expire = tm.C
		}
		select {
		case p := <-t.in:
			t.peek = p
			return nil
		case <-t.closed:
			return os.ErrClosed
		case <-t.rkick: // the deadline moved: look again
		case <-expire:
			return os.ErrDeadlineExceeded
		}
	}
}

// WaitWritable returns at once: the in-memory TAP always has room.
func (t *TAP) WaitWritable() error {
	select {
	case <-t.closed:
		return os.ErrClosed
	default:
		return nil
	}
}

// SetReadDeadline sets when WaitReadable gives up (the zero time: never), waking a
// waiter so that it sees the new one.
func (t *TAP) SetReadDeadline(d time.Time) error {
	t.mu.Lock()
	t.rdl = d
	t.mu.Unlock()
	select {
	case t.rkick <- struct{}{}:
	default:
	}
	return nil
}

// SetWriteDeadline is accepted and has nothing to end: writes never wait.
func (t *TAP) SetWriteDeadline(time.Time) error { return nil }

// NextWritten waits up to d for the packet after the first i written (with keep) and
// returns it, or nil when none came.
func (t *TAP) NextWritten(i int, d time.Duration) []byte {
	deadline := time.Now().Add(d)
	for {
		t.mu.Lock()
		if i < len(t.out) {
			p := t.out[i]
			t.mu.Unlock()
			return p
		}
		t.mu.Unlock()
		left := time.Until(deadline)
		if left <= 0 {
			return nil
		}
		tm := time.NewTimer(left)
		select {
		case <-t.wrote:
		case <-tm.C:
		}
		tm.Stop()
	}
}
