package redial

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPolicy: failed attempts back off 100, 200, 400 ms…; a Permanent error and the end
// of ctx stop Dial; a connection that ended within a second makes Pause wait (doubling),
// one that lived longer does not and resets the pause.
func TestPolicy(t *testing.T) {
	var r Policy
	var waits []time.Duration
	rec := func(err error, wait time.Duration) { waits = append(waits, wait) }
	ctx := context.Background()

	n := 0
	errNope := errors.New("nope")
	if err := r.Dial(ctx, func(context.Context) error {
		if n++; n < 4 {
			return errNope
		}
		return nil
	}, rec); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{dialWaitMin, 2 * dialWaitMin, 4 * dialWaitMin}
	if len(waits) != len(want) || waits[0] != want[0] || waits[1] != want[1] || waits[2] != want[2] {
		t.Errorf("Dial waits %v, want %v", waits, want)
	}

	waits = nil
	if err := r.Dial(ctx, func(context.Context) error { return Permanent(errNope) }, rec); err != errNope || len(waits) != 0 {
		t.Errorf("Dial with a Permanent error = %v after %d retries, want %v at once", err, len(waits), errNope)
	}

	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	if err := r.Dial(cctx, func(context.Context) error { return errNope }, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Dial after cancel = %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Dial took %v to notice the cancel", d)
	}

	// Pause: no connection yet, and a long-lived one, return at once.
	waits = nil
	if !r.Pause(ctx, time.Time{}, rec) || !r.Pause(ctx, time.Now().Add(-2*quickConnection), rec) || len(waits) != 0 {
		t.Errorf("Pause waited (%v) with no quick connection", waits)
	}
	for i := 0; i < 2; i++ {
		if !r.Pause(ctx, time.Now(), rec) {
			t.Fatal("Pause = false")
		}
	}
	if len(waits) != 2 || waits[0] != dialWaitMin || waits[1] != 2*dialWaitMin {
		t.Errorf("Pause after quick ends waited %v, want [%v %v]", waits, dialWaitMin, 2*dialWaitMin)
	}
	r.Pause(ctx, time.Now().Add(-2*quickConnection), rec)
	waits = nil
	r.Pause(ctx, time.Now(), rec)
	if len(waits) != 1 || waits[0] != dialWaitMin {
		t.Errorf("after a long connection the pause is %v, want %v again", waits, dialWaitMin)
	}
	cancel()
	if r.Pause(cctx, time.Now(), nil) || r.Pause(cctx, time.Time{}, nil) {
		t.Error("Pause with a cancelled ctx = true")
	}
}
