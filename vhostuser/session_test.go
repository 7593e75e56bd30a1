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

	"tapgro/vhostuser/vhostusertest"
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
	if b := h.Stop(); b[0] != 0 || b[1] != 0 {
		t.Fatalf("bases %v", b)
	}
	if len(h.rec.getStopped()) != 2 {
		t.Fatalf("stopped %v", h.rec.getStopped())
	}
	// A second stop of a stopped ring answers again, without a callback.
	h.Stop()
	if len(h.rec.getStopped()) != 2 {
		t.Fatalf("stopped %v", h.rec.getStopped())
	}
	if err := h.Close(); err != nil {
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
	r, v := h.Rings[1], h.vr[1]
	buf := h.G.Alloc(128, 64)
	iov := make([][]byte, 0, 8)
	for i := 0; i < 5; i++ {
		r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: buf, Len: 100}}))
	}
	batch(t, v, func() {
		for i := 0; i < 3; i++ {
			c, _ := v.Pop(iov)
			v.Push(c.Head, 0)
		}
	})
	b := h.Stop()
	if b[1] != 3 {
		t.Fatalf("base %d", b[1])
	}
	kick, _ := unix.Eventfd(1, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	defer unix.Close(kick)
	h.FE.Send(ReqSetVringBase, vuproto.FlagVersion, vhostusertest.State(1, b[1]))
	h.FE.Send(ReqSetVringKick, vuproto.FlagVersion, vhostusertest.U64(1), kick)
	h.FE.Send(ReqSetVringCall, vuproto.FlagVersion, vhostusertest.U64(1), r.Call)
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
	if u := r.Reap(); len(u) != 5 {
		t.Fatalf("used %d", len(u))
	}
	if !r.Called() {
		t.Fatal("first call after restart missing")
	}
}

