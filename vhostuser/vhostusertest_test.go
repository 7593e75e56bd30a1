//go:build linux

package vhostuser_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"tapgro/vhostuser"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
)

// echo is a Handler whose workers loop TX chains back into RX chains, copying: enough
// to check the importable front-end double against the real back-end.
type echo struct {
	vhostuser.NopHandler
	rx, tx chan *vhostuser.Vring
}

func (e *echo) RingStarted(v *vhostuser.Vring) {
	if v.IsRX() {
		e.rx <- v
	} else {
		e.tx <- v
	}
}

func TestFrontendDouble(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mask     uint64
		indirect bool
	}{
		{"mrg", 0, false},
		{"mrg-indirect", 0, true},
		{"legacy10", 1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &echo{rx: make(chan *vhostuser.Vring, 1), tx: make(chan *vhostuser.Vring, 1)}
			b, err := vhostuser.NewBackend(vhostuser.Config{
				Features: 1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf |
					1<<virtio.RingEventIdx | 1<<virtio.RingIndirectDesc,
				QueuePairs: 1, Handler: e})
			if err != nil {
				t.Fatal(err)
			}
			s := vhostusertest.Start(t, b.Serve, vhostusertest.Options{AckMask: tc.mask})
			rxv, txv := <-e.rx, <-e.tx
			hl := s.HdrLen()
			mrg := s.Has(virtio.NetMrgRxbuf)
			rx, tx := s.RX(0), s.TX(0)
			rx.PostRX(64, 2048, 2)
			// Frame: header, then 3000 bytes split inside the header and the frame.
			data := make([]byte, hl+3000)
			for i := range data[hl:] {
				data[hl+i] = byte(i * 7)
			}
			if !mrg {
				data = data[:hl+1500] // one 2048-byte chain each
			}
			tx.SendFrame(data, []int{3, hl - 3 + 5, 100}, tc.indirect)
			tx.KickNow()
			// One synchronous step of a worker on each ring.
			iov := make([][]byte, 0, 64)
			if err := txv.Wait(); err != nil {
				t.Fatal(err)
			}
			txv.Begin()
			c, err := txv.Pop(iov)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, c.Len)
			vhostuser.CopyFrom(got, c.Iov, 0)
			txv.Push(c.Head, 0)
			txv.End()
			if !bytes.Equal(got, data) {
				t.Fatal("TX chain bytes differ")
			}
			if !tx.WaitCall(time.Second) || len(tx.Reap()) != 1 {
				t.Fatal("TX used entry not published with a call")
			}
			if err := rxv.Wait(); err != nil {
				t.Fatal(err)
			}
			rxv.Begin()
			segs, _, err := rxv.ReserveRX(len(got), iov[:0:64])
			if err != nil {
				t.Fatal(err)
			}
			vhostuser.CopyTo(segs, got)
			rxv.CommitRX(len(got))
			rxv.End()
			if !rx.WaitCall(time.Second) {
				t.Fatal("no RX call")
			}
			fr := rx.ReapRX(hl, mrg)
			if len(fr) != 1 || !bytes.Equal(fr[0].Frame, data[hl:]) {
				t.Fatalf("RX frames %d, want the TX frame back", len(fr))
			}
			if mrg && fr[0].NumBuffers != 2 {
				t.Fatalf("num_buffers %d, want 2", fr[0].NumBuffers)
			}
			s.Stop()
			if err := rxv.Wait(); !errors.Is(err, vhostuser.ErrStopped) {
				t.Fatalf("Wait after stop: %v", err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWaitMore: with chains available but too few, WaitMore sleeps until the driver
// adds one and kicks (with EVENT_IDX it asks for that kick through avail_event).
func TestWaitMore(t *testing.T) {
	e := &echo{rx: make(chan *vhostuser.Vring, 1), tx: make(chan *vhostuser.Vring, 1)}
	b, err := vhostuser.NewBackend(vhostuser.Config{
		Features:   1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf | 1<<virtio.RingEventIdx,
		QueuePairs: 1, Handler: e})
	if err != nil {
		t.Fatal(err)
	}
	s := vhostusertest.Start(t, b.Serve, vhostusertest.Options{})
	rxv := <-e.rx
	<-e.tx
	rx := s.RX(0)
	rx.PostRX(2, 1024, 1)
	rxv.Begin()
	if _, _, err := rxv.ReserveRX(4096, make([][]byte, 0, 8)); !errors.Is(err, vhostuser.ErrEmpty) {
		t.Fatalf("ReserveRX = %v, want ErrEmpty", err)
	}
	rxv.End()
	done := make(chan error, 1)
	go func() { done <- rxv.WaitMore() }()
	select {
	case err := <-done:
		t.Fatalf("WaitMore returned %v before new buffers", err)
	case <-time.After(50 * time.Millisecond):
	}
	if ev := rx.AvailEvent(); ev != 2 {
		t.Fatalf("avail_event %d, want 2 (the next index the driver fills)", ev)
	}
	rx.PostRX(2, 1024, 1)
	rx.KickNow()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitMore did not wake")
	}
}
