package ops

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// A daemon that is alive but no longer forwards is the failure users of similar tools
// report most bitterly (containers/gvisor-tap-vsock#648). /healthz therefore
// checks progress, not liveness: once a second the monitor looks at each direction and
// asks "is there work waiting, and has any of it moved?".
//
//   - TAP→port has work while the receive pool holds frames (rxpool.Stats.InUse > 0,
//     which is non-zero only while a flush is waiting for the port); it has moved when
//     the port took a frame or one was dropped (sent, or counted away).
//   - port→TAP has work while the port's socket has unread bytes (SIOCINQ); it has moved
//     when a frame was read from the port.
//
// On a vhost-user port (VhostDatapath) the same question is asked of vhostnet:
//
//   - TAP→guest has work while the RX worker waits for the guest to post receive
//     buffers with frames waiting in the TAP (vhostnet.Stats.RXWaiting); it has moved
//     when a frame reached the guest or was dropped.
//   - guest→TAP has work while the TX worker waits for the TAP to take a frame
//     (TXWaiting); it has moved when a frame was written or dropped.
//
// A guest whose driver stopped refilling its receive ring (hung, or paused with the
// link up) is the stall this catches. With several queue pairs each pair is watched on
// its own (vhostnet.QueueStats): a guest that stops serving one queue while the others
// move stalls the flows hashed to it, and the port's totals would hide that.
//
// A direction with work that has not moved for --health-stall is stalled and /healthz
// answers 503 with the reason. An idle link, or no peer at all, is healthy: waiting for
// QEMU is tapgro's normal state.

const (
	dirTapToPort = iota
	dirPortToTap
	numDirs
)

var dirNames = [numDirs]string{"tap_to_port", "port_to_tap"}

// watch is one thing the monitor watches: a direction of the port, or of one queue
// pair, as the probe reports it.
type watch struct {
	dir      int    // dirTapToPort or dirPortToTap
	name     string // in the 503 body: the direction, and the queue pair if several
	pending  bool
	progress uint64 // the counter that moves when work gets done
	detail   string
}

// dirHealth is one watch's state between samples.
type dirHealth struct {
	progress uint64    // the counter that moves when work gets done
	since    time.Time // when the current wait began (last progress, or work appearing)
	pending  bool
	stalled  string // non-empty (the reason) while stalled
}

type HealthMonitor struct {
	probe func(into []watch) []watch
	stall time.Duration

	mu      sync.Mutex
	watches []watch
	dirs    []dirHealth // one per watch, same order every sample
}

// NewHealthMonitor watches dp's directions (each queue pair's, where it has several).
func NewHealthMonitor(dp Datapath, stall time.Duration) *HealthMonitor {
	return &HealthMonitor{probe: dp.work, stall: stall}
}

func (h *HealthMonitor) sample(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watches = h.probe(h.watches[:0])
	if len(h.dirs) != len(h.watches) {
		h.dirs = make([]dirHealth, len(h.watches)) // the pairs are fixed at start
	}
	for i, w := range h.watches {
		d := &h.dirs[i]
		if !w.pending || !d.pending || w.progress != d.progress {
			d.since = now
		}
		d.pending, d.progress = w.pending, w.progress
		d.stalled = ""
		if w.pending {
			if waited := now.Sub(d.since); waited >= h.stall {
				d.stalled = fmt.Sprintf("%s stalled: %s and no progress for %v", w.name, w.detail, waited.Round(time.Second))
			}
		}
	}
}

// problems lists the stalled directions' reasons; empty means healthy.
func (h *HealthMonitor) problems() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, d := range h.dirs {
		if d.stalled != "" {
			out = append(out, d.stalled)
		}
	}
	return out
}

// stalled reports whether direction dir is stalled (on any queue pair).
func (h *HealthMonitor) stalled(dir int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, d := range h.dirs {
		if d.stalled != "" && h.watches[i].dir == dir {
			return true
		}
	}
	return false
}

// Run samples once a second until ctx ends.
func (h *HealthMonitor) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.sample(now)
		}
	}
}

// ServeHTTP is /healthz: 200 "ok", or 503 with one line per stalled direction.
func (h *HealthMonitor) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if p := h.problems(); len(p) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(strings.Join(p, "\n") + "\n"))
		return
	}
	w.Write([]byte("ok\n"))
}
