//go:build linux

package vhostuser

import (
	"net"
	"sync"
	"testing"
	"time"

	"tapgro/kvlog"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

// The harness of vhostuser's own tests: a Backend configured as vhostnet configures it,
// serving one end of a socketpair to the front-end double (package vhostusertest, which
// plays QEMU 7.2 and the guest driver), and a Handler that records what the session
// reports.

const (
	// memSize is the tests' guest RAM, in vhostusertest's measured two-region layout.
	memSize = 4 << 20

	featsDefault = 1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf | 1<<0 | 1<<1 | 1<<11 | 1<<12 | 1<<13 |
		1<<7 | 1<<8 | 1<<9 | 1<<virtio.NetMTU | 1<<virtio.RingEventIdx | 1<<virtio.RingIndirectDesc
)

// recorder is a Handler that logs what the session reports.
type recorder struct {
	mu      sync.Mutex
	feats   []Features
	started chan *Vring
	stopped []int
	unknown []uint32
	enables []vuproto.VringState // SET_VRING_ENABLE as reported: ring index, 0 or 1
	mtu     int
	ended   chan error
	onStop  func(*Vring)
	onStart func(*Vring)
}

func newRecorder() *recorder {
	return &recorder{started: make(chan *Vring, 64), ended: make(chan error, 1)}
}

func (r *recorder) FeaturesAcked(f Features) {
	r.mu.Lock()
	r.feats = append(r.feats, f)
	r.mu.Unlock()
}
func (r *recorder) RingStarted(q Queue) {
	v := q.(*Vring)
	if r.onStart != nil {
		r.onStart(v)
	}
	r.started <- v
}
func (r *recorder) RingStopping(Queue) {}

func (r *recorder) RingStopped(q Queue) {
	v := q.(*Vring)
	if r.onStop != nil {
		r.onStop(v)
	}
	r.mu.Lock()
	r.stopped = append(r.stopped, v.Index())
	r.mu.Unlock()
}
func (r *recorder) VringEnabled(v Queue, on bool) {
	r.mu.Lock()
	r.enables = append(r.enables, vuproto.VringState{Index: uint32(v.Index()), Num: map[bool]uint32{true: 1}[on]})
	r.mu.Unlock()
}
func (r *recorder) SetMTU(m int) error { r.mu.Lock(); r.mtu = m; r.mu.Unlock(); return nil }
func (r *recorder) Unknown(req uint32, _ int) {
	r.mu.Lock()
	r.unknown = append(r.unknown, req)
	r.mu.Unlock()
}
func (r *recorder) SessionEnded(err error) { r.ended <- err }

// harness is one session: the double's Session (its Frontend, guest RAM and rings)
// against a Backend, and the Vrings the back-end started, by index.
type harness struct {
	*vhostusertest.Session
	b   *Backend
	rec *recorder
	vr  []*Vring
	// done has Serve's result once the session ends, for a test that waits for that
	// without closing; one that reads it puts it back.
	done chan error
}

type opts struct {
	features uint64 // offered; 0 = featsDefault
	ack      uint64 // guest-acked virtio bits; 0 = everything offered
	pairs    int
	num      int
	layout   []vuproto.MemRegion
	stats    *Stats
	guest    *vhostusertest.Guest
	noEnable bool
	skipKick bool
	rec      *recorder // nil: a new one
	logf     func(string, ...any)
	// maxMapped and anyFS are Config.MaxMapped and Config.AnyFSMemory.
	maxMapped uint64
	anyFS     bool
}

// startSession runs QEMU 7.2's sequence (vhostusertest.Start) against a new Backend. The
// rings have no buffer slots: the tests lay out their buffers with Guest.Alloc. Unless
// kicks are skipped, it returns once every ring has started.
func startSession(t testing.TB, o opts) *harness {
	if o.features == 0 {
		o.features = featsDefault
	}
	if o.pairs == 0 {
		o.pairs = 1
	}
	rec := o.rec
	if rec == nil {
		rec = newRecorder()
	}
	b, err := NewBackend(netConfig(Config{Features: o.features, NetMTU: true, Handler: rec, Stats: o.stats, Log: kvlog.Printf(o.logf),
		MaxMapped: o.maxMapped, AnyFSMemory: o.anyFS}, o.pairs))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{b: b, rec: rec, done: make(chan error, 1)}
	serve := func(c *net.UnixConn) error {
		err := b.Serve(c)
		h.done <- err
		return err
	}
	h.Session = vhostusertest.Start(t, serve, vhostusertest.Options{Ack: o.ack, Pairs: o.pairs, Num: o.num,
		MemSize: memSize, Layout: o.layout, Guest: o.guest, TXSlot: -1, RXSlot: -1,
		NoEnable: o.noEnable, SkipKick: o.skipKick})
	if !o.skipKick {
		// Start ends with a GET_FEATURES round trip: every ring that is going to start
		// has started.
		h.vr = make([]*Vring, len(h.Rings))
		for range h.Rings {
			select {
			case v := <-rec.started:
				h.vr[v.Index()] = v
			case <-time.After(5 * time.Second):
				t.Fatal("ring did not start")
			}
		}
	}
	return h
}

// batch runs fn inside Begin/End on v.
func batch(t testing.TB, v *Vring, fn func()) {
	if err := v.Begin(); err != nil {
		t.Fatalf("Begin: %v", err)
	}
	fn()
	v.End()
}

// getFeats and the accessors after it read the recorder under its lock: the session
// goroutine writes it, and the socket ordering between them is invisible to the race
// detector.
func (r *recorder) getFeats() []Features {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Features(nil), r.feats...)
}

func (r *recorder) getStopped() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.stopped...)
}

func (r *recorder) getUnknown() []uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint32(nil), r.unknown...)
}

func (r *recorder) getMTU() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mtu
}

// netConfig completes c as vhostnet configures its Backend for pairs queue pairs: two
// rings a pair, the even ones (RX) written by the device, the 10- or 12-byte virtio-net
// header on every chain, and MQ offered with more than one pair.
func netConfig(c Config, pairs int) Config {
	c.Rings, c.QueueNum = 2*pairs, pairs
	c.Writable = func(i int) bool { return i%2 == 0 }
	c.HeaderLen = func(acked uint64) int {
		if acked&(1<<virtio.Version1|1<<virtio.NetMrgRxbuf) != 0 {
			return 12
		}
		return 10
	}
	if pairs > 1 {
		c.Features |= 1 << virtio.NetMQ
	}
	return c
}

// testMemPolicy is mapMemTable's policy for tests that map files of every kind on
// purpose: the default cap, any filesystem (TestMemoryFilesystem checks that part).
var testMemPolicy = memPolicy{maxBytes: DefaultMaxMapped, anyFS: true}
