package alarm

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newAlarm(t testing.TB) *Alarm {
	t.Helper()
	a, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// remaining is how long until the timerfd expires; 0 when disarmed.
func remaining(t *testing.T, a *Alarm) time.Duration {
	t.Helper()
	var cur unix.ItimerSpec
	if err := unix.TimerfdGettime(int(a.fd), &cur); err != nil {
		t.Fatal(err)
	}
	return time.Duration(cur.Value.Nano())
}

func TestSetArmsOncePerDeadline(t *testing.T) {
	a := newAlarm(t)
	if r := remaining(t, a); r != 0 {
		t.Fatalf("a new alarm is armed: %v left", r)
	}
	dl := time.Now().Add(time.Second)
	a.Set(dl)
	r := remaining(t, a)
	if r <= 0 || r > time.Second+Slack {
		t.Fatalf("after Set(now+1s): %v left, want (0, 1s+Slack]", r)
	}
	a.Set(dl)
	if a.Sets() != 1 {
		t.Errorf("a second Set of the same deadline armed again: %d sets", a.Sets())
	}
	a.Set(dl.Add(time.Second))
	if r := remaining(t, a); r <= time.Second {
		t.Errorf("Set of a later deadline: %v left, want more than 1s", r)
	}
	if a.Sets() != 2 {
		t.Errorf("Sets = %d, want 2", a.Sets())
	}
	a.Set(time.Now().Add(-time.Millisecond))
	if a.Sets() != 2 {
		t.Errorf("a deadline in the past armed the timerfd")
	}
}

// TestRings shows the armed timerfd expires and is polled by the runtime: a read of it
// through its os.File parks in the netpoller and is woken by the expiry.
func TestRings(t *testing.T) {
	a := newAlarm(t)
	a.Set(time.Now().Add(100 * time.Microsecond))
	a.f.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [8]byte
	n, err := a.f.Read(b[:])
	if err != nil {
		t.Fatalf("reading the timerfd: %v", err)
	}
	if n != 8 || binary.NativeEndian.Uint64(b[:]) < 1 {
		t.Fatalf("read %d bytes, count %d: want one expiry", n, binary.NativeEndian.Uint64(b[:]))
	}
}

func TestNilAlarm(t *testing.T) {
	var a *Alarm
	a.Set(time.Now().Add(time.Millisecond))
	if a.Sets() != 0 || a.Close() != nil {
		t.Fatal("the nil Alarm did something")
	}
}

// BenchmarkDeadline measures how long a read with a deadline 50 µs away takes to fail
// on an otherwise idle process (ns/op is the wait): with the runtime's timer alone, and
// with an Alarm set for the same deadline.
func BenchmarkDeadline(b *testing.B) {
	for _, withAlarm := range []bool{false, true} {
		name := "runtime"
		if withAlarm {
			name = "alarm"
		}
		b.Run(name, func(b *testing.B) {
			c := idleConn(b)
			var a *Alarm
			if withAlarm {
				a = newAlarm(b)
			}
			buf := make([]byte, 1)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				dl := time.Now().Add(50 * time.Microsecond)
				c.SetReadDeadline(dl)
				a.Set(dl)
				if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
					b.Fatalf("read: %v", err)
				}
			}
		})
	}
}

// idleConn is one end of a connected UNIX socket pair on which nothing arrives.
func idleConn(b *testing.B) net.Conn {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	f0, f1 := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	c, err := net.FileConn(f0)
	f0.Close()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); f1.Close() })
	return c
}
