//go:build linux

package vhostuser

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// A signal decided while another write to the same eventfd is in flight must not be
// lost: the first write may already have woken the driver, which then read the used
// ring before the entries the second signal is for (CI saw a guest's RX queue stall for
// good under iperf3 -R when the two were merged).
func TestSignalDuringWriteIsNotLost(t *testing.T) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	e := newEventFD(fd)
	defer e.close()
	if !e.acquire() {
		t.Fatal("first acquire refused")
	}
	if e.acquire() {
		t.Fatal("second acquire pinned the fd while a write was in flight")
	}
	if !e.write() {
		t.Fatal("write failed")
	}
	var b [8]byte
	if _, err := unix.Read(fd, b[:]); err != nil {
		t.Fatal(err)
	}
	if n := binary.NativeEndian.Uint64(b[:]); n != 2 {
		t.Fatalf("counter %d after a write that owed a second signal, want 2", n)
	}
	if !e.acquire() {
		t.Fatal("acquire refused after the write finished")
	}
	e.write()
}
