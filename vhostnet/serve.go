//go:build linux

package vhostnet

import (
	"context"
	"errors"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

type activeConn struct{ uc *net.UnixConn }

// Serve accepts front-ends (QEMU -chardev socket,…,reconnect=N as the client) on ln one
// at a time: each connection is a fresh session (the old one's rings are stopped, its
// mappings unmapped and its fds closed before the next is accepted), so a reconnecting
// QEMU starts over from GET_FEATURES. A second QEMU waits in the listen backlog. When
// ctx is done the listener is closed and the running session shut down; Serve then
// returns ctx.Err().
func (n *Net) Serve(ctx context.Context, ln *net.UnixListener) error {
	n.serveMu.Lock()
	defer n.serveMu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		ln.Close()
		n.shutdownActive()
	})
	defer stop()
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
		n.active.Store(&activeConn{uc})
		if ctx.Err() != nil {
			n.shutdownActive()
		}
		err = n.backend.Serve(uc)
		n.active.Store(nil)
		if err != nil {
			n.logf("vhostnet: session: %v", err)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
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
