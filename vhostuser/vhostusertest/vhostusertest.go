//go:build linux

// Package vhostusertest is a vhost-user front-end double for tests: it plays QEMU 7.2's
// side of the socket (the message order of hw/virtio/vhost.c vhost_dev_init and
// vhost_dev_start, hw/net/vhost_net.c vhost_net_start) and the guest driver's side of
// the split rings (virtio spec "Split Virtqueues", driver side), in a memfd that stands
// for guest RAM, mapped as QEMU 7.2 maps a pc machine: two regions of one memfd, below
// and above the VGA hole.
//
// A test starts a Session against anything that serves a *net.UnixConn (a
// vhostuser.Backend's Serve), then fills TX chains (SendFrame, with arbitrary descriptor
// splits, optionally through an indirect table), posts RX buffers (PostRX, mergeable or
// not), kicks, and drains the used rings (Reap, ReapRX). Every buffer of a chain lives
// in the slot of its head descriptor, so chains recycle guest memory without an
// allocator and a benchmark can republish the same heads with no allocation.
//
// It takes a TB (testing.TB's reporting and cleanup) rather than a testing.TB, so that a
// benchmark program can drive it as a real front-end.
//
// The double does not import vhostuser: the wire format it speaks is vuproto's, which
// the back-end reads too. So vhostuser's own (internal) tests use it as every other
// package does, with no import cycle.
package vhostusertest

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// TB is what the double needs from its caller: testing.TB's failure reporting and
// cleanup. *testing.T, *testing.B and testing.TB satisfy it; a program that is not a test
// (the benchmark front-end, integration/vhostrelay) supplies its own, so the double
// does not tie its users to package testing.
type TB interface {
	Helper()
	Error(args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Descriptor flags (linux include/uapi/linux/virtio_ring.h VRING_DESC_F_*).
const (
	DescFNext     = 1
	DescFWrite    = 2
	DescFIndirect = 4
)

// Layout constants of the measured 256 MiB pc guest (QEMU 7.2 SET_MEM_TABLE): RAM below
// the VGA hole, then RAM again from 0xc0000, both from one memfd at their own offsets.
const (
	RegionAEnd  = 0xa0000
	RegionBBase = 0xc0000
)

func load32(b []byte, off int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[off : off+4][0])))
}

func store32(b []byte, off int, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[off : off+4][0])), v)
}

func load16(b []byte, off int) uint16 { return binary.LittleEndian.Uint16(b[off:]) }
