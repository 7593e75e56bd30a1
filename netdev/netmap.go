package netdev

import (
	"context"

	"tapgro/netmapio"
	"tapgro/port"
)

// attach is netmap's role: Open registers the port now, so a missing module, a bad name
// or a busy port is reported at start rather than at the first Next; Next returns it at
// once, and after it is closed registers the port afresh: closing the descriptor
// unregisters it, and a new registration gets fresh rings (the recovery from a ring the
// kernel or a peer left inconsistent) and has its header length set again.
type attach struct {
	*core
	gate  gate
	first *netmapio.NetmapPort // under core.mu: registered by Open, not yet handed out
	// nm are netmap's own counters, shared by every registration so that they survive
	// re-registering; they reach the operator surfaces through Counters.
	nm netmapio.NetmapStats
}

var _ port.CounterSource = (*attach)(nil)

func openAttach(c *core) (*attach, error) {
	a := &attach{core: c, gate: newGate()}
	p, err := netmapio.Open(c.spec.IfName, c.spec.HdrLen, &c.stats, &a.nm)
	if err != nil {
		return nil, err
	}
	c.addr = c.spec.IfName
	a.first = p
	return a, nil
}

// Counters are netmap's own series (port.CounterSource): only a netmap endpoint has
// them.
func (a *attach) Counters() []port.Counter { return a.nm.Counters() }

func (a *attach) Close() error {
	a.shutdown(func() {
		a.mu.Lock()
		first := a.first
		a.first = nil
		a.mu.Unlock()
		if first != nil {
			first.Close()
		}
	})
	return nil
}

func (a *attach) Next(ctx context.Context) (port.Port, error) {
	if err := a.gate.acquire(ctx, a.ctx); err != nil {
		return nil, err
	}
	a.mu.Lock()
	p := a.first
	a.first = nil
	a.mu.Unlock()
	if p == nil {
		var err error
		if p, err = netmapio.Open(a.spec.IfName, a.spec.HdrLen, &a.stats, &a.nm); err != nil {
			a.gate.release()
			return nil, err
		}
	}
	return a.adopt(p, &p.Base, a.gate.release)
}
