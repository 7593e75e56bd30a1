package netmapio

import "context"

// NetmapStatser is implemented by an Endpoint for a netmap spec (and by NetmapPort):
// the counters only a netmap port has, shared by every registration of the endpoint.
type NetmapStatser interface {
	NetmapStats() *NetmapStats
}

// NetmapStats returns the endpoint's netmap counters (all zero for other backends).
func (e *endpoint) NetmapStats() *NetmapStats { return &e.nmStats }

// openNetmap registers the port now, so a missing module, a bad name or a busy port is
// reported at start rather than at the first Next.
func (e *endpoint) openNetmap() error {
	p, err := openNetmap(e.spec, &e.stats, &e.nmStats)
	if err != nil {
		return err
	}
	e.firstNM = p
	e.addr = e.spec.IfName
	return nil
}

// nextNetmap hands out the port registered by Open, and after it is closed registers the
// port afresh: closing the descriptor unregisters it, and a new registration gets fresh
// rings (the recovery from a ring the kernel or a peer left inconsistent).
func (e *endpoint) nextNetmap(ctx context.Context) (Port, error) {
	if err := e.acquire(ctx); err != nil {
		return nil, err
	}
	e.mu.Lock()
	p := e.firstNM
	e.firstNM = nil
	e.mu.Unlock()
	if p == nil {
		var err error
		if p, err = openNetmap(e.spec, &e.stats, &e.nmStats); err != nil {
			e.release()
			return nil, err
		}
	}
	return e.adopt(p, &p.portBase)
}
