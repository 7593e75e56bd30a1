package sockport

import (
	"errors"
	"os"
	"tapgro/port"
	"tapgro/port/porttest"
	"testing"
	"time"
)

// A read deadline is the I/O loop's timer: it must interrupt ReadBatch without breaking
// the connection, on every kind of port.
func TestReadDeadlineKeepsConnection(t *testing.T) {
	type pair struct{ a, b port.Port }
	cases := map[string]func(t *testing.T) pair{
		"stream-unix": func(t *testing.T) pair { a, b := streamPorts(t, "unix"); return pair{a, b} },
		"stream-tcp":  func(t *testing.T) pair { a, b := streamPorts(t, "tcp"); return pair{a, b} },
		"dgram-udp":   func(t *testing.T) pair { a, b := dgramPorts(t, "udp"); return pair{a, b} },
		"dgram-unix":  func(t *testing.T) pair { a, b := dgramPorts(t, "unix"); return pair{a, b} },
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			p := mk(t)
			bufs, sizes := porttest.Buffers(4, port.MaxFrame)
			if err := p.b.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
				t.Fatal(err)
			}
			if n, err := p.b.ReadBatch(bufs, sizes); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("ReadBatch past the deadline = %d, %v; want 0, os.ErrDeadlineExceeded", n, err)
			}
			if err := p.b.SetReadDeadline(time.Time{}); err != nil {
				t.Fatal(err)
			}
			want := [][]byte{porttest.Frame(1514, 1), porttest.Frame(60, 2)}
			if _, err := p.a.WriteBatch(want); err != nil {
				t.Fatal(err)
			}
			porttest.ReadFrames(t, p.b, want)
		})
	}
}

// Pending tells the GRO loop whether the peer's burst continues in user space.
func TestStreamPending(t *testing.T) {
	a, b := streamPorts(t, "unix")
	if b.Pending() {
		t.Fatal("Pending before anything was sent")
	}
	frames := make([][]byte, 10)
	for i := range frames {
		frames[i] = porttest.Frame(1514, byte(i))
	}
	if _, err := a.WriteBatch(frames); err != nil {
		t.Fatal(err)
	}
	bufs, sizes := porttest.Buffers(4, port.MaxFrame)
	got := 0
	for got < len(frames) {
		n, err := b.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		got += n
		// All ten arrive in one read (15 KB in a 256 KiB buffer) unless the kernel split
		// the writev; either way Pending must say whether more are already buffered.
		if more := b.df.Buffered() >= 4+port.MinFrame; b.Pending() != more && got < len(frames) {
			t.Fatalf("after %d frames: Pending() = %v with %d bytes buffered", got, b.Pending(), b.df.Buffered())
		}
	}
	if b.Pending() {
		t.Fatal("Pending after every frame was read")
	}
}
