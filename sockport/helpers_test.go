package sockport

import (
	"errors"
	"tapgro/port"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

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
