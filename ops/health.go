package ops

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"tapgro/datapath"
	"tapgro/rxpool"
	"tapgro/vhostnet"
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
// On a vhost-user port (NewVhostHealthMonitor) the same question is asked of vhostnet:
//
//   - TAP→guest has work while the RX worker waits for the guest to post receive
//     buffers with frames waiting in the TAP (vhostnet.Stats.RXWaiting); it has moved
//     when a frame reached the guest or was dropped.
//   - guest→TAP has work while the TX worker waits for the TAP to take a frame
//     (TXWaiting); it has moved when a frame was written or dropped.
//
// A guest whose driver stopped refilling its receive ring (hung, or paused with the
// link up) is the stall this catches.
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

// dirHealth is one direction's watch state.
type dirHealth struct {
	progress uint64    // the counter that moves when work gets done
	since    time.Time // when the current wait began (last progress, or work appearing)
	pending  bool
	stalled  string // non-empty (the reason) while stalled
}

type HealthMonitor struct {
	probe func() (pending [numDirs]bool, progress [numDirs]uint64, detail [numDirs]string)
	stall time.Duration

	mu   sync.Mutex
	dirs [numDirs]dirHealth
}

// NewHealthMonitor watches the engine eng.
func NewHealthMonitor(eng Snapshotter, stall time.Duration) *HealthMonitor {
	return &HealthMonitor{probe: func() ([numDirs]bool, [numDirs]uint64, [numDirs]string) { return engineWork(eng) }, stall: stall}
}

// NewVhostHealthMonitor watches a vhost-user datapath's counters st.
func NewVhostHealthMonitor(st *vhostnet.Stats, stall time.Duration) *HealthMonitor {
	return &HealthMonitor{probe: func() ([numDirs]bool, [numDirs]uint64, [numDirs]string) { return vhostWork(st) }, stall: stall}
}

// vhostWork is NewVhostHealthMonitor's probe: each direction's wait flag and the
// counters that move when its work gets done (delivered or dropped).
func vhostWork(st *vhostnet.Stats) (pending [numDirs]bool, progress [numDirs]uint64, detail [numDirs]string) {
	progress[dirTapToPort] = st.RXFrames.Load()
	progress[dirPortToTap] = st.TXFrames.Load()
	for r := 0; r < vhostnet.NumDrops; r++ {
		if vhostnet.DropIsRX(r) {
			progress[dirTapToPort] += st.Drops[r].Load()
		} else {
			progress[dirPortToTap] += st.Drops[r].Load()
		}
	}
	if st.RXWaiting.Load() {
		pending[dirTapToPort] = true
		detail[dirTapToPort] = "frames wait in the TAP and the guest posts no receive buffers"
	}
	if st.TXWaiting.Load() {
		pending[dirPortToTap] = true
		detail[dirPortToTap] = "a guest frame waits for the TAP to take it"
	}
	return
}

// engineWork reads, from one Snapshot, whether each direction has work pending and the
// counter that moves when it gets done.
func engineWork(eng Snapshotter) (pending [numDirs]bool, progress [numDirs]uint64, detail [numDirs]string) {
	snap := eng.Snapshot()
	rs := snap.Pool
	progress[dirTapToPort] = rs.FramesSent.Load() + snap.TapToPort.Drops[datapath.DropPortError]
	for d := rxpool.Drop(0); d < rxpool.NumDrops; d++ {
		progress[dirTapToPort] += rs.Drops[d].Load()
	}
	if inUse := rs.InUse.Load(); snap.Connected && inUse > 0 {
		pending[dirTapToPort] = true
		detail[dirTapToPort] = fmt.Sprintf("%d receive-pool buffers queued for the port", inUse)
	}
	progress[dirPortToTap] = snap.PortToTap.Reads
	if snap.PeerUnread > 0 {
		pending[dirPortToTap] = true
		detail[dirPortToTap] = fmt.Sprintf("%d bytes unread on the port", snap.PeerUnread)
	}
	return
}

func (h *HealthMonitor) sample(now time.Time) {
	pending, progress, detail := h.probe()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := range h.dirs {
		d := &h.dirs[i]
		if !pending[i] || !d.pending || progress[i] != d.progress {
			d.since = now
		}
		d.pending, d.progress = pending[i], progress[i]
		d.stalled = ""
		if pending[i] {
			if waited := now.Sub(d.since); waited >= h.stall {
				d.stalled = fmt.Sprintf("%s stalled: %s and no progress for %v", dirNames[i], detail[i], waited.Round(time.Second))
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

func (h *HealthMonitor) stalled(dir int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dirs[dir].stalled != ""
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