func TestMultiqueue(t *testing.T) {
	h := startSession(t, opts{pairs: 2})
	if len(h.vr) != 4 {
		t.Fatalf("%d rings", len(h.vr))
	}
	if p := h.FE.Get(ReqGetProtocolFeatures); p&(1<<vuproto.ProtoMQ) == 0 {
		t.Fatalf("protocol %#x lacks MQ", p)
	}
	if f := h.FE.Get(ReqGetFeatures); f&(1<<virtio.NetMQ) == 0 {
		t.Fatalf("features %#x lack MQ", f)
	}
	for i := 2; i < 4; i++ {
		if h.vr[i].Writable() != (i == 2) {
			t.Fatalf("ring %d direction", i)
		}
	}
	h.Stop()
	// One pair: no MQ, GET_QUEUE_NUM is not negotiated and is answered as unknown.
	h1 := startSession(t, opts{})
	if p := h1.FE.Get(ReqGetProtocolFeatures); p != 1<<vuproto.ProtoReplyAck|1<<vuproto.ProtoNetMTU|1<<vuproto.ProtoLogShmfd {
		t.Fatalf("protocol %#x", p)
	}
	if r := h1.FE.Ack(ReqGetQueueNum, nil); r != 1 {
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
	if r := h.FE.Ack(99, make([]byte, 300), efd, efd); r != 1 {
		t.Fatalf("ack %d", r)
	}
	h.FE.Send(41, vuproto.FlagVersion, []byte{1, 2, 3})
	h.FE.Send(ReqSetLogFd, vuproto.FlagVersion, make([]byte, 8), efd) // never offered
	unix.Close(efd)
	if f := h.FE.Get(ReqGetFeatures); f&(1<<virtio.VhostUserProtocolFeatures) == 0 {
		t.Fatal("session broken after unknown requests")
	}
	if n := stats.Unknown.Load(); n != 3 {
		t.Fatalf("unknown counted %d", n)
	}
	if len(h.rec.getUnknown()) != 3 || h.rec.getUnknown()[0] != 99 {
		t.Fatalf("reported %v", h.rec.getUnknown())
	}
	h.Stop()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	// The test still holds the memfd and three eventfds per ring (Close closed the
	// socket); the back-end must hold nothing (region fds closed after mmap, unknown fds
	// closed, ring fds closed at the end of the session).
	if after, held := openFds(t), 1+3*len(h.Rings); after != before+held {
		t.Fatalf("fds: %d before, %d after the session, test holds %d", before, after, held)
	}
}

// TestProtocolErrors: framing errors end the session with ErrProtocol.
func TestProtocolErrors(t *testing.T) {
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	defer unix.Close(efd)
	raw := func(req, flags, size uint32, payload []byte) func(f *vhostusertest.Frontend) {
		return func(f *vhostusertest.Frontend) {
			b := binary.LittleEndian.AppendUint32(nil, req)
			b = binary.LittleEndian.AppendUint32(b, flags)
			b = binary.LittleEndian.AppendUint32(b, size)
			unix.Write(f.FD, append(b, payload...))
		}
	}
	for _, tc := range []struct {
		name string
		send func(f *vhostusertest.Frontend)
	}{
		{"version", raw(ReqGetFeatures, 0x2, 0, nil)},
		{"reply-bit", raw(ReqGetFeatures, 0x5, 0, nil)},
		{"flag-bits", raw(ReqGetFeatures, 0x11, 0, nil)},
		{"oversize", raw(99, 0x1, 633, make([]byte, 633))},
		{"u64-size", raw(ReqSetFeatures, 0x1, 4, make([]byte, 4))},
		{"get-with-payload", raw(ReqGetFeatures, 0x1, 8, make([]byte, 8))},
		{"addr-size", raw(ReqSetVringAddr, 0x1, 32, make([]byte, 32))},
		{"memtable-count", func(f *vhostusertest.Frontend) {
			p := vhostusertest.MemTablePayload(make([]vuproto.MemRegion, 9))
			raw(ReqSetMemTable, 0x1, uint32(len(p)), p)(f)
		}},
		{"memtable-fds", func(f *vhostusertest.Frontend) {
			f.Send(ReqSetMemTable, vuproto.FlagVersion, vhostusertest.MemTablePayload(make([]vuproto.MemRegion, 2)), efd)
		}},
		{"kick-no-fd", func(f *vhostusertest.Frontend) { f.Send(ReqSetVringKick, vuproto.FlagVersion, vhostusertest.U64(1)) }},
		{"kick-nofd-with-fd", func(f *vhostusertest.Frontend) {
			f.Send(ReqSetVringKick, vuproto.FlagVersion, vhostusertest.U64(1|vuproto.VringNoFd), efd)
		}},
		{"fd-on-owner", func(f *vhostusertest.Frontend) { f.Send(ReqSetOwner, vuproto.FlagVersion, nil, efd) }},
		{"nine-fds", func(f *vhostusertest.Frontend) {
			f.Send(99, vuproto.FlagVersion, nil, efd, efd, efd, efd, efd, efd, efd, efd, efd)
		}},
		{"ring-index", func(f *vhostusertest.Frontend) {
			f.Send(ReqSetVringNum, vuproto.FlagVersion, vhostusertest.State(7, 256))
		}},
		{"features-not-offered", func(f *vhostusertest.Frontend) { f.Send(ReqSetFeatures, vuproto.FlagVersion, vhostusertest.U64(1<<63)) }},
		{"truncated", func(f *vhostusertest.Frontend) {
			raw(ReqSetFeatures, 0x1, 8, make([]byte, 3))(f)
			unix.Shutdown(f.FD, unix.SHUT_WR)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startSession(t, opts{skipKick: true})
			tc.send(h.FE)
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
	if r := h.FE.Ack(ReqSetVringNum, vhostusertest.State(0, 100)); r == 0 {
		t.Fatal("ring size 100 accepted")
	}
	efd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	defer unix.Close(efd)
	// An eventfd cannot be mmapped: the table is refused, the session survives.
	bad := []vuproto.MemRegion{{GPA: 0, Size: 4096, UserAddr: 0x1000, MmapOffset: 0}}
	if r := h.FE.Ack(ReqSetMemTable, vhostusertest.MemTablePayload(bad), efd); r == 0 {
		t.Fatal("unmappable region accepted")
	}
	if r := h.FE.Ack(ReqSetVringNum, vhostusertest.State(0, 256)); r != 0 {
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
	r, v := h.Rings[1], h.vr[1]
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
	buf := h.G.Alloc(128, 64)
	fds := []int{h.G.FD, h.G.FD}
	sent := 0
	for round := 0; round < 50; round++ {
		for i := 0; i < 20; i++ {
			r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: buf, Len: 100}}))
			r.KickNow()
			sent++
		}
		if a := h.FE.Ack(ReqSetMemTable, vhostusertest.MemTablePayload(h.G.Regions), fds...); a != 0 {
			t.Fatalf("SET_MEM_TABLE %d", a)
		}
		deadline := time.Now().Add(5 * time.Second)
		for r.Outstanding() > 0 {
			r.Reap()
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d chains outstanding", round, r.Outstanding())
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	h.Stop()
	if n := <-done; n != sent {
		t.Fatalf("worker popped %d of %d", n, sent)
	}
}

// TestNoFdKickPolls: SET_VRING_KICK with bit 8 starts the ring in polling mode.
func TestNoFdKickPolls(t *testing.T) {
	h := startSession(t, opts{skipKick: true})
	r := h.Rings[1]
	h.FE.Send(ReqSetVringKick, vuproto.FlagVersion, vhostusertest.U64(1|vuproto.VringNoFd))
	h.FE.Send(ReqSetVringCall, vuproto.FlagVersion, vhostusertest.U64(1|vuproto.VringNoFd))
	v := <-h.rec.started
	buf := h.G.Alloc(128, 64)
	r.Publish(r.AddChain([]vhostusertest.Seg{{GPA: buf, Len: 100}}))
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
	if len(r.Reap()) != 1 {
		t.Fatal("no used entry")
	}
	stopped := make(chan struct{})
	go func() {
		time.Sleep(20 * time.Millisecond)
		h.FE.Send(ReqGetVringBase, vuproto.FlagVersion, vhostusertest.State(1, 0))
		close(stopped)
	}()
	if err := v.Wait(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Wait: %v", err)
	}
	<-stopped
	h.FE.Reply(ReqGetVringBase, 8)
}

// TestDisabledRing: with bit 30 acked a ring started before SET_VRING_ENABLE 1 is
// disabled; enabling it later flips Enabled (vhost-user.rst "Ring states").
func TestDisabledRing(t *testing.T) {
	h := startSession(t, opts{noEnable: true})
	v := h.vr[0]
	if v.Enabled() {
		t.Fatal("enabled without SET_VRING_ENABLE")
	}
	h.FE.Send(ReqSetVringEnable, vuproto.FlagVersion, vhostusertest.State(0, 1))
	h.FE.Get(ReqGetFeatures)
	if !v.Enabled() {
		t.Fatal("not enabled")
	}
	// The owner hears of every SET_VRING_ENABLE (vhostnet maps it onto the TAP queue).
	h.FE.Send(ReqSetVringEnable, vuproto.FlagVersion, vhostusertest.State(1, 0))
	h.FE.Get(ReqGetFeatures)
	h.rec.mu.Lock()
	got := fmt.Sprint(h.rec.enables)
	h.rec.mu.Unlock()
	if want := "[{0 1} {1 0}]"; got != want {
		t.Fatalf("VringEnabled reports %s, want %s", got, want)
	}
}
