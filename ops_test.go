package main

import (
	"context"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"tapgro/datapath"
	"tapgro/port"
	"tapgro/rxpool"
)

// Flags of the operations side: security defaults, privilege drop, log file, health.
func TestParseFlagsOps(t *testing.T) {
	const unixND = "--netdev=stream,server=on,addr.type=unix,addr.path=/tmp/t.sock"
	good := []struct {
		name  string
		args  []string
		check func(*testing.T, *options)
	}{
		{"defaults", []string{"--tap", "t0", unixND}, func(t *testing.T, o *options) {
			if o.socketMode != 0o600 || o.socketGroup != 0 || o.user != nil || o.logFile != "" || o.healthStall != 10*time.Second {
				t.Errorf("defaults: mode %o group %d user %v log %q stall %v", o.socketMode, o.socketGroup, o.user, o.logFile, o.healthStall)
			}
		}},
		{"socket mode and group", []string{"--tap", "t0", unixND, "--socket-mode", "0660", "--socket-group", "65534"}, func(t *testing.T, o *options) {
			if o.socketMode != 0o660 || o.socketGroup != 65534 {
				t.Errorf("mode %o group %d", o.socketMode, o.socketGroup)
			}
		}},
		{"user nobody", []string{"--tap", "t0", unixND, "--user", "nobody"}, func(t *testing.T, o *options) {
			if o.user == nil || o.user.uid != 65534 || o.user.name != "nobody" {
				t.Errorf("user %v", o.user)
			}
		}},
		{"numeric user with group", []string{"--tap", "t0", unixND, "--user", "4242", "--group", "4243"}, func(t *testing.T, o *options) {
			if o.user == nil || o.user.uid != 4242 || o.user.gid != 4243 {
				t.Errorf("user %v", o.user)
			}
		}},
		{"loopback tcp listen", []string{"--tap", "t0", "--netdev", "socket,listen=127.0.0.1:5000"}, nil},
		{"localhost stream listen", []string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=inet,addr.host=localhost,addr.port=5000"}, nil},
		{"remote listen allowed", []string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=inet,addr.host=0.0.0.0,addr.port=5000", "--allow-remote"}, nil},
		{"remote dial needs nothing", []string{"--tap", "t0", "--netdev", "socket,connect=198.18.0.9:5000"}, nil},
		{"inherited fd", []string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=fd,addr.str=3"}, nil},
		{"log file", []string{"--tap", "t0", unixND, "--log-file", "/tmp/x.log", "--health-stall", "3s"}, func(t *testing.T, o *options) {
			if o.logFile != "/tmp/x.log" || o.healthStall != 3*time.Second {
				t.Errorf("log %q stall %v", o.logFile, o.healthStall)
			}
		}},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
	bad := []struct {
		args []string
		msg  string
	}{
		{[]string{"--tap", "t0", "--netdev", "socket,listen=198.18.0.1:5000"}, "not a loopback address; add --allow-remote"},
		{[]string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=inet,addr.host=0.0.0.0,addr.port=5000"}, "not a loopback address"},
		{[]string{"--tap", "t0", "--netdev", "stream,server=on,addr.type=inet,addr.host=::,addr.port=5000"}, "not a loopback address"},
		{[]string{"--tap", "t0", "--netdev", "dgram,local.type=inet,local.host=198.18.0.1,local.port=1,remote.type=inet,remote.host=198.18.0.2,remote.port=2"}, "not a loopback address"},
		{[]string{"--tap", "t0", "--netdev", "socket,udp=198.18.0.2:2,localaddr=198.18.0.1:1"}, "not a loopback address"},
		{[]string{"--tap", "t0", unixND, "--socket-mode", "0400"}, "owner read-write"},
		{[]string{"--tap", "t0", unixND, "--socket-mode", "0777"}, "no execute bits"},
		{[]string{"--tap", "t0", unixND, "--socket-mode", "rw"}, "octal"},
		{[]string{"--tap", "t0", unixND, "--socket-group", "no-such-group-xyz"}, "--socket-group"},
		{[]string{"--tap", "t0", unixND, "--user", "no-such-user-xyz"}, "--user"},
		{[]string{"--tap", "t0", unixND, "--user", "root"}, "nothing to drop"},
		{[]string{"--tap", "t0", unixND, "--group", "nogroup"}, "--group needs --user"},
		{[]string{"--tap", "t0", unixND, "--user", "4242"}, "add --group"},
		{[]string{"--tap", "t0", unixND, "--health-stall", "10ms"}, "at least 1s"},
		{[]string{"--tap", "t0", "--netdev", "stream,addr.type=fd,addr.str=2"}, "file descriptor number >= 3"},
	}
	for _, tc := range bad {
		_, err := parseFlags(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.msg)
		}
	}
}

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
	e := newStubEngine()
	h := newHealthMon(e, 5*time.Second)
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
	e.snap.Pool.InUse.Store(7)
	h.sample(t0.Add(time.Minute))
	if code, _ := get(); code != 200 {
		t.Fatalf("no peer: %d", code)
	}

	e.snap.Connected, e.snap.PeerUnread = true, 0
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
	e.snap.Pool.FramesSent.Add(1) // the port took a frame
	h.sample(t0.Add(67 * time.Second))
	if code, _ := get(); code != 200 {
		t.Fatalf("after progress: %d", code)
	}
	e.snap.Pool.InUse.Store(0)

	// port→TAP: bytes wait on the socket and nothing is read.
	e.snap.PeerUnread = 1500
	h.sample(t0.Add(70 * time.Second))
	h.sample(t0.Add(80 * time.Second))
	code, body = get()
	if code != 503 || !strings.Contains(body, "port_to_tap stalled: 1500 bytes unread on the port and no progress for 10s") {
		t.Fatalf("unread port: %d %q", code, body)
	}
	if !h.stalled(dirPortToTap) || h.stalled(dirTapToPort) {
		t.Errorf("stalled flags wrong")
	}
	e.snap.PortToTap.Reads += 3
	h.sample(t0.Add(81 * time.Second))
	if code, _ := get(); code != 200 {
		t.Fatalf("after reads: %d", code)
	}
}

// The health metrics are documented like every other (TestMetricsDocumented's rule),
// and the peer shows up as an info gauge while connected.
func TestHealthMetricsDocumented(t *testing.T) {
	e := newStubEngine()
	e.snap.Connected, e.snap.Peer = true, "unix:/run/t.sock pid=1 uid=0 gid=0"
	h := newHealthMon(e, time.Second)
	c := &collector{eng: e}
	addHealthMetrics(c, h)
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	readme, _ := os.ReadFile("README.md")
	names := map[string]bool{}
	for _, f := range fams {
		names[f.GetName()] = true
		if !strings.Contains(string(readme), "`"+f.GetName()+"`") {
			t.Errorf("metric %s is not documented in README.md", f.GetName())
		}
		if f.GetName() == "tapgro_port_peer_info" {
			if l := f.GetMetric()[0].GetLabel()[0]; l.GetValue() != (&stubPort{}).Peer() {
				t.Errorf("peer label %q", l.GetValue())
			}
		}
	}
	if !names["tapgro_port_peer_info"] || !names["tapgro_stalled"] {
		t.Errorf("families %v", names)
	}
}

func TestProblemDeltas(t *testing.T) {
	e := newStubEngine()
	prev := problemCounts(e.Snapshot(), nil)
	if f := problemDeltas(prev, problemCounts(e.Snapshot(), nil)); f != nil {
		t.Fatalf("nothing changed, got %v", f)
	}
	e.snap.TapToPort.Drops[datapath.DropNoPeer] += 5
	e.snap.Pool.Drops[rxpool.DropTooBig].Add(2)
	ps := func() map[string]uint64 { return map[string]uint64{"bad_length": 1} }
	f := problemDeltas(prev, problemCounts(e.Snapshot(), ps))
	want := logrus.Fields{"tap_to_port_no_peer": uint64(5), "rx_pool_too_big": uint64(2), "port_bad_length": uint64(1)}
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
	log, hook := logtest.NewNullLogger()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	counts := make(chan map[string]uint64)
	go func() {
		defer close(done)
		reportProblems(ctx, time.Millisecond, func() map[string]uint64 { return <-counts }, log)
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
	entries := hook.AllEntries()
	if len(entries) != 1 || entries[0].Level != logrus.WarnLevel || entries[0].Data["x_y"] != uint64(4) {
		t.Fatalf("log entries %v, want one warning with x_y=4", entries)
	}
}

func TestLogFileReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.log")
	o := &options{logFile: path, logLevel: logrus.InfoLevel, logFormat: "text"}
	hupReopeners = reopeners{}
	out, err := logOutput(o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	log := newLogger(o, out)
	log.Info("first")
	if err := os.Rename(path, path+".1"); err != nil { // what logrotate does
		t.Fatal(err)
	}
	log.Info("second, still to the moved file")
	hupReopeners.reopenAll(log)
	log.Info("third")
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	if !strings.Contains(string(old), "first") || !strings.Contains(string(old), "second") || strings.Contains(string(old), "third") {
		t.Errorf("rotated file:\n%s", old)
	}
	if !strings.Contains(string(cur), "SIGHUP: reopened") || !strings.Contains(string(cur), "third") {
		t.Errorf("new file:\n%s", cur)
	}
}
