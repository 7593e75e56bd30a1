//go:build linux

package vhostusertest

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// Accept waits up to 20 s for a back-end that dials the front-end (QEMU as the socket
// server, -chardev socket,path=…,server=on) to connect to ln, and runs Start's sequence
// on that connection. Close then reports nil.
func Accept(tb TB, ln *net.UnixListener, o Options) *Session {
	tb.Helper()
	ln.SetDeadline(time.Now().Add(20 * time.Second))
	c, err := ln.AcceptUnix()
	ln.SetDeadline(time.Time{})
	if err != nil {
		tb.Fatalf("accept on %s: %v", ln.Addr(), err)
	}
	// The session drives the socket with raw, blocking syscalls: take a descriptor of its
	// own and clear the O_NONBLOCK Go's poller set (on the shared file description, which
	// nobody else uses once c is closed).
	rc, err := c.SyscallConn()
	if err != nil {
		c.Close()
		tb.Fatal(err)
	}
	fd := -1
	var derr error
	rc.Control(func(s uintptr) { fd, derr = unix.Dup(int(s)) })
	c.Close()
	if derr != nil {
		tb.Fatalf("dup: %v", derr)
	}
	unix.CloseOnExec(fd)
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	done <- nil
	return run(tb, fd, done, o)
}
