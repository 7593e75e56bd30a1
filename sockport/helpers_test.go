package sockport

import (
	"bytes"
	"errors"
	"net"
	"os"
	"runtime"
	"tapgro/port"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// checkLeaks fails the test if goroutines started during it are still running after
// cleanup (polling briefly, since closed sockets wake their goroutines asynchronously).
func checkLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			t.Errorf("goroutine leak: %d before, %d after\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
	})
}

// unixPair returns the two ends of a connected AF_UNIX socketpair of the given type.
func unixPair(t testing.TB, sotype int) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, sotype|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// frame returns an n-byte frame whose bytes identify it (tag) and its position.
func frame(n int, tag byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = tag ^ byte(i) ^ byte(i>>8)
	}
	return b
}

func makeBufs(n, size int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return bufs, make([]int, n)
}

// readFrames reads from p until want frames arrived and checks them against want.
func readFrames(t testing.TB, p port.Port, want [][]byte) {
	t.Helper()
	bufs, sizes := makeBufs(64, port.MaxFrame)
	got := 0
	for got < len(want) {
		n, err := p.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatalf("ReadBatch after %d of %d frames: %v", got, len(want), err)
		}
		for i := 0; i < n; i++ {
			if got >= len(want) {
				t.Fatalf("more frames than sent")
			}
			if !bytes.Equal(bufs[i][:sizes[i]], want[got]) {
				t.Fatalf("frame %d: got %d bytes, want %d (content differs)", got, sizes[i], len(want[got]))
			}
			got++
		}
	}
}

// setUmask sets the process umask and returns the old one (tests are not parallel).
func setUmask(m int) int { return unix.Umask(m) }

// writeAllAsync writes items with try from a goroutine, waiting for writability each
// time the port is full (after onBlock, if given), and returns the channel that gets
// the first error, or nil once everything was written.
func writeAllAsync[T any](p interface{ WaitWritable(time.Time) error }, items []T, try func([]T) (int, error), onBlock func()) <-chan error {
	done := make(chan error, 1)
	go func() {
		rest := items
		for len(rest) > 0 {
			n, err := try(rest)
			rest = rest[n:]
			if errors.Is(err, port.ErrWouldBlock) {
				if onBlock != nil {
					onBlock()
				}
				err = p.WaitWritable(time.Time{})
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

// drainN reads from p until n frames have arrived (their content is not checked).
func drainN(t testing.TB, p port.Port, bufs [][]byte, sizes []int, n int) {
	t.Helper()
	for got := 0; got < n; {
		k, err := p.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		got += k
	}
}

// smallBuffers gives a a 16 KiB send buffer (and, over TCP, b a 16 KiB receive buffer)
// so that records larger than that are taken in part: the short-write tests.
func smallBuffers(kind string, a, b *StreamPort) {
	a.rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10) })
	if kind == "tcp" {
		b.rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 16<<10) })
	}
}
