package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"tapgro/datapath/datapathtest"
	"tapgro/netdev"
	"tapgro/ops"
)

// A client connecting and closing in a loop while a peer is served costs a bounded
// number of log lines, not one per connection: the first refusal is logged with the
// client's identity, and the rest appear only as a count in the periodic problem report
// (and in tapgro_port_rejects_total).
func TestRejectedClientsRateLimited(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.TraceLevel)
	sp, err := netdev.ParseSpec("stream,server=on,addr.type=inet,addr.host=127.0.0.1,addr.port=0")
	if err != nil {
		t.Fatal(err)
	}
	ep, err := netdev.Open(sp, supervisorEvents(log))
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// The problem report, from before the burst to after it: its first reading is the
	// baseline, the next waits for the burst to be over, so one report covers all of it.
	e := datapathtest.NewStub()
	burst := make(chan struct{})
	baseline := make(chan struct{}) // closed once the first reading is taken
	readings := 0
	read := func() map[string]uint64 {
		if readings++; readings > 1 {
			<-burst
		}
		m := ops.ProblemCounts(e.Snapshot(), ops.PortProblems(ep.Stats()))
		if readings == 1 {
			close(baseline)
		}
		return m
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ops.ReportProblems(rctx, time.Millisecond, read, engineLogger{log})
	}()

	c1, err := net.Dial("tcp", ep.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	p1, err := ep.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()

	// The reporter's goroutine may start late: the baseline must come before the burst,
	// or part of the burst hides in it.
	<-baseline
	const extra = 200
	for i := 0; i < extra; i++ {
		c, err := net.Dial("tcp", ep.Addr())
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	for ep.Stats().Rejects.Load() < extra {
		if ctx.Err() != nil {
			t.Fatalf("Rejects = %d, want %d", ep.Stats().Rejects.Load(), extra)
		}
		time.Sleep(time.Millisecond)
	}
	close(burst)
	// Wait for the report that covers the burst (checked below), then stop the reporter.
	for wait := time.Now().Add(5 * time.Second); time.Now().Before(wait); time.Sleep(time.Millisecond) {
		if hasEntry(hook, func(e *logrus.Entry) bool { return e.Data["port_rejected_clients"] != nil }) {
			break
		}
	}
	stop()
	<-done

	if got := ep.Stats().Rejects.Load(); got != extra {
		t.Errorf("Rejects = %d, want %d", got, extra)
	}
	var lines []string
	var counted uint64
	for _, e := range hook.AllEntries() {
		n, _ := e.Data["port_rejected_clients"].(uint64)
		if n == 0 && !strings.Contains(e.Message, "client") {
			continue
		}
		counted += n
		s, _ := e.String()
		lines = append(lines, s)
	}
	if len(lines) > 2 {
		t.Errorf("%d log lines about rejected clients, want at most 2; the first ones:\n%s",
			len(lines), strings.Join(lines[:min(len(lines), 5)], ""))
	}
	if counted != extra {
		t.Errorf("the problem report counted %d rejected clients, want %d; lines:\n%s", counted, extra, strings.Join(lines, ""))
	}
	t.Logf("log lines:\n%s", strings.Join(lines, ""))
}

func hasEntry(hook *logtest.Hook, match func(*logrus.Entry) bool) bool {
	for _, e := range hook.AllEntries() {
		if match(e) {
			return true
		}
	}
	return false
}
