package netdev

import (
	"context"
	"fmt"
	"io/fs"
	"net"
	"sync"
	"time"

	"tapgro/port"
	"tapgro/sockport"
)

// Accept-error backoff for servers (client endpoints redial by package redial).
const (
	acceptWaitMin = 5 * time.Millisecond
	acceptWaitMax = time.Second
)

// Events receives connection-management events. The packet path never logs, so this is
// how the supervisor learns what happened. Nil funcs are skipped. Callbacks may run on
// the endpoint's accept goroutine or on the goroutine calling Next or Port.Close,
// possibly concurrently; they must return quickly.
type Events struct {
	// OnConnect: Next is about to return a Port for this peer.
	OnConnect func(peer string)
	// OnReject: a server turned away a client because one is already being served.
	// peer carries SO_PEERCRED pid/uid/gid for UNIX, the address for TCP. It is called at
	// most once per rejectQuiet: a client connecting and closing in a loop would otherwise
	// make a log line per connection. Every rejection is counted in Stats.Rejects, which
	// is how the others are seen.
	OnReject func(peer, why string)
	// OnDisconnect: a Port was closed; err is the error that ended it, nil if it was
	// closed without one.
	OnDisconnect func(peer string, err error)
	// OnRetry: a dial (client) or accept (server) failed; the endpoint waits for wait.
	OnRetry func(addr string, err error, wait time.Duration)
	// OnHelloFail: a vnet-hdr=on stream peer failed the hello (a *sockport.HelloError:
	// QEMU, a plain tapgro, a version mismatch); the connection was closed and the
	// endpoint waits for the next peer (server) or dials again after a backoff (client).
	OnHelloFail func(peer string, err error)
}

// Endpoint hands out one live Port at a time for a Spec and keeps the listening socket,
// the dial loop or the datagram binding across reconnects.
type Endpoint interface {
	// Next returns the next Port: the next client (server), a new connection dialled with
	// backoff (client), or the datagram socket (datagram). While a Port it returned is
	// still open, Next blocks until that Port is closed. It returns ctx.Err() when ctx
	// ends and port.ErrClosed after Close.
	Next(ctx context.Context) (port.Port, error)
	// Close stops the endpoint, closes the live Port if any and removes the UNIX socket
	// paths it created.
	Close() error
	// Addr is the local listening or bound address for servers and datagram endpoints
	// (with the real port when 0 was asked for), the dial target for clients.
	Addr() string
	// Stats are the counters of the endpoint and all its Ports.
	Stats() *port.Stats
}

// Open prepares an endpoint for spec: a server starts listening now (so a busy address is
// reported at once) and a datagram endpoint binds now; a client dials only in Next.
func Open(spec Spec, ev Events) (Endpoint, error) { return OpenWith(spec, ev, Options{}) }

// OpenWith is Open with the settings of opt (socket permissions, inherited sockets).
// Each role is its own type (server.go, client.go, inherit.go, dgram.go, netmap.go)
// built on the bookkeeping they share (core).
func OpenWith(spec Spec, ev Events, opt Options) (Endpoint, error) {
	if spec.Backend == BackendVhostUser {
		// Not a frame-by-frame port: package vhostnet serves it (ListenUnix for its socket).
		return nil, fmt.Errorf("netdev: %s is served by package vhostnet, not an Endpoint", spec)
	}
	c := &core{spec: spec, ev: ev, opt: opt}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	var ep Endpoint
	var err error
	switch {
	case spec.Role == RoleServer:
		ep, err = openServer(c)
	case spec.Role == RoleClient && spec.Remote.Type == AddrFD:
		ep, err = openInheritedConn(c)
	case spec.Role == RoleClient:
		ep, err = openClient(c)
	case spec.Role == RoleDatagram:
		ep, err = openDatagram(c)
	case spec.Role == RoleAttach:
		ep, err = openAttach(c)
	default:
		err = fmt.Errorf("netdev: spec has no role: %+v", spec)
	}
	if err != nil {
		c.cancel()
		return nil, err
	}
	return ep, nil
}

