package netdev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"tapgro/port"
	"tapgro/redial"
	"tapgro/sockport"
)

// rejectQuiet is the shortest time between two OnReject calls; the rejections in between
// are only counted (Stats.Rejects).
const rejectQuiet = 10 * time.Second

// server is the listening role (stream server=on, socket listen=, or a listening socket
// a supervisor passed): it serves one client at a time and turns the others away.
type server struct {
	*core
	ln    net.Listener
	ready chan net.Conn // capacity 1, guarded by busy
	busy  bool          // under core.mu: a client is pending in ready or being served
	wg    sync.WaitGroup
}

func openServer(c *core) (*server, error) {
	s := &server{core: c, ready: make(chan net.Conn, 1)}
	fd, bound, ok, err := inheritedListener(c.spec.Local, c.opt.ListenFDs)
	switch {
	case err != nil:
		return nil, err
	case ok:
		if err := s.adoptListener(fd, bound); err != nil {
			return nil, err
		}
	case c.spec.Local.Type == AddrUnix:
		a := c.spec.Local
		ln, fi, err := listenUnix(a.Path, c.opt)
		if err != nil {
			return nil, err
		}
		s.ln, c.path, c.pathFI, c.addr = ln, a.Path, fi, a.String()
	default:
		ln, err := net.Listen("tcp", c.spec.Local.dialAddr())
		if err != nil {
			return nil, fmt.Errorf("netdev: %w", err)
		}
		s.ln, c.addr = ln, ln.Addr().String()
	}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// adoptListener takes a passed listening socket. The path it may be bound to belongs to
// the supervisor: it is never removed on Close.
func (s *server) adoptListener(fd int, bound Addr) error {
	f := os.NewFile(uintptr(fd), "inherited-listener")
	ln, err := net.FileListener(f) // dups fd; the original is closed below
	f.Close()
	if err != nil {
		return fmt.Errorf("netdev: inherited fd %d: %w", fd, err)
	}
	if ul, ok := ln.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	s.ln, s.addr = ln, bound.String()
	s.spec.Local = bound
	return nil
}

func (s *server) Close() error {
	s.shutdown(func() {
		s.ln.Close()
		s.wg.Wait()
		select {
		case c := <-s.ready:
			c.Close()
		default:
		}
	})
	return nil
}

func (s *server) release() {
	s.mu.Lock()
	s.busy = false
	s.mu.Unlock()
}

// acceptLoop accepts every connection so that extra clients get a clean close and an
// OnReject with their identity instead of hanging in the backlog (passt does the same,
// tap.c tap_listen_handler). Only one client is served at a time, as QEMU's own listeners
// do (net/socket.c net_socket_accept, net/stream.c: accepting stops while connected).
func (s *server) acceptLoop() {
	defer s.wg.Done()
	wait := acceptWaitMin
	var reported time.Time // when OnReject was last called
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			// EMFILE, ECONNABORTED and friends: wait and try again.
			s.stats.Retries.Add(1)
			if s.ev.OnRetry != nil {
				s.ev.OnRetry(s.Addr(), err, wait)
			}
			if !redial.Sleep(s.ctx, wait) {
				return
			}
			wait = min(2*wait, acceptWaitMax)
			continue
		}
		wait = acceptWaitMin
		s.mu.Lock()
		busy := s.busy || s.closed
		s.busy = true
		s.mu.Unlock()
		if busy {
			s.stats.Rejects.Add(1)
			if s.ev.OnReject == nil || time.Since(reported) < rejectQuiet {
				c.Close()
				continue
			}
			peer := sockport.PeerString(c)
			c.Close()
			reported = time.Now()
			s.ev.OnReject(peer, fmt.Sprintf("another client is already connected (further ones within %v are only counted)", rejectQuiet))
			continue
		}
		s.ready <- c // never blocks: busy admits one conn at a time
	}
}

func (s *server) Next(ctx context.Context) (port.Port, error) {
	for {
		var c net.Conn
		select {
		case c = <-s.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.ctx.Done():
			return nil, port.ErrClosed
		}
		p, err := s.newStream(c)
		if err != nil {
			c.Close()
			s.release()
			var he *sockport.HelloError
			if errors.As(err, &he) {
				// A peer of the wrong kind: not fatal, wait for the right one.
				s.helloFailed(he)
				continue
			}
			return nil, err
		}
		return s.adopt(p, &p.Base, s.release)
	}
}
