package netmapio

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"sync"
	"time"
)

// Dial backoff for client endpoints, and accept-error backoff for servers.
const (
	dialWaitMin   = 100 * time.Millisecond
	dialWaitMax   = 5 * time.Second
	acceptWaitMin = 5 * time.Millisecond
	acceptWaitMax = time.Second

	// quickConnection: a connection that lived less than this makes the next dial wait.
	quickConnection = time.Second
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
	// OnHelloFail: a vnet-hdr=on stream peer failed the hello (a *HelloError: QEMU, a
	// plain tapgro, a version mismatch); the connection was closed and the endpoint
	// waits for the next peer (server) or dials again after a backoff (client).
	OnHelloFail func(peer string, err error)
}

// Endpoint hands out one live Port at a time for a Spec and keeps the listening socket,
// the dial loop or the datagram binding across reconnects.
type Endpoint interface {
	// Next returns the next Port: the next client (server), a new connection dialled with
	// backoff (client), or the datagram socket (datagram). While a Port it returned is
	// still open, Next blocks until that Port is closed. It returns ctx.Err() when ctx
	// ends and ErrClosed after Close.
	Next(ctx context.Context) (Port, error)
	// Close stops the endpoint, closes the live Port if any and removes the UNIX socket
	// paths it created.
	Close() error
	// Addr is the local listening or bound address for servers and datagram endpoints
	// (with the real port when 0 was asked for), the dial target for clients.
	Addr() string
	// Stats are the counters of the endpoint and all its Ports.
	Stats() *Stats
}

type endpoint struct {
	spec  Spec
	ev    Events
	opt   Options
	stats Stats
	addr  string

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup

	// slot holds one token; Next takes it before handing out a Port and the Port's Close
	// puts it back (client and datagram roles; servers use busy).
	slot chan struct{}

	mu     sync.Mutex
	closed bool
	active Port
	busy   bool       // server: a client is pending in ready or being served
	first  *DgramPort // datagram: bound by Open, not yet handed out

	// netmap state: the port registered by Open, not yet handed out, and the counters
	// shared by every registration.
	firstNM *NetmapPort
	nmStats NetmapStats

	// Server state.
	ln    net.Listener
	ready chan net.Conn // capacity 1, guarded by busy

	// UNIX path this endpoint bound (server or datagram), to remove on Close.
	path   string
	pathFI fs.FileInfo

	// Client state: when the last connection came up, and the pause before redialing
	// after connections that ended almost at once (a server that accepts and closes —
	// e.g. one already serving another client — must not be redialed in a tight loop).
	lastUp    time.Time
	quickWait time.Duration

	// Datagram state.
	remote net.Addr

	// inherited is the connected socket a supervisor passed (fd=N), until Next takes it.
	inherited net.Conn
}

// Open prepares an endpoint for spec: a server starts listening now (so a busy address is
// reported at once) and a datagram endpoint binds now; a client dials only in Next.
func Open(spec Spec, ev Events) (Endpoint, error) { return OpenWith(spec, ev, Options{}) }

// OpenWith is Open with the settings of opt (socket permissions, inherited sockets).
func OpenWith(spec Spec, ev Events, opt Options) (Endpoint, error) {
	e := &endpoint{spec: spec, ev: ev, opt: opt, slot: make(chan struct{}, 1)}
	e.slot <- struct{}{}
	var err error
	switch spec.Role {
	case RoleServer:
		err = e.openServer()
	case RoleClient:
		e.addr = spec.Remote.String()
		if spec.Remote.Type == AddrFD {
			err = e.openInheritedConn()
		}
	case RoleDatagram:
		err = e.openDgram()
	case RoleAttach:
		err = e.openNetmap()
	default:
		err = fmt.Errorf("netmapio: spec has no role: %+v", spec)
	}
	if err != nil {
		return nil, err
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	if e.ln != nil {
		e.wg.Add(1)
		go e.acceptLoop()
	}
	return e, nil
}

func (e *endpoint) Addr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

func (e *endpoint) Stats() *Stats { return &e.stats }

func (e *endpoint) Next(ctx context.Context) (Port, error) {
	switch e.spec.Role {
	case RoleServer:
		return e.nextServer(ctx)
	case RoleClient:
		return e.nextClient(ctx)
	case RoleAttach:
		return e.nextNetmap(ctx)
	}
	return e.nextDgram(ctx)
}

func (e *endpoint) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		act, first, firstNM, inh := e.active, e.first, e.firstNM, e.inherited
		e.first, e.firstNM, e.inherited = nil, nil, nil
		path, fi := e.path, e.pathFI
		e.mu.Unlock()
		e.cancel()
		if e.ln != nil {
			e.ln.Close()
		}
		e.wg.Wait()
		if e.ready != nil {
			select {
			case c := <-e.ready:
				c.Close()
			default:
			}
		}
		if act != nil {
			act.Close()
		}
		if first != nil {
			first.Close()
		}
		if inh != nil {
			inh.Close()
		}
		if firstNM != nil {
			firstNM.Close()
		}
		removeOurs(path, fi)
	})
	return nil
}

