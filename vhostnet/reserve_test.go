//go:build linux

package vhostnet

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
// to check the reservation (reserve.go) and the importable front-end double against
// the real back-end, with no TAP.
type echo struct {
	vhostuser.NopHandler
	rx, tx chan vhostuser.Queue
}

func (e *echo) RingStarted(v vhostuser.Queue) {
	if isRX(v.Index()) {
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
			e := &echo{rx: make(chan vhostuser.Queue, 1), tx: make(chan vhostuser.Queue, 1)}
			b, err := vhostuser.NewBackend(vhostuser.Config{
				Features: 1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf |
					1<<virtio.RingEventIdx | 1<<virtio.RingIndirectDesc,
				Rings: 2, Writable: isRX, HeaderLen: hdrLenFor, Handler: e})
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
			resv := newReservation(rxv.Num())
			rxv.Begin()
			segs, _, err := resv.reserve(rxv, len(got), iov[:0:64], mrg)
			if err != nil {
				t.Fatal(err)
			}
			vhostuser.CopyTo(segs, got)
			resv.commit(rxv, len(got), hl)
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
	e := &echo{rx: make(chan vhostuser.Queue, 1), tx: make(chan vhostuser.Queue, 1)}
	b, err := vhostuser.NewBackend(vhostuser.Config{
		Features: 1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf | 1<<virtio.RingEventIdx,
		Rings:    2, Writable: isRX, HeaderLen: hdrLenFor, Handler: e})
	if err != nil {
		t.Fatal(err)
	}
	s := vhostusertest.Start(t, b.Serve, vhostusertest.Options{})
	rxv := <-e.rx
	<-e.tx
	rx := s.RX(0)
	rx.PostRX(2, 1024, 1)
	resv := newReservation(rxv.Num())
	rxv.Begin()
	if _, _, err := resv.reserve(rxv, 4096, make([][]byte, 0, 8), true); !errors.Is(err, vhostuser.ErrEmpty) {
		t.Fatalf("reserve = %v, want ErrEmpty", err)
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

// startEcho starts a bare Backend configured as New configures it, with the double as
// the front-end, and returns the session and its two started rings.
func startEcho(t testing.TB, o vhostusertest.Options) (*vhostusertest.Session, vhostuser.Queue, vhostuser.Queue) {
	t.Helper()
	e := &echo{rx: make(chan vhostuser.Queue, 1), tx: make(chan vhostuser.Queue, 1)}
	b, err := vhostuser.NewBackend(vhostuser.Config{
		Features: 1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf | 1<<virtio.RingEventIdx | 1<<virtio.RingIndirectDesc,
		Rings:    2, Writable: isRX, HeaderLen: hdrLenFor, Handler: e})
	if err != nil {
		t.Fatal(err)
	}
	s := vhostusertest.Start(t, b.Serve, o)
	return s, <-e.rx, <-e.tx
}

// TestReservation: frames of many sizes go through the reservation into chains of
// several sizes and pieces, with and without MRG_RXBUF and with the legacy 10-byte
// header: each arrives whole, num_buffers counts its chains (ReapRX follows it).
func TestReservation(t *testing.T) {
	for _, tc := range []struct {
		name           string
		mask           uint64
		bufLen, pieces int
	}{
		{"mrg-1536", 0, 1536, 1},
		{"mrg-1536-split", 0, 1536, 3},
		{"mrg-4096-noevidx", 1 << virtio.RingEventIdx, 4096, 2},
		// Linux "big packets" without MRG_RXBUF: one chain takes a whole 64 KiB frame.
		{"big", 1 << virtio.NetMrgRxbuf, 12 + 65550, 18},
		{"big-legacy-hdr", 1<<virtio.NetMrgRxbuf | 1<<virtio.Version1, 10 + 65550, 18},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, rxv, _ := startEcho(t, vhostusertest.Options{AckMask: tc.mask})
			hl, mrg := s.HdrLen(), s.Has(virtio.NetMrgRxbuf)
			if hl != hdrLenFor(s.Acked) || rxv.HdrLen() != hl {
				t.Fatalf("header %d, ring %d, want %d", hl, rxv.HdrLen(), hdrLenFor(s.Acked))
			}
			rx := s.RX(0)
			resv := newReservation(rxv.Num())
			iov := make([][]byte, 0, 1023)
			for i, n := range []int{60, 1514, 1515, 3000, 9000, 30000, 65550} {
				rx.PostRX((hl+n)/tc.bufLen+1, tc.bufLen, tc.pieces)
				frame := make([]byte, hl+n)
				for j := range frame[hl:] {
					frame[hl+j] = byte(i + j*13)
				}
				var used int
				batch(t, rxv, func() {
					segs, capTot, err := resv.reserve(rxv, hl+n, iov, mrg)
					if err != nil || capTot < hl+n {
						t.Fatalf("%d: reserve: %d bytes, %v", n, capTot, err)
					}
					vhostuser.CopyTo(segs, frame)
					used = resv.commit(rxv, hl+n, hl)
				})
				resv.forget()
				fr := rx.ReapRX(hl, mrg)
				if len(fr) != 1 || !bytes.Equal(fr[0].Frame, frame[hl:]) {
					t.Fatalf("%d: %d frames back, want the one sent", n, len(fr))
				}
				if want := (hl + n + tc.bufLen - 1) / tc.bufLen; mrg && (fr[0].NumBuffers != used || used != want) {
					t.Fatalf("%d: num_buffers %d, committed %d chains, want %d", n, fr[0].NumBuffers, used, want)
				}
				rx.DrainUsed()
			}
			s.Stop()
		})
	}
}

// TestReservationShortage: a frame larger than the posted chains cannot be reserved
// (the chains stay reserved for a smaller need); a small one then takes the first; what
// no frame took goes back at End, so the ring's base counts only the chain used.
func TestReservationShortage(t *testing.T) {
	s, rxv, _ := startEcho(t, vhostusertest.Options{})
	rx := s.RX(0)
	rx.PostRX(3, 1536, 1)
	resv := newReservation(rxv.Num())
	iov := make([][]byte, 0, 64)
	batch(t, rxv, func() {
		if _, _, err := resv.reserve(rxv, 12+9000, iov, true); !errors.Is(err, vhostuser.ErrEmpty) {
			t.Fatalf("reserve 9012 of 4608 bytes: %v", err)
		}
		segs, _, err := resv.reserve(rxv, 12+60, iov, true)
		if err != nil {
			t.Fatal(err)
		}
		vhostuser.CopyTo(segs, make([]byte, 72))
		if k := resv.commit(rxv, 72, 12); k != 1 {
			t.Fatalf("commit %d", k)
		}
		if _, _, err := resv.reserve(rxv, 12+60, iov, true); err != nil {
			t.Fatal(err)
		}
	})
	resv.forget()
	if fr := rx.ReapRX(12, true); len(fr) != 1 || len(fr[0].Frame) != 60 {
		t.Fatalf("frames %v", fr)
	}
	if b := s.Stop(); b[0] != 1 {
		t.Fatalf("RX base %d, want 1 (chains handed back are not consumed)", b[0])
	}
}

// TestReservationKeeps: as the worker does (rx.go rxFrames), every reservation covers
// the largest frame before the frame's size is known. The chains a small frame leaves
// stay reserved for the next one, within one batch: 100 frames of mixed sizes, 4 KiB
// buffers in 2 pieces, and an iov with room for only 48 segments (so that what is kept
// must move to the front before each pop), arrive in order and whole, each in the
// chains it needs, and End hands back only the chains no frame took.
func TestReservationKeeps(t *testing.T) {
	s, rxv, _ := startEcho(t, vhostusertest.Options{Num: 512, RXSlot: 4096, TXSlot: 4096})
	rx := s.RX(0)
	const frames = 100
	sizes := make([]int, frames)
	want := 0
	for i := range sizes {
		sizes[i] = 60 + (i%3)*700
		if i%10 == 9 {
			sizes[i] = 20000 + i*97 // 5 chains or so: the kept chains and new ones
		}
		want += (12 + sizes[i] + 4095) / 4096
	}
	if 2*(want+17) > 512 { // two descriptors a chain
		t.Fatalf("test needs %d chains", want+17)
	}
	rx.PostRX(want+17, 4096, 2)
	resv := newReservation(rxv.Num())
	iov := make([][]byte, 0, 48)
	var sent [][]byte
	batch(t, rxv, func() {
		for i, n := range sizes {
			frame := make([]byte, 12+n)
			for j := range frame[12:] {
				frame[12+j] = byte(i*31 + j)
			}
			segs, capTot, err := resv.reserve(rxv, 12+MaxFrame, iov, true)
			if err != nil || capTot < 12+MaxFrame {
				t.Fatalf("frame %d: reserve: %d bytes, %v", i, capTot, err)
			}
			vhostuser.CopyTo(segs, frame)
			if used := resv.commit(rxv, len(frame), 12); used != (len(frame)+4095)/4096 {
				t.Fatalf("frame %d: %d chains used", i, used)
			}
			sent = append(sent, frame[12:])
		}
	})
	resv.forget()
	fr := rx.ReapRX(12, true)
	if len(fr) != frames {
		t.Fatalf("%d frames back, want %d", len(fr), frames)
	}
	for i := range fr {
		if !bytes.Equal(fr[i].Frame, sent[i]) {
			t.Fatalf("frame %d differs (%d bytes, want %d)", i, len(fr[i].Frame), len(sent[i]))
		}
	}
	if b := s.Stop(); int(b[0]) != want {
		t.Fatalf("RX base %d, want %d (the chains no frame took go back)", b[0], want)
	}
}

// batch runs fn inside Begin/End on v.
func batch(t *testing.T, v vhostuser.Queue, fn func()) {
	t.Helper()
	if err := v.Begin(); err != nil {
		t.Fatalf("Begin: %v", err)
	}
	fn()
	v.End()
}

// BenchmarkReservation reserves mergeable 1536-byte chains for 1514-byte frames (32 per
// batch) and 64 KiB frames (43 chains each, one per batch), copies the frame in and
// commits (num_buffers, used entries, one publish per batch): the receive path's ring
// work without a TAP. "ack" is the worker's own pattern (rx.go rxFrames): each
// reservation covers the largest frame the TAP may hand over (17 of a guest's 4 KiB
// buffers) before a 66-byte frame arrives and takes one. ns/op and allocs/op are per
// frame.
func BenchmarkReservation(b *testing.B) {
	for _, bc := range []struct {
		name         string
		n, need, buf int
	}{
		{"1514", 1514, 0, 1536},
		{"64k", 65536, 0, 1536},
		{"ack", 66, 12 + MaxFrame, 4096},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, rxv, _ := startEcho(b, vhostusertest.Options{})
			rx := s.RX(0)
			frame := make([]byte, 12+bc.n)
			need := max(bc.need, len(frame))
			per := (len(frame) + bc.buf - 1) / bc.buf // chains per frame
			frames := max(1, 32/per)                  // frames per batch
			resv := newReservation(rxv.Num())
			iov := make([][]byte, 0, 128)
			heads := rx.PostRX(128, bc.buf, 1)
			cur := 0
			b.ReportAllocs()
			b.SetBytes(int64(bc.n))
			b.ResetTimer()
			for i := 0; i < b.N; i += frames {
				if err := rxv.Begin(); err != nil {
					b.Fatal(err)
				}
				for range frames {
					segs, _, err := resv.reserve(rxv, need, iov, true)
					if err != nil {
						b.Fatal(err)
					}
					vhostuser.CopyTo(segs, frame)
					if resv.commit(rxv, len(frame), 12) != per {
						b.Fatal("chains")
					}
				}
				rxv.End()
				resv.forget()
				rx.DrainUsed()
				for range per * frames {
					rx.Republish(heads[cur : cur+1])
					cur = (cur + 1) % len(heads)
				}
			}
		})
	}
}
