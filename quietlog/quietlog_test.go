package quietlog

import (
	"testing"
	"time"
)

func TestGate(t *testing.T) {
	var g Gate
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at       time.Duration
		key      string
		ok       bool
		heldBack int
	}{
		{0, "a", true, 0},                      // the first line
		{10 * time.Millisecond, "a", false, 0}, // the same, at once
		{20 * time.Millisecond, "b", false, 0}, // changed, but within MinGap
		{time.Second + 20*time.Millisecond, "b", true, 2},
		{2 * time.Second, "b", false, 0}, // unchanged: waits for Every
		{3*time.Second + 30*time.Millisecond, "c", true, 1},
		{14 * time.Second, "c", true, 0}, // unchanged, Every passed
	}
	for i, s := range steps {
		ok, held := g.passAt(s.key, t0.Add(s.at))
		if ok != s.ok || held != s.heldBack {
			t.Fatalf("step %d (%v %q): %v, %d held; want %v, %d", i, s.at, s.key, ok, held, s.ok, s.heldBack)
		}
	}
}
