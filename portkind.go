package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"tapgro/datapath"
	"tapgro/netdev"
	"tapgro/ops"
	"tapgro/port"
	"tapgro/tapdev"
	"tapgro/vhostnet"
	"tapgro/vhostuser"
)

// A portKind is the datapath behind one --netdev kind, as run wires it: the engine
// (package datapath) and its endpoint for socket and netmap ports, or vhostnet for
// vhost-user. Opening one opens everything privileged it needs (the TAP, the port's
// socket); run then hands its operator surfaces to ops, serves it and logs its summary,
// the same way for every kind. A new port kind is one more implementation here.
type portKind interface {
	// ready is the start-up line's message and the fields only the root knows (the
	// flags, QEMU's); the datapath's own come from ops.ReadyFields.
	ready() (logrus.Fields, string)
	// datapath is what the operator surfaces (metrics, health, ctl) read and steer.
	datapath() ops.Datapath
	serve(ctx context.Context) error
	close()
}

// engineKind is a socket or netmap port: TAP → engine → endpoint.
type engineKind struct {
	o    *options
	log  *logrus.Logger
	tap  *tapdev.Device
	eng  *datapath.Engine
	ep   netdev.Endpoint
	spec netdev.Spec
}

func openEngine(o *options, log *logrus.Logger) (k portKind, err error) {
	e := &engineKind{o: o, log: log}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	taps, err := openTAP(o, 1, o.multiQueue)
	if err != nil {
		return nil, err
	}
	e.tap = taps[0]
	cfg := datapath.Config{
		VnetHdrLen:  o.vnetHdrLen,
		Batch:       o.batch,
		GRO:         o.gro,
		UDPGRO:      o.udpGRO,
		TimerFlush:  o.timerFlush(false),
		RSCInterval: o.rscInterval,
		MaxFlows:    o.maxFlows,
		RX:          o.rx,
		Offload:     o.offload,
		// What the TAP may hand us, for the port the spec describes; the engine
		// negotiates again with every peer that connects.
		Port: o.netdev.PortCaps(),
		// Capture files are opened before the privilege drop.
		PcapTap: o.pcapTap, PcapPort: o.pcapPort, Pcap: o.pcap,
	}
	if log.IsLevelEnabled(logrus.TraceLevel) {
		cfg.Trace = traceDecisions(log)
	}
	if e.eng, err = datapath.New(cfg, e.tap, engineLogger{log}); err != nil {
		return nil, err
	}
	// Registered even with capture off: `tapgro ctl pcap` may turn it on later.
	hupReopeners.add("pcap capture", e.eng.ReopenCapture)
	// Sockets systemd passed (socket activation) are used instead of binding (inherit.go).
	listenFDs, err := netdev.ListenFDs()
	if err != nil {
		return nil, err
	}
	if e.ep, err = netdev.OpenWith(o.netdev, supervisorEvents(log), socketOptions(o, listenFDs)); err != nil {
		return nil, err
	}
	e.spec = netdev.SpecOf(e.ep, o.netdev) // inherited sockets resolved to their address
	return e, nil
}

func (e *engineKind) close() {
	if e.ep != nil {
		e.ep.Close()
	}
	if e.eng != nil {
		e.eng.Close() // flushes capture files if Serve never ran
	}
	if e.tap != nil {
		e.tap.Close()
	}
}

func (e *engineKind) datapath() ops.Datapath {
	var own []port.Counter
	if s, ok := e.ep.(port.CounterSource); ok {
		own = s.Counters()
	}
	return ops.EngineDatapath(e.eng, e.ep.Stats(), own, e.tap.Name(), e.ep.Addr())
}

func (e *engineKind) ready() (logrus.Fields, string) {
	q := resolveQEMU(e.o)
	return logrus.Fields{"vnet_hdr_len": e.o.vnetHdrLen, "netdev": e.spec.String(), "qemu": q.String()},
		"tapgro ready; " + qemuHint(e.spec, q)
}

func (e *engineKind) serve(ctx context.Context) error {
	err := e.eng.Serve(ctx, e.ep)
	if errors.Is(err, netdev.ErrInheritedClosed) {
		// fd=N: the supervisor owns the connection; without it there is nothing to
		// serve, and a clean exit tells the supervisor so.
		e.log.WithField("port", e.ep.Addr()).Info("the inherited connection has ended; exiting")
		err = nil
	}
	return err
}

