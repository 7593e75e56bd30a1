package quietlog

import (
	"fmt"
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
		{10 * time.Millisecond, "a", false, 0}, // the same key, at once
		{20 * time.Millisecond, "b", true, 0},  // another key goes through
		{time.Second, "a", false, 0},           // a: waits for Every
		{10*time.Second + time.Millisecond, "a", true, 2},
		{10*time.Second + 30*time.Millisecond, "b", true, 0},
	}
	for i, s := range steps {
		ok, held := g.passAt(s.key, t0.Add(s.at))
		if ok != s.ok || held != s.heldBack {
			t.Fatalf("step %d (%v %q): %v, %d held; want %v, %d", i, s.at, s.key, ok, held, s.ok, s.heldBack)
		}
	}
}

// A peer that varies its lines gets PerSecond of them through a second, no more.
func TestGatePerSecond(t *testing.T) {
	var g Gate
	t0 := time.Unix(1000, 0)
	passed := 0
	for i := range 1000 {
		if ok, _ := g.passAt(fmt.Sprintf("line %c", 'A'+rune(i%50)), t0.Add(time.Duration(i)*time.Millisecond)); ok {
			passed++
		}
	}
	if passed != DefaultPerSecond {
		t.Fatalf("%d lines in a second, want %d", passed, DefaultPerSecond)
	}
}

func TestKey(t *testing.T) {
	if Key("ring 12 broke at 0x7f00") != Key("ring 7 broke at 0x800") {
		t.Fatal("digits decide the key")
	}
	if Key("ring 1 broke") == Key("ring 1 faulted") {
		t.Fatal("words do not")
	}
}
