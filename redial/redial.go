// Package redial is tapgro's reconnect policy for the roles where tapgro dials: the
// stream and vhost-user clients (netdev's client endpoint and vhostnet's ServeClient)
// share it, so "tapgro is the client" means the same thing whatever it dials. It is a
// package of its own so that both can import it without each other.
package redial

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Policy is the dialling roles' reconnect policy:
//
//   - A failed attempt is retried after 100 ms, the wait doubling up to 5 s
//     (dialWaitMin, dialWaitMax), each failure reported to onRetry with the wait.
//   - A connection that ended less than a second after it was made (quickConnection)
//     makes the next dial wait too, the wait doubling over consecutive quick ends within
//     the same bounds. A server that accepts and closes at once must not be redialled in
//     a tight loop: one already serving another client, or a QEMU whose vhost-user
//     start failed (net/vhost-user.c net_vhost_user_event: CHR_EVENT_OPENED calls
//     qemu_chr_fe_disconnect when vhost_user_start fails).
//
// The zero Policy is ready to use. It is not safe for concurrent use: one dialling
// goroutine owns it.
type Policy struct {
	quickWait time.Duration
}

// Pause is called before dialling again after a connection that was made at up (the
// zero time: there was none yet). If that connection lived less than quickConnection it
// reports the wait to onRetry (nil: not reported) and sleeps; otherwise it returns at
// once. It returns false if ctx ended first.
func (r *Policy) Pause(ctx context.Context, up time.Time, onRetry func(err error, wait time.Duration)) bool {
	lived := time.Since(up)
	if up.IsZero() || lived >= quickConnection {
		r.quickWait = 0
		return ctx.Err() == nil
	}
	r.quickWait = min(max(2*r.quickWait, dialWaitMin), dialWaitMax)
	if onRetry != nil {
		onRetry(fmt.Errorf("the server closed the connection after %v", lived.Round(time.Millisecond)), r.quickWait)
	}
	return Sleep(ctx, r.quickWait)
}

// Dial calls try until it returns nil, with the backoff above between failures. An
// error wrapped by Permanent ends it at once with the wrapped error; when ctx ends it
// returns ctx.Err() (try is expected to fail promptly once ctx is done, as
// net.Dialer.DialContext does).
func (r *Policy) Dial(ctx context.Context, try func(ctx context.Context) error, onRetry func(err error, wait time.Duration)) error {
	wait := dialWaitMin
	for {
		err := try(ctx)
		if err == nil {
			return nil
		}
		var p permanentError
		if errors.As(err, &p) {
			return p.err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if onRetry != nil {
			onRetry(err, wait)
		}
		if !Sleep(ctx, wait) {
			return ctx.Err()
		}
		wait = min(2*wait, dialWaitMax)
	}
}

// Permanent marks an error from a Dial attempt as not worth retrying.
func Permanent(err error) error { return permanentError{err} }

type permanentError struct{ err error }

const (
	dialWaitMin = 100 * time.Millisecond
	dialWaitMax = 5 * time.Second
	// quickConnection: a connection that lived less than this makes the next dial wait.
	quickConnection = time.Second
)

// Sleep waits for d or until ctx ends; it reports whether the full wait elapsed. The
// backoff's waits are these, and so are netdev's between accept errors.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }
