package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/sirupsen/logrus"
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

// engineLogger is the Logger of packages datapath and ops on logrus: key/value pairs become fields.
type engineLogger struct{ l *logrus.Logger }

func (e engineLogger) entry(kv []any) *logrus.Entry {
	f := make(logrus.Fields, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		k, _ := kv[i].(string)
		if k == "error" {
			k = logrus.ErrorKey
		}
		f[k] = kv[i+1]
	}
	return e.l.WithFields(f)
}

func (e engineLogger) Debug(msg string, kv ...any) { e.entry(kv).Debug(msg) }
func (e engineLogger) Info(msg string, kv ...any)  { e.entry(kv).Info(msg) }
func (e engineLogger) Warn(msg string, kv ...any)  { e.entry(kv).Warn(msg) }
