//go:build linux

package vhostusertest

import (
	"encoding/binary"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
)

// QEMU's end of the socket: messages and their payloads.

// Frontend is QEMU's end of the socket.
type Frontend struct {
	tb TB
	FD int
}

// Send sends one message with fds.
func (f *Frontend) Send(req, flags uint32, payload []byte, fds ...int) {
	b := make([]byte, vuproto.HeaderSize+len(payload))
	binary.LittleEndian.PutUint32(b, req)
	binary.LittleEndian.PutUint32(b[4:], flags)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	copy(b[vuproto.HeaderSize:], payload)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	err := unix.Sendmsg(f.FD, b, oob, nil, 0)
	for err == unix.EINTR {
		err = unix.Sendmsg(f.FD, b, oob, nil, 0)
	}
	if err != nil {
		f.tb.Fatalf("sendmsg %d: %v", req, err)
	}
}

// Reply reads one reply and checks it the way QEMU 7.2 does (vhost_user_read_header:
// flags exactly 0x5; vhost_user_read: same request, exact size).
func (f *Frontend) Reply(req uint32, size int) []byte {
	var h [vuproto.HeaderSize]byte
	f.readFull(h[:])
	if r := binary.LittleEndian.Uint32(h[:]); r != req {
		f.tb.Fatalf("reply to %d has request %d", req, r)
	}
	if fl := binary.LittleEndian.Uint32(h[4:]); fl != vuproto.ReplyFlags {
		f.tb.Fatalf("reply flags %#x instead of %#x", fl, vuproto.ReplyFlags)
	}
	if n := int(binary.LittleEndian.Uint32(h[8:])); n != size {
		f.tb.Fatalf("reply to %d size %d, want %d", req, n, size)
	}
	p := make([]byte, size)
	f.readFull(p)
	return p
}

func (f *Frontend) readFull(b []byte) {
	for got := 0; got < len(b); {
		n, err := unix.Read(f.FD, b[got:])
		if err == unix.EINTR {
			continue // Go's signals (preemption, the race detector's) interrupt it
		}
		if err != nil || n == 0 {
			f.tb.Fatalf("read reply: n=%d err=%v", n, err)
		}
		got += n
	}
}

// U64 encodes a u64 payload.
func U64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

// State encodes a vhost_vring_state payload.
func State(i, n uint32) []byte {
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, i), n)
}

// Get sends a request whose reply is a u64.
func (f *Frontend) Get(req uint32) uint64 {
	f.Send(req, vuproto.FlagVersion, nil)
	return binary.LittleEndian.Uint64(f.Reply(req, 8))
}

// Ack sends with NEED_REPLY and returns the REPLY_ACK value.
func (f *Frontend) Ack(req uint32, payload []byte, fds ...int) uint64 {
	f.Send(req, vuproto.FlagVersion|vuproto.FlagNeedReply, payload, fds...)
	return binary.LittleEndian.Uint64(f.Reply(req, 8))
}

// MemTablePayload encodes SET_MEM_TABLE.
func MemTablePayload(regs []vuproto.MemRegion) []byte {
	p := binary.LittleEndian.AppendUint32(nil, uint32(len(regs)))
	p = binary.LittleEndian.AppendUint32(p, 0)
	for _, r := range regs {
		for _, v := range []uint64{r.GPA, r.Size, r.UserAddr, r.MmapOffset} {
			p = binary.LittleEndian.AppendUint64(p, v)
		}
	}
	return p
}

// AddrPayload encodes SET_VRING_ADDR for r (QEMU VAs; log address = GPA of used).
func AddrPayload(r *Ring) []byte {
	p := binary.LittleEndian.AppendUint32(nil, uint32(r.Idx))
	p = binary.LittleEndian.AppendUint32(p, 0)
	for _, v := range []uint64{r.G.QVA(r.DescA), r.G.QVA(r.UsedA), r.G.QVA(r.AvailA), r.UsedA} {
		p = binary.LittleEndian.AppendUint64(p, v)
	}
	return p
}
