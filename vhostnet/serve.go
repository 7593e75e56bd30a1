//go:build linux

package vhostnet

import (
	"context"
	"errors"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/redial"
)

type activeConn struct{ uc *net.UnixConn }

// Serve accepts front-ends (QEMU -chardev socket,…,reconnect=N as the client) on ln one
// at a time: each connection is a fresh session (the old one's rings are stopped, its
// mappings unmapped and its fds closed before the next is served), so a reconnecting
// QEMU starts over from GET_FEATURES. A peer not allowed by Config.Peers is closed at
// once. A connection that arrives while a session runs waits for that session to end:
// while the session has not spoken yet, as long as it stays silent (at most the
// back-end's handshake timeout, after which a silent session is ended), so that a
// connection that never speaks cannot keep the next front-end out; once it has
// spoken, refuseGrace (a QEMU restarted before tapgro saw the old one go). Then the
// waiting connection is closed, counted (BackendStats.Refused) and logged, at most once
// per refuseQuiet: left in the listen backlog it would have QEMU block on its first
// reply for as long as the other session lasts. When ctx is done the listener is closed
// and the running session shut down; Serve then returns ctx.Err().
func (n *Net) Serve(ctx context.Context, ln *net.UnixListener) error {
	n.serveMu.Lock()
	defer n.serveMu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		n.shutdownActive()
	})
	defer stop()
	var idle, spoke chan struct{} // the running session's end and first message; nil before the first
	defer func() {
		if idle != nil {
			<-idle
		}
	}()
	var reported time.Time
	for {
		uc, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if !n.admit(uc, "accepted") {
			continue
		}
		if idle != nil {
			ended := false
			select {
			case <-idle:
				ended = true
			case <-spoke:
			case <-ctx.Done():
				uc.Close()
				return ctx.Err()
			}
			if !ended {
				select {
				case <-idle:
					ended = true
				case <-time.After(refuseGrace):
				case <-ctx.Done():
					uc.Close()
					return ctx.Err()
				}
			}
			if !ended {
				n.BackendStats().Refused.Add(1)
				if time.Since(reported) >= refuseQuiet {
					reported = time.Now()
					n.log.Warn("vhostnet: refused a second front-end: a session is running and a socket serves one "+
						"front-end (further refusals within quiet are only counted)",
						"socket", ln.Addr().String(), "quiet", refuseQuiet)
				}
				uc.Close()
				continue
			}
		}
		done, said := make(chan struct{}), make(chan struct{})
		idle, spoke = done, said
		go func() {
			defer close(done)
			n.session(ctx, uc, func() { close(said) })
		}()
	}
}

// refuseGrace is how long Serve holds a connection that arrived while a session runs
// before it refuses it; refuseQuiet how often a refusal is logged.
const (
	refuseGrace = time.Second
	refuseQuiet = 10 * time.Second
)

// ServeClient is Serve with the roles of the socket reversed (--netdev
// vhost-user,server=off): the front-end listens on path (QEMU -chardev
// socket,path=…,server=on,wait=off) and ServeClient dials it, serving one session at a
// time. Config.Peers applies to the process listening on path. While path is missing or refuses, and again after each session ends (QEMU
// exited, or dropped the connection), it dials with the stream client's backoff
// (package redial: 100 ms doubling to 5 s, and a pause after a session that lasted under
// a second), reporting each wait to retry (nil: not reported). A session that fails
// (the peer broke the protocol) ends only that session; the next dial starts a fresh
// one from GET_FEATURES. When ctx is done the running session is shut down and
// ServeClient returns ctx.Err(); it returns nothing else.
func (n *Net) ServeClient(ctx context.Context, path string, retry func(err error, wait time.Duration)) error {
	n.serveMu.Lock()
	defer n.serveMu.Unlock()
	stop := context.AfterFunc(ctx, n.shutdownActive)
	defer stop()
	var rd redial.Policy
	var up time.Time // when the last session's connection was made
	for {
		if !rd.Pause(ctx, up, retry) {
			return ctx.Err()
		}
		var uc *net.UnixConn
		err := rd.Dial(ctx, func(ctx context.Context) error {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", path)
			if err != nil {
				return err
			}
			uc = c.(*net.UnixConn)
			return nil
		}, retry)
		if err != nil {
			return err // only ctx ends the dial loop
		}
		up = time.Now()
		if !n.admit(uc, "dialled") {
			continue // the pause before the next dial applies (up)
		}
		n.session(ctx, uc, nil)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// session runs one session on uc, a connection Serve accepted or ServeClient dialled,
// until the front-end goes away, breaks the protocol, or ctx ends (the caller's
// AfterFunc shuts the active session down; the check here covers a ctx that ended
// before uc was published). A session's error ends that session only; SessionEnded
// logs it, once.
func (n *Net) session(ctx context.Context, uc *net.UnixConn, spoke func()) {
	n.active.Store(&activeConn{uc})
	if ctx.Err() != nil {
		n.shutdownActive()
	}
	n.backend.ServeSpoke(uc, spoke)
	n.active.Store(nil)
}

// ServeInherited runs the one session of a connection a manager handed over already
// connected (QEMU's back-end program convention --fd=FDNUM, vhost-user.rst "Backend
// program conventions"): the peer is checked as Serve checks it, and when the session
// ends, or ctx does, so does ServeInherited. It returns ctx.Err() if ctx ended it, else
// nil: a connection that cannot be re-established is over when its session is.
func (n *Net) ServeInherited(ctx context.Context, uc *net.UnixConn) error {
	n.serveMu.Lock()
	defer n.serveMu.Unlock()
	stop := context.AfterFunc(ctx, n.shutdownActive)
	defer stop()
	if !n.admit(uc, "inherited") {
		return nil
	}
	n.session(ctx, uc, nil)
	uc.Close()
	return ctx.Err()
}

// ServeConn runs one session on uc (a front-end that connected some other way).
func (n *Net) ServeConn(uc *net.UnixConn) error {
	n.active.Store(&activeConn{uc})
	defer n.active.Store(nil)
	return n.backend.Serve(uc)
}

// shutdownActive ends the running session: shutdown(2) makes the session's blocked
// recvmsg see end of file, without closing an fd the session still uses.
func (n *Net) shutdownActive() {
	a := n.active.Load()
	if a == nil {
		return
	}
	if rc, err := a.uc.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.Shutdown(int(fd), unix.SHUT_RDWR) })
	}
}

func isClosed(err error) bool { return errors.Is(err, os.ErrClosed) }
