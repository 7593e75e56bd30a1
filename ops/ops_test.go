package ops

import (
	"context"
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"tapgro/datapath"
	"tapgro/datapath/datapathtest"
	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/vhostnet"
	"tapgro/vhostuser"
)

// stubPort is a connected port for the health monitor: a peer name and a receive queue.
type stubPort struct {
	port.Port
	inq int
}

func (p *stubPort) Peer() string                           { return "unix:/run/t.sock pid=1 uid=0 gid=0" }
func (p *stubPort) InQueue() (int, error)                  { return p.inq, nil }
func (p *stubPort) ReadBatch([][]byte, []int) (int, error) { return 0, io.EOF }

// TestHealthStall drives the monitor with its own clock: healthy while idle or moving,
// 503 with a reason once work has waited --health-stall without progress, healthy again
// as soon as it moves.
func TestHealthStall(t *testing.T) {
	e := datapathtest.NewStub()
	h := NewHealthMonitor(engineDatapath(e), 5*time.Second)
	get := func() (int, string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
		return w.Code, w.Body.String()
	}
	t0 := time.Unix(1000, 0)
	h.sample(t0)
	if code, body := get(); code != 200 || body != "ok\n" {
		t.Fatalf("idle: %d %q", code, body)
	}

	// Frames queued in the pool but no peer: nothing can be stalled on a port that is
	// not there (the TAP→port pipeline drops them as no_peer).
	e.Snap.Pool.InUse.Store(7)
	h.sample(t0.Add(time.Minute))
	if code, _ := get(); code != 200 {
		t.Fatalf("no peer: %d", code)
	}

	e.Snap.Connected, e.Snap.PeerUnread = true, 0
	h.sample(t0.Add(61 * time.Second)) // work appears: the wait starts now
	h.sample(t0.Add(64 * time.Second))
	if code, _ := get(); code != 200 {
		t.Fatalf("queued for 3s of 5: %d", code)
	}
	h.sample(t0.Add(66 * time.Second))
	code, body := get()
	if code != 503 || !strings.Contains(body, "tap_to_port stalled: 7 receive-pool buffers queued") {
		t.Fatalf("queued for 5s: %d %q", code, body)
	}
	e.Snap.Pool.FramesSent.Add(1) // the port took a frame
	h.sample(t0.Add(67 * time.Second))
	if code, _ := get(); code != 200 {
		t.Fatalf("after progress: %d", code)
	}
	e.Snap.Pool.InUse.Store(0)

	// port→TAP: bytes wait on the socket and nothing is read.
	e.Snap.PeerUnread = 1500
	h.sample(t0.Add(70 * time.Second))
	h.sample(t0.Add(80 * time.Second))
	code, body = get()
	if code != 503 || !strings.Contains(body, "port_to_tap stalled: 1500 bytes unread on the port and no progress for 10s") {
		t.Fatalf("unread port: %d %q", code, body)
	}
	if !h.stalled(dirPortToTap) || h.stalled(dirTapToPort) {
		t.Errorf("stalled flags wrong")
	}
	e.Snap.PortToTap.Reads += 3
	h.sample(t0.Add(81 * time.Second))
	if code, _ := get(); code != 200 {
		t.Fatalf("after reads: %d", code)
	}
}

