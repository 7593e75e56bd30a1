package porttest

import (
	"bytes"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/port"
)

// The helpers every transport's tests share (sockport, netdev, netmapio had a copy
// each): frames that identify themselves, read buffers, reading frames back, raw
// connection pairs to build ports on, and a goroutine-leak check.

// CheckLeaks fails the test if goroutines started during it are still running after
// cleanup (polling briefly, since closed sockets wake their goroutines asynchronously).
func CheckLeaks(t *testing.T) {
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

// UnixConnPair returns the two ends of a connected AF_UNIX socketpair of the given type.
func UnixConnPair(t testing.TB, sotype int) (*net.UnixConn, *net.UnixConn) {
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

// TCPConnPair returns both ends of a loopback TCP connection.
func TCPConnPair(t testing.TB) (*net.TCPConn, *net.TCPConn) {
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

// Frame returns an n-byte frame whose bytes identify it (tag) and its position.
func Frame(n int, tag byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = tag ^ byte(i) ^ byte(i>>8)
	}
	return b
}

// Buffers returns n read buffers of size bytes and their sizes slice, for ReadBatch.
func Buffers(n, size int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return bufs, make([]int, n)
}

// ReadFrames reads from p until len(want) frames arrived and checks them against want.
func ReadFrames(t testing.TB, p port.Port, want [][]byte) {
	t.Helper()
	bufs, sizes := Buffers(64, port.MaxFrame)
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

// Within fails the test if fn, run on its own goroutine, takes longer than d: for calls
// that must never wait for the peer.
func Within(t testing.TB, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s blocked for more than %v", what, d)
	}
}
