package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"tapgro/datapath"
	"tapgro/netdev"
	"tapgro/rxpool"
)

// Lifecycle beyond start and stop: SIGHUP reopens files (logrotate moves the log away
// and sends SIGHUP; the capture writer will register here too), and per-packet problems
// are reported at most once per interval with their counts, never per packet.

// logFile is a --log-file that can be reopened under a writer the logger keeps.
type logFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

func openLogFile(path string) (*logFile, error) {
	l := &logFile{path: path}
	if err := l.reopen(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Write(p)
}

// reopen opens the path afresh and swaps it in; on failure the old file stays in use
// (after --user, the account may not be allowed to create the file: see dropPrivileges).
func (l *logFile) reopen() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("--log-file: %w", err)
	}
	l.mu.Lock()
	old := l.f
	l.f = f
	l.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// reopeners are the things SIGHUP reopens, in order.
type reopeners struct {
	mu  sync.Mutex
	fns []reopenFunc
}

type reopenFunc struct {
	what string
	fn   func() error
}

// add registers fn under a name for the log line.
func (r *reopeners) add(what string, fn func() error) {
	r.mu.Lock()
	r.fns = append(r.fns, reopenFunc{what, fn})
	r.mu.Unlock()
}

// reopenAll runs every reopener and logs each result.
func (r *reopeners) reopenAll(log *logrus.Logger) {
	r.mu.Lock()
	fns := append([]reopenFunc(nil), r.fns...)
	r.mu.Unlock()
	if len(fns) == 0 {
		log.Info("SIGHUP: nothing to reopen")
		return
	}
	for _, f := range fns {
		if err := f.fn(); err != nil {
			log.WithError(err).WithField("what", f.what).Error("SIGHUP: reopen failed; still writing to the old file")
			continue
		}
		log.WithField("what", f.what).Info("SIGHUP: reopened")
	}
}

// hupReopeners is the process's SIGHUP list.
var hupReopeners reopeners

// handleSIGHUP reopens on every SIGHUP until ctx ends. It is installed before anything
// is opened, so a SIGHUP during start-up cannot kill tapgro (its default action).
func handleSIGHUP(ctx context.Context, log *logrus.Logger) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				hupReopeners.reopenAll(log)
			}
		}
	}()
}

// logOutput is where the log goes: stderr, or --log-file registered for SIGHUP.
func logOutput(o *options, stderr io.Writer) (io.Writer, error) {
	if o.logFile == "" {
		return stderr, nil
	}
	lf, err := openLogFile(o.logFile)
	if err != nil {
		return nil, err
	}
	hupReopeners.add("log "+o.logFile, lf.reopen)
	return lf, nil
}

// problemCounts names every per-packet problem counter ("direction/reason") with its
// value in snap. The port's own counters come from portStats, nil before a port exists.
func problemCounts(snap datapath.Snapshot, ps portProblemStats) map[string]uint64 {
	m := map[string]uint64{}
	for _, d := range []struct {
		dir string
		st  *datapath.Dir
	}{{"tap_to_port", &snap.TapToPort}, {"port_to_tap", &snap.PortToTap}} {
		for r := datapath.Drop(0); r < datapath.NumDrops; r++ {
			m[d.dir+"/"+r.String()] = d.st.Drops[r]
		}
	}
	for d := rxpool.Drop(0); d < rxpool.NumDrops; d++ {
		m["rx_pool/"+d.String()] = snap.Pool.Drops[d].Load()
	}
	m["port_to_tap/gso_write_fallback"] = snap.PortToTap.GSOFallback
	if ps != nil {
		for k, v := range ps() {
			m["port/"+k] = v
		}
	}
	return m
}

// portProblemStats returns the port's error counters by reason.
type portProblemStats func() map[string]uint64

// problemDeltas is what grew between two readings, as log fields; nil when nothing did.
func problemDeltas(prev, cur map[string]uint64) logrus.Fields {
	var f logrus.Fields
	keys := make([]string, 0, len(cur))
	for k := range cur {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if cur[k] > prev[k] {
			if f == nil {
				f = logrus.Fields{}
			}
			f[strings.ReplaceAll(k, "/", "_")] = cur[k] - prev[k]
		}
	}
	return f
}

// reportProblems logs, at most once per interval and only when something changed, how
// many frames each per-packet problem cost since the last report. Counters are the
// truth (/metrics); this line is for whoever reads only the log.
func reportProblems(ctx context.Context, every time.Duration, read func() map[string]uint64, log *logrus.Logger) {
	prev := read()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cur := read()
			if f := problemDeltas(prev, cur); f != nil {
				log.WithFields(f).WithField("interval", every).Warn("frames dropped or refused since the last report (counts; see /metrics for totals)")
			}
			prev = cur
		}
	}
}

// problemInterval is the shortest time between two reports of per-packet problems.
const problemInterval = 10 * time.Second

// portProblems reads the port's per-frame error counters (port.Stats).
func portProblems(ep netdev.Endpoint) portProblemStats {
	ps := ep.Stats()
	return func() map[string]uint64 {
		return map[string]uint64{
			"bad_length":        ps.BadLength.Load(),
			"truncated":         ps.Truncated.Load(),
			"short_datagram":    ps.ShortDatagram.Load(),
			"oversize_datagram": ps.OversizeDatagram.Load(),
			"send_refused":      ps.SendDrops.Load(),
			"rejected_clients":  ps.Rejects.Load(),
		}
	}
}