// adopt publishes p as the live port and wires its Close back to the endpoint.
func (e *endpoint) adopt(p Port, pb *portBase) (Port, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		p.Close()
		e.release()
		return nil, ErrClosed
	}
	pb.onClose = func(err error) {
		e.stats.Disconnects.Add(1)
		if e.ev.OnDisconnect != nil {
			e.ev.OnDisconnect(pb.peer, err)
		}
		e.mu.Lock()
		if e.active == p {
			e.active = nil
		}
		e.mu.Unlock()
		e.release()
	}
	e.active = p
	e.lastUp = time.Now()
	e.mu.Unlock()
	e.stats.Connects.Add(1)
	if e.ev.OnConnect != nil {
		e.ev.OnConnect(pb.peer)
	}
	return p, nil
}

// release frees the endpoint for the next Port.
func (e *endpoint) release() {
	if e.spec.Role == RoleServer {
		e.mu.Lock()
		e.busy = false
		e.mu.Unlock()
		return
	}
	e.slot <- struct{}{}
}

// acquire takes the slot (client and datagram roles).
func (e *endpoint) acquire(ctx context.Context) error {
	select {
	case <-e.slot:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.ctx.Done():
		return ErrClosed
	}
}

// ---- server ----

func (e *endpoint) openServer() error {
	if fd, bound, ok, err := e.inheritedListener(); err != nil {
		return err
	} else if ok {
		return e.openInheritedServer(fd, bound)
	}
	a := e.spec.Local
	if a.Type == AddrUnix {
		ln, fi, err := listenUnix(a.Path, e.opt)
		if err != nil {
			return err
		}
		e.ln, e.path, e.pathFI, e.addr = ln, a.Path, fi, a.String()
	} else {
		ln, err := net.Listen("tcp", a.dialAddr())
		if err != nil {
			return fmt.Errorf("netmapio: %w", err)
		}
		e.ln, e.addr = ln, ln.Addr().String()
	}
	e.ready = make(chan net.Conn, 1)
	return nil
}

// rejectQuiet is the shortest time between two OnReject calls; the rejections in between
// are only counted (Stats.Rejects).
const rejectQuiet = 10 * time.Second

// acceptLoop accepts every connection so that extra clients get a clean close and an
// OnReject with their identity instead of hanging in the backlog (passt does the same,
// tap.c tap_listen_handler). Only one client is served at a time, as QEMU's own listeners
// do (net/socket.c net_socket_accept, net/stream.c: accepting stops while connected).
func (e *endpoint) acceptLoop() {
	defer e.wg.Done()
	wait := acceptWaitMin
	var reported time.Time // when OnReject was last called
	for {
		c, err := e.ln.Accept()
		if err != nil {
			if e.ctx.Err() != nil {
				return
			}
			// EMFILE, ECONNABORTED and friends: wait and try again.
			e.stats.Retries.Add(1)
			if e.ev.OnRetry != nil {
				e.ev.OnRetry(e.addr, err, wait)
			}
			if !sleepCtx(e.ctx, wait) {
				return
			}
			wait = min(2*wait, acceptWaitMax)
			continue
		}
		wait = acceptWaitMin
		e.mu.Lock()
		busy := e.busy || e.closed
		e.busy = true
		e.mu.Unlock()
		if busy {
			e.stats.Rejects.Add(1)
			if e.ev.OnReject == nil || time.Since(reported) < rejectQuiet {
				c.Close()
				continue
			}
			peer := peerString(c)
			c.Close()
			reported = time.Now()
			e.ev.OnReject(peer, fmt.Sprintf("another client is already connected (further ones within %v are only counted)", rejectQuiet))
			continue
		}
		e.ready <- c // never blocks: busy admits one conn at a time
	}
}

func (e *endpoint) nextServer(ctx context.Context) (Port, error) {
	for {
		var c net.Conn
		select {
		case c = <-e.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.ctx.Done():
			return nil, ErrClosed
		}
		p, err := e.newStream(c)
		if err != nil {
			c.Close()
			e.release()
			var he *HelloError
			if errors.As(err, &he) {
				// A peer of the wrong kind: not fatal, wait for the right one.
				e.helloFailed(he)
				continue
			}
			return nil, err
		}
		return e.adopt(p, &p.portBase)
	}
}

// newStream wraps a connected stream: QEMU framing, or the vnet-hdr=on extension after
// its hello (vnetstream.go).
func (e *endpoint) newStream(c net.Conn) (*StreamPort, error) {
	if e.spec.VnetHdr {
		return NewVnetStreamPort(c, &e.stats, VnetStreamAccepts, !e.spec.NoShm, HelloTimeout)
	}
	return NewStreamPort(c, &e.stats)
}

func (e *endpoint) helloFailed(he *HelloError) {
	e.stats.HelloFailures.Add(1)
	if e.ev.OnHelloFail != nil {
		e.ev.OnHelloFail(he.Peer, he)
	}
}

// ---- client ----

