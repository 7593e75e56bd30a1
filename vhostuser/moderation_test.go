//go:build linux

package vhostuser

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
)

// modRing is an RX ring with receive buffers posted, for the call-moderation tests.
type modRing struct {
	t    *testing.T
	h    *harness
	r    *vhostusertest.Ring
	v    *Vring
	bufs map[uint16][]vhostusertest.Seg
	iov  [][]byte
}

func newModRing(t *testing.T, ack uint64) *modRing {
	h := startSession(t, opts{ack: ack})
	m := &modRing{t: t, h: h, r: h.Rings[0], v: h.vr[0], bufs: map[uint16][]vhostusertest.Seg{}, iov: make([][]byte, 0, 64)}
	rxPost(m.r, 200, 2048, 1, m.bufs)
	return m
}

// deliver puts frames of n bytes (header included) on the ring in one batch and
// reports whether the batch brought a call. The driver plays an interrupt-driven
// guest: only a call makes it reap and re-arm.
func (m *modRing) deliver(frames, n int) bool {
	m.t.Helper()
	batch(m.t, m.v, func() {
		for range frames {
			if err := fillRX(m.v, m.iov, make([]byte, n)); err != nil {
				m.t.Fatalf("fillRX: %v", err)
			}
		}
	})
	called := m.r.Called()
	if called {
		m.rearm()
	}
	return called
}

// rearm reaps, reposts and re-enables calls at the next used index, as NAPI does
// after processing (virtqueue_enable_cb_prepare).
func (m *modRing) rearm() {
	var heads []uint16
	for _, u := range m.r.Reap() {
		nh := m.r.AddChain(m.bufs[u.ID])
		m.bufs[nh] = m.bufs[u.ID]
		heads = append(heads, nh)
	}
	m.r.Publish(heads...)
	m.r.SetUsedEvent(m.r.Reaped())
}

func (m *modRing) deferred() uint64 { return m.h.b.Stats().CallsDeferred.Load() }