// vhostKind is a vhost-user port: TAP → vhostnet (straight to and from guest memory;
// the GRO engine only for frames it merges) → the vhost-user socket, where QEMU
// connects, or which tapgro dials (server=off). vhostnet sets the TAP's header length
// and offloads per session.
type vhostKind struct {
	o          *options
	log        *logrus.Logger
	taps       []*tapdev.Device
	vn         *vhostnet.Net
	spec       netdev.Spec
	addr, role string
	serveFn    func(ctx context.Context) error
	closers    []func()
}

func openVhost(o *options, log *logrus.Logger) (k portKind, err error) {
	v := &vhostKind{o: o, log: log, spec: o.netdev}
	defer func() {
		if err != nil {
			v.close()
		}
	}()
	// queues=N: one TAP queue per queue pair (IFF_MULTI_QUEUE when N > 1).
	if v.taps, err = openTAP(o, o.netdev.QueuePairs(), o.netdev.QueuePairs() > 1); err != nil {
		return nil, err
	}
	offload := o.offload
	queues := make([]vhostnet.TAP, len(v.taps))
	for i, q := range v.taps {
		queues[i] = q
	}
	v.vn, err = vhostnet.New(vhostnet.Config{TAPs: queues, MTU: o.mtu, Pcap: o.pcap, PcapPath: o.pcapPort, PcapTapPath: o.pcapTap,
		Log: engineLogger{log},
		// GRO toward the TAP (UDP too with --udp-gro) and RSC toward the guest
		// (vhostnet/gro.go, rsc.go), with the stream path's switches; --offload caps the
		// TAP's read offloads.
		GRO: o.gro, UDPGRO: o.udpGRO, TimerFlush: o.timerFlush(true), RSCInterval: o.rscInterval, MaxFlows: o.maxFlows,
		Offload: &offload,
		// --rx-batch off notifies per frame, as the receive pool writes per frame;
		// --call-interval bounds the calls to the guest under load.
		PerFrame: o.rx.PerFrame, CallInterval: o.callInterval, PollWindow: o.pollWindow, TXHold: o.txHold,
		Peers: o.peers, MaxMapped: o.maxMapped, AnyFSMemory: o.anyFSMemory})
	if err != nil {
		return nil, err
	}
	if vhostuser.UnloggedRXBuild() {
		log.Warn("built with tapgro_unlogged_rx: receive buffers are left out of migration dirty logs; a migrated guest will see stale data (the migration tests' control, never for use)")
	}
	v.closers = append(v.closers, func() { v.vn.CloseCapture() })
	hupReopeners.add("pcap capture", v.vn.ReopenCapture)
	spec := v.spec
	// server=off: QEMU listens on the path and tapgro dials it (after the privilege drop,
	// so --user must be able to connect), again after every session.
	onRetry := supervisorEvents(log).OnRetry
	v.serveFn = func(ctx context.Context) error {
		return v.vn.ServeClient(ctx, spec.Remote.Path, func(err error, wait time.Duration) { onRetry(spec.Remote.String(), err, wait) })
	}
	v.addr, v.role = spec.Remote.String(), "connect"
	if spec.Local.Type == netdev.AddrFD {
		return v, v.serveFD(spec.Local.FD)
	}
	if spec.Role == netdev.RoleServer {
		// The same rules as every other socket path: 0600 (or --socket-mode), owner, stale
		// sockets replaced, unsafe directories refused.
		// A listener systemd passed (contrib/systemd/tapgro-vhost@.socket) is used as it
		// is; otherwise tapgro binds its own.
		listenFDs, err := netdev.ListenFDs()
		if err != nil {
			return nil, err
		}
		ln, ok, err := netdev.InheritedUnixListener(spec.Local.Path, listenFDs)
		if err != nil {
			return nil, err
		}
		if ok {
			v.closers = append(v.closers, func() { ln.Close() })
		} else {
			var remove func()
			if ln, remove, err = netdev.ListenUnix(spec.Local.Path, socketOptions(o, nil)); err != nil {
				return nil, err
			}
			v.closers = append(v.closers, func() { ln.Close() }, remove)
		}
		v.serveFn = func(ctx context.Context) error { return v.vn.Serve(ctx, ln) }
		v.addr, v.role = spec.Local.String(), "listen"
	}
	return v, nil
}

