//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

func openFds(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestStartupSequence(t *testing.T) {
	stats := new(Stats)
	h := startSession(t, opts{stats: stats})
	if f := h.rec.getFeats(); len(f) != 1 || f[0].HdrLen != 12 || !f[0].Has(virtio.RingEventIdx) {
		t.Fatalf("features acked %+v", f)
	}
	if h.rec.getMTU() != 1500 {
		t.Fatalf("MTU %d", h.rec.getMTU())
	}
	for _, v := range h.vr {
		if !v.Enabled() || v.Num() != 256 {
			t.Fatalf("ring %d: enabled %v num %d", v.Index(), v.Enabled(), v.Num())
		}
	}
	if n := stats.Messages[ReqGetFeatures].Load(); n != 3 {
		t.Fatalf("GET_FEATURES counted %d", n)
	}
	if n := stats.Messages[ReqSetVringEnable].Load(); n != 6 {
		t.Fatalf("SET_VRING_ENABLE counted %d", n)
	}
	if b := h.stop(); b[0] != 0 || b[1] != 0 {
		t.Fatalf("bases %v", b)
	}
	if len(h.rec.getStopped()) != 2 {
		t.Fatalf("stopped %v", h.rec.getStopped())
	}
	// A second stop of a stopped ring answers again, without a callback.
	h.stop()
	if len(h.rec.getStopped()) != 2 {
		t.Fatalf("stopped %v", h.rec.getStopped())
	}
	if err := h.close(); err != nil {
		t.Fatal(err)
	}
	if err := <-h.rec.ended; err != nil {
		t.Fatal(err)
	}
}

// TestRestartResumes: QEMU stops the rings and starts them again with the bases it was
// given (hw/virtio/vhost.c vhost_virtqueue_stop/start).
func TestRestartResumes(t *testing.T) {
	h := startSession(t, opts{})
	r, v := h.rings[1], h.vr[1]
	buf := h.g.alloc(128, 64)
	iov := make([][]byte, 0, 8)
	for i := 0; i < 5; i++ {
		r.publish(r.addChain([]seg{{buf, 100, false}}))
	}
	batch(t, v, func() {
		for i := 0; i < 3; i++ {
			c, _ := v.Pop(iov)
			v.Push(c.Head, 0)
		}
	})
	b := h.stop()
	if b[1] != 3 {
		t.Fatalf("base %d", b[1])
	}
	kick, _ := unix.Eventfd(1, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	defer unix.Close(kick)
	h.fe.send(ReqSetVringBase, vuproto.FlagVersion, state(1, b[1]))
	h.fe.send(ReqSetVringKick, vuproto.FlagVersion, u64(1), kick)
	h.fe.send(ReqSetVringCall, vuproto.FlagVersion, u64(1), r.call)
	v2 := <-h.rec.started
	if v2 != v {
		t.Fatal("different Vring")
	}
	batch(t, v, func() {
		for i := 0; i < 2; i++ {
			c, err := v.Pop(iov)
			if err != nil {
				t.Fatal(err)
			}
			v.Push(c.Head, 0)
		}
	})
	if u := r.reap(); len(u) != 5 {
		t.Fatalf("used %d", len(u))
	}
	if !readEventfd(r.call) {
		t.Fatal("first call after restart missing")
	}
}

func TestMultiqueue(t *testing.T) {
	h := startSession(t, opts{pairs: 2})
	if len(h.vr) != 4 {
		t.Fatalf("%d rings", len(h.vr))
	}
	if p := h.fe.get(ReqGetProtocolFeatures); p&(1<<vuproto.ProtoMQ) == 0 {
		t.Fatalf("protocol %#x lacks MQ", p)
	}
	if f := h.fe.get(ReqGetFeatures); f&(1<<virtio.NetMQ) == 0 {
		t.Fatalf("features %#x lack MQ", f)
	}
	for i := 2; i < 4; i++ {
		if h.vr[i].Writable() != (i == 2) {
			t.Fatalf("ring %d direction", i)
		}
	}
	h.stop()
	// One pair: no MQ, GET_QUEUE_NUM is not negotiated and is answered as unknown.
	h1 := startSession(t, opts{})
	if p := h1.fe.get(ReqGetProtocolFeatures); p != 1<<vuproto.ProtoReplyAck|1<<vuproto.ProtoNetMTU {
		t.Fatalf("protocol %#x", p)
	}
	if r := h1.fe.ack(ReqGetQueueNum, nil); r != 1 {
		t.Fatalf("GET_QUEUE_NUM without MQ answered %d", r)
	}
}

// TestUnknownRequest: drained, its fds closed, answered 1 when asked, counted, reported,
// and the session goes on.
func TestUnknownRequest(t *testing.T) {
	before := openFds(t)
	stats := new(Stats)
	h := startSession(t, opts{stats: stats})
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if r := h.fe.ack(99, make([]byte, 300), efd, efd); r != 1 {
		t.Fatalf("ack %d", r)
	}
	h.fe.send(41, vuproto.FlagVersion, []byte{1, 2, 3})
	h.fe.send(ReqSetLogBase, vuproto.FlagVersion, make([]byte, 16), efd) // LOG_SHMFD not offered
	unix.Close(efd)
	if f := h.fe.get(ReqGetFeatures); f&(1<<virtio.VhostUserProtocolFeatures) == 0 {
		t.Fatal("session broken after unknown requests")
	}
	if n := stats.Unknown.Load(); n != 3 {
		t.Fatalf("unknown counted %d", n)
	}
	if len(h.rec.getUnknown()) != 3 || h.rec.getUnknown()[0] != 99 {
		t.Fatalf("reported %v", h.rec.getUnknown())
	}
	h.stop()
	if err := h.close(); err != nil {
		t.Fatal(err)
	}
	// The test still holds the memfd, the socket and three eventfds per ring; the
	// back-end must hold nothing (region fds closed after mmap, unknown fds closed,
	// ring fds closed at the end of the session).
	if after, held := openFds(t), 2+3*len(h.rings); after != before+held {
		t.Fatalf("fds: %d before, %d after the session, test holds %d", before, after, held)
	}
}

// TestProtocolErrors: framing errors end the session with ErrProtocol.
func TestProtocolErrors(t *testing.T) {
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	defer unix.Close(efd)
	raw := func(req, flags, size uint32, payload []byte) func(f *frontend) {
		return func(f *frontend) {
			b := binary.LittleEndian.AppendUint32(nil, req)
			b = binary.LittleEndian.AppendUint32(b, flags)
			b = binary.LittleEndian.AppendUint32(b, size)
			unix.Write(f.fd, append(b, payload...))
		}
	}
	for _, tc := range []struct {
		name string
		send func(f *frontend)
	}{
		{"version", raw(ReqGetFeatures, 0x2, 0, nil)},
		{"reply-bit", raw(ReqGetFeatures, 0x5, 0, nil)},
		{"flag-bits", raw(ReqGetFeatures, 0x11, 0, nil)},
		{"oversize", raw(99, 0x1, 633, make([]byte, 633))},
		{"u64-size", raw(ReqSetFeatures, 0x1, 4, make([]byte, 4))},
		{"get-with-payload", raw(ReqGetFeatures, 0x1, 8, make([]byte, 8))},
		{"addr-size", raw(ReqSetVringAddr, 0x1, 32, make([]byte, 32))},
		{"memtable-count", func(f *frontend) {
			p := memTablePayload(make([]vuproto.MemRegion, 9))
			raw(ReqSetMemTable, 0x1, uint32(len(p)), p)(f)
		}},
		{"memtable-fds", func(f *frontend) {
			f.send(ReqSetMemTable, vuproto.FlagVersion, memTablePayload(make([]vuproto.MemRegion, 2)), efd)
		}},
		{"kick-no-fd", func(f *frontend) { f.send(ReqSetVringKick, vuproto.FlagVersion, u64(1)) }},
		{"kick-nofd-with-fd", func(f *frontend) { f.send(ReqSetVringKick, vuproto.FlagVersion, u64(1|vuproto.VringNoFd), efd) }},
		{"fd-on-owner", func(f *frontend) { f.send(ReqSetOwner, vuproto.FlagVersion, nil, efd) }},
		{"nine-fds", func(f *frontend) {
			f.send(99, vuproto.FlagVersion, nil, efd, efd, efd, efd, efd, efd, efd, efd, efd)
		}},
		{"ring-index", func(f *frontend) { f.send(ReqSetVringNum, vuproto.FlagVersion, state(7, 256)) }},
		{"features-not-offered", func(f *frontend) { f.send(ReqSetFeatures, vuproto.FlagVersion, u64(1<<63)) }},
		{"truncated", func(f *frontend) {
			raw(ReqSetFeatures, 0x1, 8, make([]byte, 3))(f)
			unix.Shutdown(f.fd, unix.SHUT_WR)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startSession(t, opts{skipKick: true})
			tc.send(h.fe)
			select {
			case err := <-h.done:
				h.done <- err
				if tc.name == "truncated" {
					if err == nil {
						t.Fatal("truncated message accepted")
					}
					return
				}
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("session ended with %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("session survived")
			}
		})
	}
}

// TestRequestFailure: a well-formed request that cannot be honoured is answered with a
// non-zero REPLY_ACK and the session goes on.
func TestRequestFailure(t *testing.T) {
	h := startSession(t, opts{skipKick: true})
	if r := h.fe.ack(ReqSetVringNum, state(0, 100)); r == 0 {
		t.Fatal("ring size 100 accepted")
	}
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	defer unix.Close(efd)
	// An eventfd cannot be mmapped: the table is refused, the session survives.
	bad := []vuproto.MemRegion{{GPA: 0, Size: 4096, UserAddr: 0x1000, MmapOffset: 0}}
	if r := h.fe.ack(ReqSetMemTable, memTablePayload(bad), efd); r == 0 {
		t.Fatal("unmappable region accepted")
	}
	if r := h.fe.ack(ReqSetVringNum, state(0, 256)); r != 0 {
		t.Fatalf("good request after failures: %d", r)
	}
	if h.b.Stats().Failed.Load() != 2 {
		t.Fatalf("failed %d", h.b.Stats().Failed.Load())
	}
}

// TestMemTableSwap: a new SET_MEM_TABLE while a worker moves traffic; rings are
// re-translated, the old mapping unmapped only when no batch uses it.
func TestMemTableSwap(t *testing.T) {
	h := startSession(t, opts{})
	r, v := h.rings[1], h.vr[1]
	done := make(chan int, 1)
	go func() {
		iov := make([][]byte, 0, 16)
		n := 0
		defer func() { done <- n }()
		for v.Wait() == nil {
			if v.Begin() != nil {
				return
			}
			for {
				c, err := v.Pop(iov)
				if err != nil {
					break
				}
				var hdr [12]byte
				CopyFrom(hdr[:], c.Iov, 0)
				n++
				v.Push(c.Head, 0)
			}
			v.End()
		}
	}()
	buf := h.g.alloc(128, 64)
	fds := []int{h.g.fd, h.g.fd}
	sent := 0
	for round := 0; round < 50; round++ {
		for i := 0; i < 20; i++ {
			r.publish(r.addChain([]seg{{buf, 100, false}}))
			kickEventfd(r.kick)
			sent++
		}
		if a := h.fe.ack(ReqSetMemTable, memTablePayload(h.g.regions), fds...); a != 0 {
			t.Fatalf("SET_MEM_TABLE %d", a)
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(r.chainDescs) > 0 {
			r.reap()
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d chains outstanding", round, len(r.chainDescs))
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	h.stop()
	if n := <-done; n != sent {
		t.Fatalf("worker popped %d of %d", n, sent)
	}
}

// TestNoFdKickPolls: SET_VRING_KICK with bit 8 starts the ring in polling mode.
func TestNoFdKickPolls(t *testing.T) {
	h := startSession(t, opts{skipKick: true})
	r := h.rings[1]
	h.fe.send(ReqSetVringKick, vuproto.FlagVersion, u64(1|vuproto.VringNoFd))
	h.fe.send(ReqSetVringCall, vuproto.FlagVersion, u64(1|vuproto.VringNoFd))
	v := <-h.rec.started
	buf := h.g.alloc(128, 64)
	r.publish(r.addChain([]seg{{buf, 100, false}}))
	if err := v.Wait(); err != nil {
		t.Fatal(err)
	}
	batch(t, v, func() {
		c, err := v.Pop(make([][]byte, 0, 4))
		if err != nil {
			t.Fatal(err)
		}
		v.Push(c.Head, 0)
	})
	if len(r.reap()) != 1 {
		t.Fatal("no used entry")
	}
	stopped := make(chan struct{})
	go func() {
		time.Sleep(20 * time.Millisecond)
		h.fe.send(ReqGetVringBase, vuproto.FlagVersion, state(1, 0))
		close(stopped)
	}()
	if err := v.Wait(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Wait: %v", err)
	}
	<-stopped
	h.fe.reply(ReqGetVringBase, 8)
}

// TestDisabledRing: with bit 30 acked a ring started before SET_VRING_ENABLE 1 is
// disabled; enabling it later flips Enabled (vhost-user.rst "Ring states").
func TestDisabledRing(t *testing.T) {
	h := startSession(t, opts{noEnable: true})
	v := h.vr[0]
	if v.Enabled() {
		t.Fatal("enabled without SET_VRING_ENABLE")
	}
	h.fe.send(ReqSetVringEnable, vuproto.FlagVersion, state(0, 1))
	h.fe.get(ReqGetFeatures)
	if !v.Enabled() {
		t.Fatal("not enabled")
	}
	// The owner hears of every SET_VRING_ENABLE (vhostnet maps it onto the TAP queue).
	h.fe.send(ReqSetVringEnable, vuproto.FlagVersion, state(1, 0))
	h.fe.get(ReqGetFeatures)
	h.rec.mu.Lock()
	got := fmt.Sprint(h.rec.enables)
	h.rec.mu.Unlock()
	if want := "[{0 1} {1 0}]"; got != want {
		t.Fatalf("VringEnabled reports %s, want %s", got, want)
	}
}