// TestCallModeration checks the moderation rules deterministically: an interval of an
// hour never expires during the test, so what is deferred stays deferred until the
// rule under test releases it.
func TestCallModeration(t *testing.T) {
	bulk := 1500 // 12 of these are past moderateBytes
	for _, ei := range []bool{true, false} {
		ack := uint64(featsDefault)
		if !ei {
			ack &^= 1 << virtio.RingEventIdx
		}
		t.Run(fmt.Sprintf("bulk-deferred/eventidx=%v", ei), func(t *testing.T) {
			m := newModRing(t, ack)
			m.v.SetCallModeration(time.Hour)
			if !m.deliver(12, bulk) {
				t.Fatal("first bulk batch: no call (the first call of an interval goes at once)")
			}
			for i := range 3 {
				if m.deliver(12, bulk) {
					t.Fatalf("bulk batch %d within the interval: called", i+2)
				}
			}
			if d := m.deferred(); d != 1 {
				t.Fatalf("CallsDeferred %d, want 1 (one owed call covers the later batches)", d)
			}
			// Stopping the ring settles what is owed: the front-end takes over.
			m.h.Stop()
			if !m.r.Called() {
				t.Fatal("the owed call was not sent at stop")
			}
		})
		t.Run(fmt.Sprintf("small-never-deferred/eventidx=%v", ei), func(t *testing.T) {
			m := newModRing(t, ack)
			m.v.SetCallModeration(time.Hour)
			// A 1-byte TCP request is a 67-byte frame: request/response traffic gets
			// its call at once, batch after batch.
			for i := range 50 {
				if !m.deliver(1, 12+67) {
					t.Fatalf("small batch %d: no call", i)
				}
			}
			if d := m.deferred(); d != 0 {
				t.Fatalf("CallsDeferred %d, want 0", d)
			}
		})
	}
	// The answers to a bulk transfer the other way (ACKs to a sending guest) are small
	// frames too, but NoteLoad counts the transfer: they are moderated as bulk. A
	// transfer below moderateBytes does not make a ping-pong's answers wait.
	t.Run("answers-to-bulk-deferred", func(t *testing.T) {
		m := newModRing(t, featsDefault)
		m.v.SetCallModeration(time.Hour)
		m.v.NoteLoad(100) // a request's worth
		if !m.deliver(1, 12+66) {
			t.Fatal("an ACK after a small request: no call")
		}
		for i := range 3 {
			m.v.NoteLoad(64 << 10) // a TSO frame sent
			if m.deliver(1, 12+66) {
				t.Fatalf("ACK %d after 64 KiB sent, within the interval: called", i)
			}
		}
		if d := m.deferred(); d != 1 {
			t.Fatalf("CallsDeferred %d, want 1", d)
		}
	})
	t.Run("owed-call-sent", func(t *testing.T) {
		m := newModRing(t, featsDefault)
		m.v.SetCallModeration(time.Millisecond)
		m.deliver(12, bulk)
		if m.deliver(12, bulk) {
			t.Skip("the batch came more than 1 ms after the previous call: nothing to defer")
		}
		// Waiting here asserts delivery, not its timing: the timer sends the call.
		deadline := time.Now().Add(10 * time.Second)
		for !m.r.Called() {
			if time.Now().After(deadline) {
				t.Fatal("the owed call never came")
			}
			time.Sleep(100 * time.Microsecond)
		}
	})
	for _, tc := range []struct {
		name     string
		polled   bool // the driver consumed everything without a call meanwhile
		wantCall bool
	}{
		// NAPI polling moved used_event past everything published before the
		// interval ended: the owed call is not needed, and not sent.
		{"driver-caught-up", true, false},
		// The driver re-armed at what it had consumed and waits: the call goes.
		{"driver-still-waiting", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newModRing(t, featsDefault)
			m.v.SetCallModeration(time.Hour)
			m.deliver(12, bulk)
			if m.deliver(12, bulk) {
				t.Fatal("second bulk batch called")
			}
			if tc.polled {
				m.rearm() // vring_need_event is false for everything published
			}
			m.v.mu.Lock()
			m.v.lastCall = time.Now().Add(-2 * time.Hour) // the interval is up
			m.v.mu.Unlock()
			m.v.deferredCall()
			if got := m.r.Called(); got != tc.wantCall {
				t.Fatalf("call when the interval was up: %v, want %v", got, tc.wantCall)
			}
			m.h.Stop()
			if m.r.Called() {
				t.Fatal("stop sent a call no longer owed")
			}
		})
	}
}

// TestPublishPerFrame checks Publish inside a batch: each frame is visible on its own,
// as the per-frame baseline needs, and the call it decides goes out once, at End, since
// no write to the front-end's eventfd is made under the ring's lock (signal.go).
func TestPublishPerFrame(t *testing.T) {
	m := newModRing(t, featsDefault&^(1<<virtio.RingEventIdx))
	calls := m.h.b.Stats().Calls.Load()
	batch(t, m.v, func() {
		for i := range 5 {
			if err := fillRX(m.v, m.iov, make([]byte, 100)); err != nil {
				t.Fatal(err)
			}
			m.v.Publish()
			if u := m.r.Reap(); len(u) != 1 {
				t.Fatalf("frame %d: %d used entries visible after Publish", i, len(u))
			}
		}
	})
	if n := m.h.b.Stats().Calls.Load() - calls; n != 1 {
		t.Fatalf("%d calls for a batch of 5 published frames, want 1", n)
	}
}