// serveFD serves the socket a manager passed with --fd: listening, like the one tapgro
// binds itself; connected, its one session (vhostnet.ServeInherited), after which
// tapgro exits, as a back-end program should when its front-end goes away.
func (v *vhostKind) serveFD(fd int) error {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("--fd %d: not a socket: %w", fd, err)
	}
	if dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err != nil || dom != unix.AF_UNIX || typ != unix.SOCK_STREAM {
		return fmt.Errorf("--fd %d: want an AF_UNIX stream socket (domain %d, type %d)", fd, dom, typ)
	}
	listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil {
		return fmt.Errorf("--fd %d: %w", fd, err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("vhost-user-fd-%d", fd))
	defer f.Close() // net.File* duplicate it
	if listening == 1 {
		l, err := net.FileListener(f)
		if err != nil {
			return fmt.Errorf("--fd %d: %w", fd, err)
		}
		ln := l.(*net.UnixListener)
		v.closers = append(v.closers, func() { ln.Close() })
		v.serveFn = func(ctx context.Context) error { return v.vn.Serve(ctx, ln) }
		v.addr, v.role = ln.Addr().String(), "listen"
		return nil
	}
	c, err := net.FileConn(f)
	if err != nil {
		return fmt.Errorf("--fd %d: %w", fd, err)
	}
	uc := c.(*net.UnixConn)
	v.closers = append(v.closers, func() { uc.Close() })
	v.serveFn = func(ctx context.Context) error {
		err := v.vn.ServeInherited(ctx, uc)
		if err == nil {
			v.log.Info("the vhost-user connection handed over with --fd has ended; exiting")
		}
		return err
	}
	v.addr, v.role = fmt.Sprintf("fd:%d", fd), "connected"
	return nil
}

func (v *vhostKind) close() {
	for i := len(v.closers) - 1; i >= 0; i-- {
		v.closers[i]()
	}
	for _, q := range v.taps {
		q.Close()
	}
}

func (v *vhostKind) datapath() ops.Datapath {
	return ops.VhostDatapath(v.vn, v.taps[0].Name(), v.addr)
}

func (v *vhostKind) ready() (logrus.Fields, string) {
	q := resolveQEMU(v.o)
	f := logrus.Fields{"netdev": v.spec.String(), v.role: v.addr, "qemu": q.String()}
	if v.spec.Local.Type == netdev.AddrFD {
		// The manager that passed the socket has told its QEMU where it is.
		return f, "tapgro ready (vhost-user, on the socket passed as --fd)"
	}
	return f, "tapgro ready (vhost-user); " + vhostUserHint(v.spec, q)
}

func (v *vhostKind) serve(ctx context.Context) error {
	err := v.serveFn(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// openTAP opens n queues of --tap and configures its link, or adopts the queues a
// manager opened (--tap-fd), whose link is the manager's to configure.
func openTAP(o *options, n int, multiQueue bool) ([]*tapdev.Device, error) {
	if len(o.tapFDs) == 0 {
		qs, err := tapdev.OpenQueues(tapdev.Config{Name: o.tap, MultiQueue: multiQueue, VnetHdrLen: o.vnetHdrLen}, n)
		if err != nil {
			return nil, err
		}
		if err := qs[0].ConfigureLink(tapdev.LinkConfig{MTU: o.mtu, TxQueueLen: o.txQueueLen, Addrs: o.addrs, Up: true}); err != nil {
			for _, q := range qs {
				q.Close()
			}
			return nil, err
		}
		return qs, nil
	}
	if len(o.tapFDs) != n {
		return nil, fmt.Errorf("--tap-fd: %d fds for %d queue(s); give one per queue", len(o.tapFDs), n)
	}
	qs := make([]*tapdev.Device, 0, n)
	for _, fd := range o.tapFDs {
		q, err := tapdev.Adopt(fd, o.vnetHdrLen)
		if err == nil && q.Name() != o.tap {
			err = fmt.Errorf("--tap-fd %d is a queue of %s, not of %s", fd, q.Name(), o.tap)
			q.Close()
		}
		if err != nil {
			for _, q := range qs {
				q.Close()
			}
			return nil, err
		}
		qs = append(qs, q)
	}
	return qs, nil
}
