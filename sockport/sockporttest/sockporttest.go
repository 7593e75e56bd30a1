// Package sockporttest is connected pairs of real sockport ports for tests of code that
// drives a port.Port: the datapath engine, the TAP→port receive pool. Both ends are
// sockport stream ports over a UNIX stream socketpair registered with the Go netpoller,
// so reads, writes, backpressure and deadlines behave as they do against QEMU or another
// tapgro, without root, files or addresses. Every pair is closed when the test ends.
//
// It lives with the transport it builds, so the port contract and its test kit
// (port/porttest) import no transport.
package sockporttest

import (
	"net"
	"os"
	"testing"
	"time"

	"tapgro/port"
	"tapgro/sockport"

	"golang.org/x/sys/unix"
)

// ConnPair is a connected UNIX stream socketpair, both ends registered with the Go
// netpoller. The caller owns both.
func ConnPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// StreamPair is two QEMU-stream ports (plain frames behind a 4-byte length) joined by a
// socketpair, with private counters.
func StreamPair(t testing.TB) (a, b *sockport.StreamPort) {
	t.Helper()
	return StreamPairStats(t, nil, nil)
}

// StreamPairStats is StreamPair counting into ast and bst (either may be nil).
func StreamPairStats(t testing.TB, ast, bst *port.Stats) (a, b *sockport.StreamPort) {
	t.Helper()
	ca, cb := ConnPair(t)
	a, err := sockport.NewStreamPort(ca, ast)
	if err != nil {
		t.Fatal(err)
	}
	if b, err = sockport.NewStreamPort(cb, bst); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// VnetPair is StreamPair for the tapgro-to-tapgro vnet-hdr=on stream: both ends ran the
// hello, accepting every offload the stream carries, and with shm set up shared-memory
// rings (it fails the test if they did not come up as asked).
func VnetPair(t testing.TB, shm bool) (a, b *sockport.StreamPort) {
	t.Helper()
	ca, cb := ConnPair(t)
	errc := make(chan error, 1)
	go func() {
		var err error
		b, err = sockport.NewVnetStreamPort(cb, nil, nil, sockport.VnetStreamAccepts, shm, time.Second)
		errc <- err
	}()
	a, err := sockport.NewVnetStreamPort(ca, nil, nil, sockport.VnetStreamAccepts, shm, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if a.ShmActive() != shm || b.ShmActive() != shm {
		t.Fatalf("shared memory active %v/%v, want %v", a.ShmActive(), b.ShmActive(), shm)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
