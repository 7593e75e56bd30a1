package rawsys

import (
	"bytes"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func pair(t *testing.T, typ int) (int, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	return fds[0], fds[1]
}

func iov(bs ...[]byte) []unix.Iovec {
	v := make([]unix.Iovec, len(bs))
	for i, b := range bs {
		v[i].Base = &b[0]
		v[i].SetLen(len(b))
	}
	return v
}

// The calls are the kernel's: bytes go through, an empty non-blocking descriptor gives
// EAGAIN (the callers' cue to park in the netpoller) and nothing else.
func TestStream(t *testing.T) {
	a, b := pair(t, unix.SOCK_STREAM)
	buf := make([]byte, 64)
	if n, e := Read(uintptr(b), buf); e != syscall.EAGAIN {
		t.Fatalf("read of an empty socket: %d, %v; want EAGAIN", n, e)
	}
	if n, e := Write(uintptr(a), []byte("hello ")); n != 6 || e != 0 {
		t.Fatalf("write: %d, %v", n, e)
	}
	if n, e := Writev(uintptr(a), iov([]byte("vectored "), []byte("world"))); n != 14 || e != 0 {
		t.Fatalf("writev: %d, %v", n, e)
	}
	x, y := make([]byte, 8), make([]byte, 32)
	n, e := Readv(uintptr(b), iov(x, y))
	if e != 0 || n != 20 {
		t.Fatalf("readv: %d, %v", n, e)
	}
	if got := string(x) + string(y[:n-8]); got != "hello vectored world" {
		t.Fatalf("readv got %q", got)
	}
	if n, e := Write(uintptr(a), nil); n != 0 || e != 0 {
		t.Fatalf("empty write: %d, %v", n, e)
	}
	if n, e := Writev(uintptr(a), nil); n != 0 || e != 0 {
		t.Fatalf("empty writev: %d, %v", n, e)
	}
	unix.Close(a)
	if n, e := Read(uintptr(b), buf); n != 0 || e != 0 {
		t.Fatalf("read after the peer closed: %d, %v; want 0 (EOF)", n, e)
	}
	if _, e := Write(uintptr(b), []byte("x")); e != syscall.EPIPE {
		t.Fatalf("write to a closed peer: %v; want EPIPE", e)
	}
}

func TestMmsg(t *testing.T) {
	a, b := pair(t, unix.SOCK_DGRAM)
	msgs := []string{"one", "two two", "three three three"}
	out := make([]unix.Mmsghdr, len(msgs))
	for i, m := range msgs {
		out[i].Hdr.Iov = &iov([]byte(m))[0]
		out[i].Hdr.SetIovlen(1)
	}
	if n, e := Sendmmsg(uintptr(a), out, 0); n != 3 || e != 0 {
		t.Fatalf("sendmmsg: %d, %v", n, e)
	}
	in := make([]unix.Mmsghdr, 8)
	bufs := make([][]byte, len(in))
	for i := range in {
		bufs[i] = make([]byte, 64)
		in[i].Hdr.Iov = &iov(bufs[i])[0]
		in[i].Hdr.SetIovlen(1)
	}
	n, e := Recvmmsg(uintptr(b), in, 0)
	if n != 3 || e != 0 {
		t.Fatalf("recvmmsg: %d, %v", n, e)
	}
	for i, m := range msgs {
		if got := bufs[i][:in[i].Len]; !bytes.Equal(got, []byte(m)) {
			t.Fatalf("message %d: %q, want %q", i, got, m)
		}
	}
	if n, e := Recvmmsg(uintptr(b), in, 0); e != syscall.EAGAIN {
		t.Fatalf("recvmmsg of an empty socket: %d, %v; want EAGAIN", n, e)
	}
}

// PollNow reports readiness as it is, without waiting for it.
func TestPollNow(t *testing.T) {
	a, b := pair(t, unix.SOCK_DGRAM)
	fds := []unix.PollFd{{Fd: int32(b), Events: unix.POLLIN}}
	if n, e := PollNow(fds); n != 0 || e != 0 || fds[0].Revents != 0 {
		t.Fatalf("empty socket: %d, %v, revents %#x; want 0 ready", n, e, fds[0].Revents)
	}
	Write(uintptr(a), []byte("x"))
	if n, e := PollNow(fds); n != 1 || e != 0 || fds[0].Revents&unix.POLLIN == 0 {
		t.Fatalf("after a write: %d, %v, revents %#x; want POLLIN", n, e, fds[0].Revents)
	}
	if n, e := PollNow(nil); n != 0 || e != 0 {
		t.Fatalf("no fds: %d, %v", n, e)
	}
}

func TestAllocs(t *testing.T) {
	a, b := pair(t, unix.SOCK_STREAM)
	w, r := []byte("0123456789"), make([]byte, 16)
	v := iov(w[:5], w[5:])
	fds := []unix.PollFd{{Fd: int32(b), Events: unix.POLLIN}}
	if n := testing.AllocsPerRun(100, func() {
		Write(uintptr(a), w)
		Writev(uintptr(a), v)
		Read(uintptr(b), r)
		Read(uintptr(b), r)
		PollNow(fds)
	}); n != 0 {
		t.Fatalf("%v allocations per run, want 0", n)
	}
}
