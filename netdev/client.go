package netdev

import (
	"context"
	"errors"
	"net"
	"time"

	"tapgro/port"
	"tapgro/redial"
	"tapgro/sockport"
)

// client is the dialling role (stream server=off, socket connect=): Next dials with
// backoff until it connects, and after a Port dies the next Next dials again.
type client struct {
	*core
	gate gate
	// redial is the backoff between dials, and the pause before redialling after a
	// connection that ended almost at once (package redial). Only Next's goroutine, which
	// holds the gate, uses it.
	redial redial.Policy
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
	retry := func(err error, wait time.Duration) {
		c.stats.Retries.Add(1)
		if c.ev.OnRetry != nil {
			c.ev.OnRetry(c.addr, err, wait)
		}
	}
	c.mu.Lock()
	lastUp := c.lastUp
	c.mu.Unlock()
	if !c.redial.Pause(dctx, lastUp, retry) {
		return nil, gone()
	}
	var p *sockport.StreamPort
	err := c.redial.Dial(dctx, func(dctx context.Context) error {
		var d net.Dialer
		conn, err := d.DialContext(dctx, a.network(), a.dialAddr())
		if err != nil {
			return err
		}
		sp, perr := c.newStream(conn)
		if perr == nil {
			p = sp
			return nil
		}
		conn.Close()
		var he *sockport.HelloError
		if !errors.As(perr, &he) {
			return redial.Permanent(perr)
		}
		// The server is not a vnet-hdr=on tapgro: say so, back off, dial again (it may
		// be replaced by the right one).
		c.helloFailed(he)
		return he
	}, retry)
	switch {
	case err == nil:
		return c.adopt(p, &p.Base, c.gate.release)
	case dctx.Err() != nil:
		return nil, gone()
	default:
		c.gate.release()
		return nil, err
	}
}
