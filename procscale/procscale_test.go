package procscale

import (
	"slices"
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	pol := Default(4)
	for _, c := range []struct {
		p        int
		cpu      float64
		parallel bool
		want     int
	}{
		{1, 0.00, false, 1},
		{1, 0.60, false, 1},
		{1, 0.84, false, 1},
		{1, 0.85, false, 2}, // the one P is busy
		{2, 1.60, false, 2}, // two are not yet
		{2, 1.70, false, 3},
		{2, 0.75, false, 2}, // one would have no room
		{2, 0.69, false, 1}, // one would
		{3, 1.39, false, 2},
		{4, 4.00, false, 4}, // Max
		{0, 0.00, false, 1}, // below Min: back to it
		{9, 0.00, false, 4}, // above Max: back to it
		{1, 0.30, true, 2},  // parallel work: at least two
		{2, 0.10, true, 2},
		{3, 0.10, true, 2},
		{2, 1.70, true, 3}, // and more when busy
	} {
		if got := pol.Next(c.p, Load{c.cpu, c.parallel}); got != c.want {
			t.Errorf("Next(%d, %.2f, parallel %v) = %d, want %d", c.p, c.cpu, c.parallel, got, c.want)
		}
	}
}

// A step down lands below the next step up: the same load, costing no more CPU on
// fewer Ps, does not take the count back up.
func TestNoSwing(t *testing.T) {
	pol := Default(64)
	for p := 2; p <= 64; p++ {
		cpu := pol.Down*float64(p-1) - 1e-9 // just low enough to step down from p
		if q := pol.Next(p, Load{CPU: cpu}); q != p-1 {
			t.Fatalf("Next(%d, %.3f) = %d, want %d", p, cpu, q, p-1)
		}
		if q := pol.Next(p-1, Load{CPU: cpu}); q != p-1 {
			t.Errorf("after stepping down to %d at %.3f CPUs: Next = %d, swings back", p-1, cpu, q)
		}
	}
}

// The scaler starts at Min, follows the samples one step per interval, asks about
// parallel work with the time that passed, and tells about each change.
func TestScaler(t *testing.T) {
	var cpu time.Duration
	var par bool
	var set []int
	var told [][2]int
	s := scaler{
		pol:     Default(2),
		cpuTime: func() time.Duration { return cpu },
		set:     func(n int) int { set = append(set, n); return 0 },
		parallel: func(wall time.Duration) bool {
			if wall != time.Second {
				t.Errorf("parallel asked about %v, want 1s", wall)
			}
			return par
		},
		changed: func(from, to int, l Load) { told = append(told, [2]int{from, to}) },
	}
	now := time.Unix(1000, 0)
	s.start(now)
	for _, step := range []struct {
		used     time.Duration
		parallel bool
	}{
		{300 * time.Millisecond, false}, // 0.3 CPU: stays at 1
		{950 * time.Millisecond, false}, // busy: 2
		{1500 * time.Millisecond, false},
		{1900 * time.Millisecond, false}, // Max
		{650 * time.Millisecond, false},  // back to 1
		{200 * time.Millisecond, false},
		{500 * time.Millisecond, true}, // both directions: 2
		{300 * time.Millisecond, true},
		{300 * time.Millisecond, false}, // back to 1
	} {
		now = now.Add(time.Second)
		cpu += step.used
		par = step.parallel
		s.sample(now)
	}
	s.sample(now) // no time passed: no decision
	if want := []int{1, 2, 1, 2, 1}; !slices.Equal(set, want) {
		t.Errorf("GOMAXPROCS set to %v, want %v", set, want)
	}
	if want := [][2]int{{1, 2}, {2, 1}, {1, 2}, {2, 1}}; !slices.Equal(told, want) {
		t.Errorf("changes told: %v, want %v", told, want)
	}
}

// The real clock: CPU time is the process's and moves forward while it works.
func TestCPUTime(t *testing.T) {
	a := cpuTime()
	x := 0
	for i := 0; i < 50_000_000; i++ {
		x += i ^ x>>3
	}
	b := cpuTime()
	if a <= 0 || b <= a {
		t.Errorf("cpuTime %v then %v after a busy loop (%d)", a, b, x)
	}
}
