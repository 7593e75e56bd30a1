package netdev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"tapgro/port"
	"tapgro/sockport"
)

// client is the dialling role (stream server=off, socket connect=): Next dials with
// backoff until it connects, and after a Port dies the next Next dials again.
type client struct {
	*core
	gate gate
	// quickWait is the pause before redialling after connections that ended almost at
	// once (a server that accepts and closes, e.g. one already serving another client,
	// must not be redialled in a tight loop). Only Next's goroutine uses it.
	quickWait time.Duration
}

func openClient(c *core) (*client, error) {
	c.addr = c.spec.Remote.String()
	return &client{core: c, gate: newGate()}, nil
}

func (c *client) Close() error {
	c.shutdown(func() {})
	return nil
}

// Next dials until it succeeds. Retrying matters most here: QEMU 7.2 has no reconnect=
// option (it arrived in 8.0), so with QEMU as the server it is tapgro that must come back
// after either side restarts.
func (c *client) Next(ctx context.Context) (port.Port, error) {
	if err := c.gate.acquire(ctx, c.ctx); err != nil {
		return nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	defer func() {
		stop()
		cancel()
	}()
	// The endpoint closing ends the dial with ErrClosed, the caller's ctx with its error.
	gone := func() error {
		c.gate.release()
		if c.ctx.Err() != nil {
			return port.ErrClosed
		}
		return ctx.Err()
	}
	a := c.spec.Remote
	c.mu.Lock()
	lived := time.Since(c.lastUp)
	quick := !c.lastUp.IsZero() && lived < quickConnection
	c.mu.Unlock()
	if quick {
		c.quickWait = min(max(2*c.quickWait, dialWaitMin), dialWaitMax)
	} else {
		c.quickWait = 0
	}
	if quick {
		c.stats.Retries.Add(1)
		if c.ev.OnRetry != nil {
			c.ev.OnRetry(c.addr, fmt.Errorf("the server closed the connection after %v", lived.Round(time.Millisecond)), c.quickWait)
		}
		if !sleepCtx(dctx, c.quickWait) {
			return nil, gone()
		}
	}
	wait := dialWaitMin
	for {
		var d net.Dialer
		conn, err := d.DialContext(dctx, a.network(), a.dialAddr())
		if err == nil {
			p, perr := c.newStream(conn)
			if perr == nil {
				return c.adopt(p, &p.Base, c.gate.release)
			}
			conn.Close()
			var he *sockport.HelloError
			if !errors.As(perr, &he) {
				c.gate.release()
				return nil, perr
			}
			// The server is not a vnet-hdr=on tapgro: say so, back off, dial again
			// (it may be replaced by the right one).
			c.helloFailed(he)
			err = he
		}
		if dctx.Err() != nil {
			return nil, gone()
		}
		c.stats.Retries.Add(1)
		if c.ev.OnRetry != nil {
			c.ev.OnRetry(c.addr, err, wait)
		}
		if !sleepCtx(dctx, wait) {
			continue // the DialContext above fails at once and takes the exit path
		}
		wait = min(2*wait, dialWaitMax)
	}
}