// nextClient dials until it succeeds. Retrying matters most here: QEMU 7.2 has no
// reconnect= option (it arrived in 8.0), so with QEMU as the server it is tapgro that must
// come back after either side restarts.
func (e *endpoint) nextClient(ctx context.Context) (Port, error) {
	if e.spec.Remote.Type == AddrFD {
		return e.nextInherited(ctx)
	}
	if err := e.acquire(ctx); err != nil {
		return nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(e.ctx, cancel)
	defer func() {
		stop()
		cancel()
	}()
	a := e.spec.Remote
	e.mu.Lock()
	lived := time.Since(e.lastUp)
	quick := !e.lastUp.IsZero() && lived < quickConnection
	if quick {
		e.quickWait = min(max(2*e.quickWait, dialWaitMin), dialWaitMax)
	} else {
		e.quickWait = 0
	}
	pause := e.quickWait
	e.mu.Unlock()
	if quick {
		e.stats.Retries.Add(1)
		if e.ev.OnRetry != nil {
			e.ev.OnRetry(e.addr, fmt.Errorf("the server closed the connection after %v", lived.Round(time.Millisecond)), pause)
		}
		if !sleepCtx(dctx, pause) {
			e.release()
			if e.ctx.Err() != nil {
				return nil, ErrClosed
			}
			return nil, ctx.Err()
		}
	}
	wait := dialWaitMin
	for {
		var d net.Dialer
		c, err := d.DialContext(dctx, a.network(), a.dialAddr())
		if err == nil {
			p, perr := e.newStream(c)
			if perr == nil {
				return e.adopt(p, &p.portBase)
			}
			c.Close()
			var he *HelloError
			if !errors.As(perr, &he) {
				e.release()
				return nil, perr
			}
			// The server is not a vnet-hdr=on tapgro: say so, back off, dial again
			// (it may be replaced by the right one).
			e.helloFailed(he)
			err = he
		}
		if dctx.Err() != nil {
			e.release()
			if e.ctx.Err() != nil {
				return nil, ErrClosed
			}
			return nil, ctx.Err()
		}
		e.stats.Retries.Add(1)
		if e.ev.OnRetry != nil {
			e.ev.OnRetry(e.addr, err, wait)
		}
		if !sleepCtx(dctx, wait) {
			continue // the DialContext above fails at once and takes the exit path
		}
		wait = min(2*wait, dialWaitMax)
	}
}

// ---- datagram ----

func (e *endpoint) openDgram() error {
	p, err := e.bindDgram()
	if err != nil {
		return err
	}
	e.first = p
	return nil
}

// bindDgram binds the local address and returns a fresh port. The first call resolves the
// remote and pins a port-0 local address to the port the kernel chose, so a rebind after
// Close keeps the address QEMU was told about.
func (e *endpoint) bindDgram() (*DgramPort, error) {
	l, r := e.spec.Local, e.spec.Remote
	var c net.Conn
	var fi fs.FileInfo
	if l.Type == AddrUnix {
		if e.remote == nil {
			e.remote = &net.UnixAddr{Net: "unixgram", Name: r.Path}
		}
		uc, info, err := bindUnixgram(l.Path, e.opt)
		if err != nil {
			return nil, err
		}
		c, fi = uc, info
	} else {
		if e.remote == nil {
			ra, err := net.ResolveUDPAddr("udp", r.dialAddr())
			if err != nil {
				return nil, fmt.Errorf("netmapio: remote %s: %w", r, err)
			}
			e.remote = ra
		}
		// Bind the remote's family, so the sockaddr in every sendmmsg matches the socket.
		network := "udp6"
		if e.remote.(*net.UDPAddr).IP.To4() != nil {
			network = "udp4"
		}
		la, err := net.ResolveUDPAddr(network, l.dialAddr())
		if err != nil {
			return nil, fmt.Errorf("netmapio: local %s: %w", l, err)
		}
		uc, err := net.ListenUDP(network, la)
		if err != nil {
			return nil, fmt.Errorf("netmapio: %w", err)
		}
		got := uc.LocalAddr().(*net.UDPAddr)
		e.spec.Local.Port = uint16(got.Port) // only Next's goroutine reads spec.Local
		c = uc
	}
	p, err := NewDgramPort(c, e.remote, &e.stats)
	if err != nil {
		c.Close()
		if fi != nil {
			removeOurs(l.Path, fi)
		}
		return nil, err
	}
	if fi != nil {
		p.cleanup = func() { removeOurs(l.Path, fi) }
	}
	e.mu.Lock()
	e.addr = e.spec.Local.String()
	if fi != nil {
		e.path, e.pathFI = l.Path, fi
	}
	e.mu.Unlock()
	return p, nil
}

func (e *endpoint) nextDgram(ctx context.Context) (Port, error) {
	if err := e.acquire(ctx); err != nil {
		return nil, err
	}
	e.mu.Lock()
	p := e.first
	e.first = nil
	e.mu.Unlock()
	if p == nil {
		var err error
		if p, err = e.bindDgram(); err != nil {
			e.release()
			return nil, err
		}
	}
	return e.adopt(p, &p.portBase)
}

// sleepCtx waits for d or until ctx ends; it reports whether the full wait elapsed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