// core is what every role shares: the spec, the events, the counters, the live Port and
// the close bookkeeping. Roles embed it and add only their own state.
type core struct {
	spec  Spec // guarded by mu once Open has returned (roles resolve addresses into it)
	ev    Events
	opt   Options
	stats port.Stats
	// vnet are the vnet-hdr=on stream's own counters (hello, shared memory), for the
	// roles that hand out streams; Counters hands them to the operator surfaces.
	vnet sockport.VnetStats

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	closeOnce sync.Once

	mu     sync.Mutex
	closed bool
	active port.Port
	addr   string
	lastUp time.Time // when the last Port was handed out (the client's redial pause)

	// UNIX path this endpoint bound (server or datagram), to remove on Close.
	path   string
	pathFI fs.FileInfo
}

func (c *core) Addr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addr
}

func (c *core) Stats() *port.Stats { return &c.stats }

// Counters are the stream transport's own series (port.CounterSource): every socket
// role has them, so a stream, socket or datagram port exports one set whether or not
// vnet-hdr=on is in use (zero when not); netmap's role has its own instead.
func (c *core) Counters() []port.Counter { return c.vnet.Counters() }

// Spec is the endpoint's spec with inherited sockets resolved to the address they are
// bound to, so the QEMU option printed at start-up names a real path or port.
func (c *core) Spec() Spec {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spec
}

// SpecOf returns ep's resolved spec (see core.Spec) when ep can tell, else fallback.
func SpecOf(ep Endpoint, fallback Spec) Spec {
	if s, ok := ep.(interface{ Spec() Spec }); ok {
		return s.Spec()
	}
	return fallback
}

// shutdown is the Close every role shares: it marks the endpoint closed, cancels its
// context, lets the role stop its own goroutines and free what it holds (stop), then
// closes the live Port and removes the path the endpoint created.
func (c *core) shutdown(stop func()) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		act := c.active
		path, fi := c.path, c.pathFI
		c.mu.Unlock()
		c.cancel()
		stop()
		if act != nil {
			act.Close()
		}
		removeOurs(path, fi)
	})
}

// adopt publishes p as the live port and wires its Close back to the endpoint: release
// frees the role for the next Port.
func (c *core) adopt(p port.Port, b *port.Base, release func()) (port.Port, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		p.Close()
		release()
		return nil, port.ErrClosed
	}
	b.SetOnClose(func(err error) {
		c.stats.Disconnects.Add(1)
		if c.ev.OnDisconnect != nil {
			c.ev.OnDisconnect(b.Peer(), err)
		}
		c.mu.Lock()
		if c.active == p {
			c.active = nil
		}
		c.mu.Unlock()
		release()
	})
	c.active = p
	c.lastUp = time.Now()
	c.mu.Unlock()
	c.stats.Connects.Add(1)
	if c.ev.OnConnect != nil {
		c.ev.OnConnect(b.Peer())
	}
	return p, nil
}

// newStream wraps a connected stream: QEMU framing, or the vnet-hdr=on extension after
// its hello (sockport's vnetstream.go).
func (c *core) newStream(conn net.Conn) (*sockport.StreamPort, error) {
	if c.spec.VnetHdr {
		return sockport.NewVnetStreamPort(conn, &c.stats, &c.vnet, sockport.VnetStreamAccepts, !c.spec.NoShm, sockport.HelloTimeout)
	}
	return sockport.NewStreamPort(conn, &c.stats)
}

func (c *core) helloFailed(he *sockport.HelloError) {
	c.vnet.HelloFailures.Add(1)
	if c.ev.OnHelloFail != nil {
		c.ev.OnHelloFail(he.Peer, he)
	}
}

// gate admits one Port at a time for the roles without a listener (client, inherited,
// datagram, netmap): Next takes its token before handing out a Port and the Port's
// Close puts it back.
type gate chan struct{}

func newGate() gate {
	g := make(gate, 1)
	g <- struct{}{}
	return g
}

// acquire takes the token, or fails when ctx ends or the endpoint (done) closes.
func (g gate) acquire(ctx, done context.Context) error {
	select {
	case <-g:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-done.Done():
		return port.ErrClosed
	}
}

func (g gate) release() { g <- struct{}{} }
