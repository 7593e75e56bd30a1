package netdev

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Redial is the dialling roles' reconnect policy, one for the whole program: the stream
// client (client.go) and vhostnet's ServeClient (tapgro dialling the vhost-user socket a
// QEMU serves) both use it, so "tapgro is the client" means the same thing whatever it
// dials.
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
// The zero Redial is ready to use. It is not safe for concurrent use: one dialling
// goroutine owns it.
type Redial struct {
	quickWait time.Duration
}

// Pause is called before dialling again after a connection that was made at up (the
// zero time: there was none yet). If that connection lived less than quickConnection it
// reports the wait to onRetry (nil: not reported) and sleeps; otherwise it returns at
// once. It returns false if ctx ended first.
func (r *Redial) Pause(ctx context.Context, up time.Time, onRetry func(err error, wait time.Duration)) bool {
	lived := time.Since(up)
	if up.IsZero() || lived >= quickConnection {
		r.quickWait = 0
		return ctx.Err() == nil
	}
	r.quickWait = min(max(2*r.quickWait, dialWaitMin), dialWaitMax)
	if onRetry != nil {
		onRetry(fmt.Errorf("the server closed the connection after %v", lived.Round(time.Millisecond)), r.quickWait)
	}
	return sleepCtx(ctx, r.quickWait)
}

// Dial calls try until it returns nil, with the backoff above between failures. An
// error wrapped by Permanent ends it at once with the wrapped error; when ctx ends it
// returns ctx.Err() (try is expected to fail promptly once ctx is done, as
// net.Dialer.DialContext does).
func (r *Redial) Dial(ctx context.Context, try func(ctx context.Context) error, onRetry func(err error, wait time.Duration)) error {
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
		if !sleepCtx(ctx, wait) {
			return ctx.Err()
		}
		wait = min(2*wait, dialWaitMax)
	}
}

// Permanent marks an error from a Dial attempt as not worth retrying.
func Permanent(err error) error { return permanentError{err} }

type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }
