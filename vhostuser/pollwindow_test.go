//go:build linux

package vhostuser

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
)

// pwRing is a TX ring whose worker runs Wait and one batch per wake, for the poll
// window tests.
type pwRing struct {
	t     *testing.T
	h     *harness
	r     *vhostusertest.Ring
	v     *Vring
	buf   uint64
	woken chan error
}

func newPWRing(t *testing.T, ack uint64) *pwRing {
	h := startSession(t, opts{ack: ack})
	p := &pwRing{t: t, h: h, r: h.Rings[1], v: h.vr[1], buf: h.G.Alloc(128, 64), woken: make(chan error, 1)}
	// One chain, taken: the worker has just had work. (No kick: Wait sees the chain
	// first.)
	p.post()
	p.wait()
	p.take()
	return p
}

// post makes one chain available without a kick.
func (p *pwRing) post() { p.r.Publish(p.r.AddChain([]vhostusertest.Seg{{GPA: p.buf, Len: 100}})) }

// take pops and completes everything available, as a TX worker's batch does.
func (p *pwRing) take() {
	p.t.Helper()
	iov := make([][]byte, 0, 8)
	batch(p.t, p.v, func() {
		for {
			c, err := p.v.Pop(iov)
			if err != nil {
				return
			}
			p.v.Push(c.Head, 0)
		}
	})
	p.r.Reap()
}

func (p *pwRing) wait() {
	p.t.Helper()
	if err := p.v.Wait(); err != nil {
		p.t.Fatalf("Wait: %v", err)
	}
}

// startWait runs Wait in the background; woken gets its result.
func (p *pwRing) startWait() { go func() { p.woken <- p.v.Wait() }() }

func (p *pwRing) woke() {
	p.t.Helper()
	select {
	case err := <-p.woken:
		if err != nil {
			p.t.Fatalf("Wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		p.t.Fatal("Wait did not return")
	}
}

// kickWanted is the driver's question after it made chains available: does the device
// want a kick for them (virtio spec "Available Buffer Notification Suppression")?
func (p *pwRing) kickWanted(eventIdx bool, old uint16) bool {
	if eventIdx {
		return vhostusertest.NeedEvent(p.r.AvailEvent(), p.r.AvailIdx(), old)
	}
	return binary.LittleEndian.Uint16(p.r.Used[0:])&usedFNoNotify == 0
}

// kickedAwake checks a worker asleep on its kick with no window open: a chain posted
// wants a kick, and the kick (not a watch) wakes it.
func (p *pwRing) kickedAwake(eventIdx bool) {
	p.t.Helper()
	s := p.h.b.Stats()
	k0 := s.Kicks.Load()
	old := p.r.AvailIdx()
	p.post()
	if !p.kickWanted(eventIdx, old) {
		p.t.Fatal("the sleeping worker did not ask for a kick")
	}
	p.r.KickNow()
	p.woke()
	if k, h := s.Kicks.Load(), s.PollHits.Load(); k != k0+1 || h != 0 {
		p.t.Fatalf("kicks %d -> %d, poll hits %d; want one kick and no hit", k0, k, h)
	}
	p.take()
}

// wouldKick is kickWanted for a chain the driver has not posted yet.
func (p *pwRing) wouldKick(eventIdx bool) bool {
	if eventIdx {
		return vhostusertest.NeedEvent(p.r.AvailEvent(), p.r.AvailIdx()+1, p.r.AvailIdx())
	}
	return binary.LittleEndian.Uint16(p.r.Used[0:])&usedFNoNotify == 0
}

// parked waits until the worker sleeps on its kick.
func (p *pwRing) parked() {
	p.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !p.v.parked.Load(); {
		if time.Now().After(deadline) {
			p.t.Fatal("the worker never went to sleep")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPollWindow: with a window, chains the driver posts after Poke are taken with kicks
// turned off and no kick counted, the worker woken by Poke's own write; without a Poke, or
// with the window off, the worker enables kicks and sleeps at once, and Poke does
// nothing when off.
func TestPollWindow(t *testing.T) {
	for _, ei := range []bool{true, false} {
		ack := uint64(featsDefault)
		if !ei {
			ack &^= 1 << virtio.RingEventIdx
		}
		stats := func(p *pwRing) (kicks, hits uint64) {
			s := p.h.b.Stats()
			return s.Kicks.Load(), s.PollHits.Load()
		}
		t.Run(fmt.Sprintf("no-poke/eventidx=%v", ei), func(t *testing.T) {
			// A window is only ever opened by Poke: work alone does not make the
			// worker watch, so it enables kicks and sleeps at once.
			p := newPWRing(t, ack)
			p.v.SetPollWindow(time.Hour)
			p.startWait()
			p.parked()
			p.kickedAwake(ei)
		})
		t.Run(fmt.Sprintf("poke/eventidx=%v", ei), func(t *testing.T) {
			p := newPWRing(t, ack)
			p.v.SetPollWindow(time.Hour)
			p.startWait()
			p.parked() // no window yet: it sleeps on the kick
			// Counted from here: the session's first kick (the front-end signals a new
			// kick eventfd) may have been counted on the way to sleep.
			k0, h0 := stats(p)
			p.v.Poke()
			for deadline := time.Now().Add(10 * time.Second); p.v.parked.Load() || p.wouldKick(ei); {
				// Poke's write woke it; it watches now, with kicks turned off again.
				if time.Now().After(deadline) {
					t.Fatal("after Poke the worker did not watch with kicks off")
				}
				time.Sleep(time.Millisecond)
			}
			old := p.r.AvailIdx()
			p.post()
			if p.kickWanted(ei, old) {
				t.Fatal("the worker watching after Poke asked for a kick")
			}
			p.woke()
			if k, h := stats(p); k != k0 || h != h0+1 {
				t.Fatalf("kicks %d -> %d, poll hits %d -> %d; want Poke's wake-up not counted as a kick and one hit", k0, k, h0, h)
			}
			p.take()
		})
		t.Run(fmt.Sprintf("off/eventidx=%v", ei), func(t *testing.T) {
			p := newPWRing(t, ack)
			p.startWait()
			p.parked()
			p.v.Poke() // off: nothing to wake
			if n := p.v.selfPokes.Load(); n != 0 {
				t.Fatalf("Poke with the window off wrote the kick eventfd (%d)", n)
			}
			p.kickedAwake(ei)
		})
	}
}

// TestSleepSeesForgottenKick: RawConn.Read forgets the poller's readiness before its
// first callback, so a kick whose event arrived between Wait's last look at avail->idx
// and the park would be lost; the first callback looks at avail->idx once more. Here
// the chain is posted with no kick at all, which is the lost kick at its worst: sleep
// must return at once, count no kick, and park when nothing moved.
func TestSleepSeesForgottenKick(t *testing.T) {
	p := newPWRing(t, featsDefault)
	v := p.v
	v.mu.Lock()
	v.split.waitAt, v.waitWatch = v.split.lastAvail, true
	rc := v.kickRC
	v.mu.Unlock()
	v.kickWoke = false
	if v.awaitKickFd(0) {
		t.Fatal("nothing posted, yet the first look would not park")
	}
	k0 := v.stats.Kicks.Load()
	p.post()
	inBackground(t, "sleep after a chain posted with its kick lost", func() {
		if err := v.sleep(rc, false); err != nil {
			t.Errorf("sleep: %v", err)
		}
	})
	if k := v.stats.Kicks.Load(); k != k0 {
		t.Fatalf("kicks %d -> %d: no kick came", k0, k)
	}
	p.take()
}
