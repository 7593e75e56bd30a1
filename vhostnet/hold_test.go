//go:build linux

package vhostnet

import (
	"testing"
	"time"
)

// TestHoldTimer: a hold never ends before its length has passed (the clock decides,
// whatever the poller reports), and a timerfd-based hold allocates nothing.
func TestHoldTimer(t *testing.T) {
	const d = 200 * time.Microsecond
	h, err := newHoldTimer(d)
	if err != nil {
		t.Skipf("no timerfd: %v", err)
	}
	defer h.close()
	for i := range 20 {
		start := time.Now()
		h.sleep()
		if el := time.Since(start); el < d {
			t.Fatalf("hold %d ended after %v, before its %v", i, el, d)
		}
	}
	if a := testing.AllocsPerRun(20, h.sleep); a != 0 {
		t.Fatalf("%v allocations per hold, want 0", a)
	}
}

// BenchmarkHoldTimer measures a 100 µs hold end to end: ns/op is how long it really
// lasts on this host (a time.Sleep of the same length, its reference, rounds up to the
// runtime poller's millisecond when the process is otherwise idle).
func BenchmarkHoldTimer(b *testing.B) {
	const d = 100 * time.Microsecond
	b.Run("timerfd", func(b *testing.B) {
		h, err := newHoldTimer(d)
		if err != nil {
			b.Skip(err)
		}
		defer h.close()
		b.ReportAllocs()
		for b.Loop() {
			h.sleep()
		}
	})
	b.Run("time.Sleep", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			time.Sleep(d)
		}
	})
}