// TestCallModerationRingDry: a driver out of receive buffers posts more only after
// processing, so a batch that finds the ring empty sends the owed call at once.
func TestCallModerationRingDry(t *testing.T) {
	h := startSession(t, opts{})
	m := &modRing{t: t, h: h, r: h.Rings[0], v: h.vr[0], bufs: map[uint16][]vhostusertest.Seg{}, iov: make([][]byte, 0, 64)}
	rxPost(m.r, 24, 2048, 1, m.bufs)
	m.v.SetCallModeration(time.Hour)
	m.deliver(12, 1500)
	if m.deliver(23, 1500) { // 24 posted, 23 taken
		t.Fatal("second bulk batch called")
	}
	// One buffer is left: the next batch uses it and finds the ring empty.
	batch(t, m.v, func() {
		for range 2 {
			if err := fillRX(m.v, m.iov, make([]byte, 1500)); err == ErrEmpty {
				break
			}
		}
	})
	if !m.r.Called() {
		t.Fatal("the ring ran dry with a call owed and none was sent")
	}
}

// fillRX is a device's receive path at its simplest: it pops one chain the device
// writes, copies data into it and pushes it.
func fillRX(v *Vring, iov [][]byte, data []byte) error {
	c, err := v.Pop(iov)
	if err != nil {
		return err
	}
	if CopyTo(c.Iov, data) < len(data) {
		v.Rewind(1)
		return errors.New("chain shorter than the data")
	}
	v.Push(c.Head, uint32(len(data)))
	return nil
}

// TestCallModerationHalfRing: whatever the interval, half a ring published without a
// call goes at once. A driver reclaims (TX) or refills (RX) only what it was told of:
// held longer, its transmit queue stops or its receive ring runs dry before the timer.
func TestCallModerationHalfRing(t *testing.T) {
	m := newModRing(t, featsDefault) // 256 descriptors, 200 buffers posted
	m.v.SetCallModeration(time.Hour)
	m.deliver(12, 1500)
	if m.deliver(60, 1500) {
		t.Fatal("60 chains within the interval: called")
	}
	// 60 + 70 published since the call: past 128, half of 256.
	if !m.deliver(70, 1500) {
		t.Fatal("half the ring published without a call, and none was sent")
	}
	if m.v.callTimer.Stop() {
		t.Fatal("the owed call went with that batch, but its timer was still armed")
	}
}

// TestCallModerationTXRing: on a ring the device reads, a batch that empties the ring
// has only caught up with the driver, so it keeps a call owed for the timer (on a
// receive ring it would send it: TestCallModerationRingDry). Its load is what NoteLoad
// reports, the device's own bytes included, since it pushes used entries of length 0.
func TestCallModerationTXRing(t *testing.T) {
	h := startSession(t, opts{})
	r, v := h.Rings[1], h.vr[1]
	if v.Writable() {
		t.Fatal("ring 1 is the device-readable TX ring of the pair")
	}
	v.SetCallModeration(time.Hour)
	iov := make([][]byte, 0, 8)
	send := func(frames int) bool {
		var heads []uint16
		for range frames {
			heads = append(heads, r.AddChain([]vhostusertest.Seg{{GPA: r.G.Alloc(1500, 64), Len: 1500}}))
		}
		r.Publish(heads...)
		batch(t, v, func() {
			for {
				c, err := v.Pop(iov)
				if err != nil {
					break // ErrEmpty: the batch found the ring empty
				}
				v.Push(c.Head, 0)
			}
			v.NoteLoad(frames * 1500)
		})
		called := r.Called()
		if called {
			r.Reap()
			r.SetUsedEvent(r.Reaped()) // as virtqueue_enable_cb_delayed re-arms
		}
		return called
	}
	if !send(12) {
		t.Fatal("first bulk batch: no call")
	}
	for i := range 3 {
		if send(12) {
			t.Fatalf("bulk batch %d that emptied the TX ring within the interval: called", i+2)
		}
	}
	if d := h.b.Stats().CallsDeferred.Load(); d != 1 {
		t.Fatalf("CallsDeferred %d, want 1", d)
	}
	h.Stop()
	if !r.Called() {
		t.Fatal("the owed call was not sent at stop")
	}
}