// TestVhostHealthStall: on a vhost-user port, a guest that stops posting receive
// buffers while frames wait in the TAP is a stall; a frame reaching the guest (or
// being dropped) ends it; and a TX wait for the TAP is watched the same way.
func TestVhostHealthStall(t *testing.T) {
	st := &vhostnet.Stats{Queues: make([]vhostnet.QueueStats, 1)}
	h := NewHealthMonitor(vhostDatapath(st), 5*time.Second)
	get := func() (int, string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
		return w.Code, w.Body.String()
	}
	t0 := time.Unix(1000, 0)
	h.sample(t0)
	st.Queues[0].RXWaiting.Store(true)
	h.sample(t0.Add(time.Second))
	h.sample(t0.Add(4 * time.Second))
	if code, _ := get(); code != 200 {
		t.Fatalf("waited 3s of 5: %d", code)
	}
	h.sample(t0.Add(7 * time.Second))
	if code, body := get(); code != 503 || !strings.Contains(body, "tap_to_port stalled: frames wait in the TAP and the guest posts no receive buffers and no progress for 6s") {
		t.Fatalf("waited 6s: %d %q", code, body)
	}
	st.Drops[vhostnet.DropRXTruncated].Add(1) // a frame dropped is progress too
	h.sample(t0.Add(8 * time.Second))
	if code, _ := get(); code != 200 {
		t.Fatalf("after a drop: %d", code)
	}
	st.Queues[0].RXWaiting.Store(false)
	st.Queues[0].TXWaiting.Store(true)
	h.sample(t0.Add(9 * time.Second))
	st.Drops[vhostnet.DropRXTruncated].Add(1) // RX progress does not count for TX
	h.sample(t0.Add(15 * time.Second))
	if code, body := get(); code != 503 || !strings.Contains(body, "port_to_tap stalled") {
		t.Fatalf("TX waited 6s: %d %q", code, body)
	}
	st.Queues[0].TXFrames.Add(1)
	h.sample(t0.Add(16 * time.Second))
	if code, _ := get(); code != 200 {
		t.Fatalf("after a TX frame: %d", code)
	}
}

// TestVhostHealthPerPair: with two queue pairs, a guest that stops refilling one
// pair's receive ring is a stall even while the other pair moves frames.
func TestVhostHealthPerPair(t *testing.T) {
	st := &vhostnet.Stats{Queues: make([]vhostnet.QueueStats, 2)}
	h := NewHealthMonitor(vhostDatapath(st), 5*time.Second)
	t0 := time.Unix(1000, 0)
	h.sample(t0)
	st.Queues[1].RXWaiting.Store(true)
	for s := 1; s <= 7; s++ {
		st.Queues[0].RXFrames.Add(100) // pair 0 keeps delivering
		h.sample(t0.Add(time.Duration(s) * time.Second))
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
	if body := w.Body.String(); w.Code != 503 || !strings.Contains(body, "tap_to_port (queue pair 1) stalled") || strings.Contains(body, "pair 0") {
		t.Fatalf("one pair stalled: %d %q", w.Code, body)
	}
	if !h.stalled(dirTapToPort) || h.stalled(dirPortToTap) {
		t.Error("tapgro_stalled{direction} does not follow the stalled pair")
	}
	st.Queues[1].RXFrames.Add(1)
	h.sample(t0.Add(8 * time.Second))
	if h.stalled(dirTapToPort) {
		t.Error("still stalled after pair 1 delivered a frame")
	}
}

// The health metrics are documented like every other (TestMetricsDocumented's rule),
// and the peer shows up as an info gauge while connected.
func TestHealthMetricsDocumented(t *testing.T) {
	e := datapathtest.NewStub()
	e.Snap.Connected, e.Snap.Peer = true, "unix:/run/t.sock pid=1 uid=0 gid=0"
	dp := engineDatapath(e)
	c := NewMetrics(dp, NewHealthMonitor(dp, time.Second), "t")
	readme, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	c.Collect(func(s *Sample) {
		names[s.Name] = true
		if !strings.Contains(string(readme), "`"+s.Name+"`") {
			t.Errorf("metric %s is not documented in docs/metrics.md", s.Name)
		}
		if s.Name == "tapgro_port_peer_info" && (len(s.LabelValues) != 1 || s.LabelValues[0] != e.Snap.Peer) {
			t.Errorf("peer labels %q", s.LabelValues)
		}
	})
	if !names["tapgro_port_peer_info"] || !names["tapgro_stalled"] {
		t.Errorf("families %v", names)
	}
}

func TestProblemDeltas(t *testing.T) {
	e := datapathtest.NewStub()
	prev := ProblemCounts(e.Snapshot(), nil)
	if f := problemDeltas(prev, ProblemCounts(e.Snapshot(), nil)); f != nil {
		t.Fatalf("nothing changed, got %v", f)
	}
	e.Snap.TapToPort.Drops[datapath.DropNoPeer] += 5
	e.Snap.Pool.Drops[rxpool.DropTooBig].Add(2)
	ps := func() map[string]uint64 { return map[string]uint64{"bad_length": 1} }
	f := problemDeltas(prev, ProblemCounts(e.Snapshot(), ps))
	want := map[string]uint64{"tap_to_port_no_peer": 5, "rx_pool_too_big": 2, "port_bad_length": 1}
	if len(f) != len(want) {
		t.Fatalf("deltas %v, want %v", f, want)
	}
	for k, v := range want {
		if f[k] != v {
			t.Errorf("%s = %v, want %v", k, f[k], v)
		}
	}
}

// TestReportProblems runs the reporter with a short interval: one warning with the
// counts after a change, none while nothing changes.
func TestReportProblems(t *testing.T) {
	log := &recLogger{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	counts := make(chan map[string]uint64)
	go func() {
		defer close(done)
		ReportProblems(ctx, time.Millisecond, func() map[string]uint64 { return <-counts }, log)
	}()
	counts <- map[string]uint64{"x/y": 0} // initial reading
	counts <- map[string]uint64{"x/y": 0} // tick: unchanged
	counts <- map[string]uint64{"x/y": 4} // tick: +4
	counts <- map[string]uint64{"x/y": 4} // tick: unchanged; orders the log write above before us
	cancel()
	select { // a reader may be waiting for one more tick
	case counts <- map[string]uint64{"x/y": 4}:
	case <-done:
	}
	<-done
	entries := log.all()
	if len(entries) != 1 || entries[0].level != "warn" || entries[0].field("x_y") != uint64(4) {
		t.Fatalf("log entries %v, want one warning with x_y=4", entries)
	}
}

// recLogger records what it is told (and, with t set, logs it to the test).
type recLogger struct {
	t       testing.TB
	mu      sync.Mutex
	entries []logEntry
}

type logEntry struct {
	level, msg string
	kv         []any
}

func (e logEntry) field(k string) any {
	for i := 0; i+1 < len(e.kv); i += 2 {
		if e.kv[i] == k {
			return e.kv[i+1]
		}
	}
	return nil
}

func (l *recLogger) log(level, msg string, kv []any) {
	l.mu.Lock()
	l.entries = append(l.entries, logEntry{level, msg, kv})
	l.mu.Unlock()
	if l.t != nil {
		l.t.Log(level, msg, kv)
	}
}

func (l *recLogger) all() []logEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]logEntry(nil), l.entries...)
}

