package port

import (
	"io"
	"sync"
	"sync/atomic"
)

// Base is what every transport's Port shares: identity, counters and close
// bookkeeping. A transport embeds it; the endpoint that hands the Port out hooks its
// own teardown in with SetOnClose (and SetCleanup for a path it bound), so a Port
// stays the transport's concrete type and its optional capabilities (BatchSender,
// Lender, ShmSender, Backend) remain visible to type assertions; a wrapping type would
// hide them.
type Base struct {
	peer  string
	stats *Stats

	closeOnce sync.Once
	closed    atomic.Bool

	mu      sync.Mutex
	lastErr error       // first error ReadBatch/WriteBatch returned, for the close hook
	onClose func(error) // set by the endpoint; releases its slot and reports
	cleanup func()      // extra teardown after the socket is closed (unlink a path)
	release func()      // the transport's own teardown after the socket is closed (shared rings)
	closer  io.Closer
}

// NewBase returns the Base of a Port that closes c, talks to peer and counts into st
// (nil: private counters).
func NewBase(c io.Closer, peer string, st *Stats) Base {
	if st == nil {
		st = new(Stats)
	}
	return Base{peer: peer, stats: st, closer: c}
}

// Fail remembers the first error that ended the port and returns err unchanged.
func (b *Base) Fail(err error) error {
	b.mu.Lock()
	if b.lastErr == nil && !b.closed.Load() {
		b.lastErr = err
	}
	b.mu.Unlock()
	return err
}

// Peer describes the remote end (Port.Peer).
func (b *Base) Peer() string { return b.peer }

// Stats is the counters this port adds to (its endpoint's, or its own).
func (b *Base) Stats() *Stats { return b.stats }

// Closed reports whether Close has begun.
func (b *Base) Closed() bool { return b.closed.Load() }

// SetOnClose sets the hook Close calls last, with the error that ended the port (nil if
// none). The endpoint sets it before it hands the port out.
func (b *Base) SetOnClose(f func(error)) {
	b.mu.Lock()
	b.onClose = f
	b.mu.Unlock()
}

// SetCleanup sets teardown that runs after the transport's own, e.g. unlinking a socket
// path the endpoint bound for this port.
func (b *Base) SetCleanup(f func()) { b.cleanup = f }

// SetRelease sets the transport's own teardown, run right after the socket is closed.
func (b *Base) SetRelease(f func()) { b.release = f }

// Close closes the socket, runs the transport's and then the endpoint's teardown, and
// reports to the endpoint, once.
func (b *Base) Close() error {
	var err error
	b.closeOnce.Do(func() {
		b.closed.Store(true)
		err = b.closer.Close()
		if b.release != nil {
			b.release()
		}
		if b.cleanup != nil {
			b.cleanup()
		}
		b.mu.Lock()
		last, hook := b.lastErr, b.onClose
		b.mu.Unlock()
		if hook != nil {
			hook(last)
		}
	})
	return err
}
