//go:build linux

package vhostnet

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/vnethdr"
)

// redialed is one wait ServeClient reported.
type redialed struct {
	err  error
	wait time.Duration
}

// startClient runs ServeClient on e's Net against path until the test ends (or the
// returned cancel), recording every reported wait.
func startClient(t *testing.T, e *env, path string) (tries chan redialed, cancel func(), done chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tries = make(chan redialed, 1000)
	done = make(chan error, 1)
	go func() {
		done <- e.n.ServeClient(ctx, path, func(err error, wait time.Duration) {
			select {
			case tries <- redialed{err, wait}:
			default:
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("ServeClient did not return after its ctx ended")
		}
	})
	return tries, cancel, done
}

// waitDone checks that ServeClient returned ctx's error within limit.
func waitDone(t *testing.T, done chan error, limit time.Duration) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ServeClient = %v, want context.Canceled", err)
		}
		done <- err // for startClient's cleanup
	case <-time.After(limit):
		t.Fatalf("ServeClient did not return within %v of the cancel", limit)
	}
}

// bothWays checks one frame guest → TAP and one TAP → guest on the current session.
func (e *env) bothWays(seq uint32) {
	e.t.Helper()
	buf := make([]byte, 1<<17)
	f := testFrame(e.mac, gMAC, 700+int(seq), seq, 21)
	e.send(vnethdr.Hdr{}, f, []int{30}, false)
	got, err := e.recvTAP(buf)
	if err != nil || !bytes.Equal(got, f) {
		e.t.Fatalf("frame %d guest → TAP: %v (got %d bytes)", seq, err, len(got))
	}
	rx := e.s.RX(0)
	rx.PostRX(rx.Free(), 4096, 1)
	rx.KickNow()
	g := testFrame(gMAC, e.mac, 1400-int(seq), seq, 22)
	if err := e.injectTAP(g); err != nil {
		e.t.Fatal(err)
	}
	if in := e.recvGuest(1, 4096, 1, 10*time.Second); !bytes.Equal(in[0], g) {
		e.t.Fatalf("frame %d TAP → guest: got %d bytes, differing", seq, len(in[0]))
	}
}

// TestServeClient: with the front-end listening (QEMU -chardev socket,server=on),
// ServeClient dials it and serves; when the front-end closes the session it dials again
// and the next session starts from scratch; on ctx's end it shuts the running session
// down and returns.
func TestServeClient(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/qemu.sock"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sessions := e.n.BackendStats().Sessions.Load()
	tries, cancel, done := startClient(t, e, path)
	for i := range 2 {
		e.s = vhostusertest.Accept(t, ln, vhostusertest.Options{})
		e.bothWays(uint32(i))
		if i == 0 {
			if err := e.s.Close(); err != nil { // QEMU drops the connection
				t.Fatal(err)
			}
		}
	}
	cancel()
	waitDone(t, done, 10*time.Second)
	// The running session was shut down from tapgro's side: the front-end sees EOF.
	var b [16]byte
	if n, err := unix.Read(e.s.FE.FD, b[:]); n != 0 || err != nil {
		t.Errorf("front-end read after the cancel = %d, %v; want end of file", n, err)
	}
	if got := e.n.BackendStats().Sessions.Load() - sessions; got != 2 {
		t.Errorf("%d sessions, want 2", got)
	}
	close(tries)
	for r := range tries {
		// The only wait: the pause after the first session, which ended within a second.
		if !strings.Contains(r.err.Error(), "closed the connection after") || r.wait != 100*time.Millisecond {
			t.Errorf("unexpected retry: %v, wait %v", r.err, r.wait)
		}
	}
}

// TestServeClientRetries: while the path is missing (QEMU not started yet) or refuses (a
// socket left by a killed QEMU), ServeClient retries with a doubling wait; it connects as
// soon as the front-end listens, goes back to retrying when the front-end is gone, and
// returns at once when ctx ends in the middle of a wait.
func TestServeClientRetries(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/qemu.sock"
	tries, cancel, done := startClient(t, e, path)
	next := func() redialed {
		t.Helper()
		select {
		case r := <-tries:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no retry reported within 10s")
			return redialed{}
		}
	}
	for _, want := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		if r := next(); !errors.Is(r.err, syscall.ENOENT) || r.wait != want {
			t.Fatalf("retry %v after %v; want ENOENT and %v", r.wait, r.err, want)
		}
	}

	// A socket nobody listens on.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	for r := next(); !errors.Is(r.err, syscall.ECONNREFUSED); r = next() {
		if !errors.Is(r.err, syscall.ENOENT) {
			t.Fatalf("retry after %v; want ENOENT, then ECONNREFUSED", r.err)
		}
	}

	// The front-end listens: the next dial connects and the session works.
	if err := unix.Unlink(path); err != nil {
		t.Fatal(err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	e.s = vhostusertest.Accept(t, ln, vhostusertest.Options{})
	e.bothWays(1)

	// The front-end goes away altogether (its listener closed, the path removed): back
	// to retrying, ENOENT again.
	ln.Close()
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	for r := next(); !errors.Is(r.err, syscall.ENOENT); r = next() {
		if !strings.Contains(r.err.Error(), "closed the connection after") && !errors.Is(r.err, syscall.ECONNREFUSED) {
			t.Fatalf("retry after %v; want the quick-close pause, then ENOENT", r.err)
		}
	}
	start := time.Now()
	cancel()
	waitDone(t, done, 2*time.Second)
	t.Logf("returned %v after the cancel", time.Since(start).Round(time.Microsecond))
}

// TestServeClientBadPeer: what listens on the path is untrusted. A peer that sends a
// malformed message (a payload size beyond any vhost-user message) gets its connection
// closed; ServeClient goes on and the next peer gets a working session.
func TestServeClientBadPeer(t *testing.T) {
	e := newEnv(t, vhostusertest.Options{})
	if err := e.s.Close(); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/qemu.sock"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, cancel, done := startClient(t, e, path)
	ln.SetDeadline(time.Now().Add(10 * time.Second))
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	// GET_FEATURES, version 1, payload size 0xffffffff.
	if _, err := c.Write([]byte{1, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [64]byte
	if n, err := c.Read(b[:]); n != 0 || err == nil {
		t.Fatalf("after a malformed header the back-end answered %d bytes (%v) instead of closing", n, err)
	}
	c.Close()
	e.s = vhostusertest.Accept(t, ln, vhostusertest.Options{})
	e.bothWays(5)
	cancel()
	waitDone(t, done, 10*time.Second)
}