func (l *recLogger) Debug(msg string, kv ...any) { l.log("debug", msg, kv) }
func (l *recLogger) Info(msg string, kv ...any)  { l.log("info", msg, kv) }
func (l *recLogger) Warn(msg string, kv ...any)  { l.log("warn", msg, kv) }

// TestVhostProblems: the problem report reads a vhost-user datapath too — its drops
// by direction and reason, the chains the guest broke, log pages beyond the log.
func TestVhostProblems(t *testing.T) {
	f := &fakeVhost{st: new(vhostnet.Stats)}
	dp := VhostDatapath(f, "tg0", "unix:/test.sock")
	read := Problems(dp)
	prev := read()
	if d := problemDeltas(prev, read()); d != nil {
		t.Fatalf("nothing changed, got %v", d)
	}
	f.st.Drops[0].Add(3)
	f.bs.Rejected[vhostuser.RejectLoop].Add(1)
	f.bs.LogBeyond.Add(2)
	d := problemDeltas(prev, read())
	want := map[string]uint64{
		vhostnet.Drop(0).Dir() + "_" + vhostnet.Drop(0).String(): 3,
		"ring_loop":  1,
		"log_beyond": 2,
	}
	if len(d) != len(want) {
		t.Fatalf("deltas %v, want %v", d, want)
	}
	for k, v := range want {
		if d[k] != v {
			t.Errorf("%s = %v, want %v", k, d[k], v)
		}
	}
}
