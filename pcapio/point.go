package pcapio

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Point is one place where frames can be captured, switched at run time (`tapgro ctl
// pcap`): its live Writer, nil while off, and counters that outlive every Writer it has
// had. A datapath goroutine loads the Writer once per batch (one atomic load while off)
// and writes to it; Set swaps it and closes the old one, so a frame being written into
// the old Writer meanwhile is counted as dropped, never lost silently.
type Point struct {
	mu    sync.Mutex // one switch at a time
	w     atomic.Pointer[Writer]
	stats Stats
}

// Writer is the live Writer, nil while capture is off.
func (p *Point) Writer() *Writer { return p.w.Load() }

// Stats are the point's counters, across every file it has written.
func (p *Point) Stats() *Stats { return &p.stats }

// Set starts capture into path with opt, moves it to path, or stops it (path "").
func (p *Point) Set(path string, opt Options) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var nw *Writer
	if path != "" {
		var err error
		if nw, err = Create(path, opt, &p.stats); err != nil {
			return err
		}
	}
	if old := p.w.Swap(nw); old != nil {
		return old.Close()
	}
	return nil
}

// Reopen is SIGHUP's: the live capture rotates (or restarts after logrotate moved it).
func (p *Point) Reopen() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if w := p.w.Load(); w != nil {
		return w.Reopen()
	}
	return nil
}

// Describe is the point's state in words: "off", or the file and its counts, and why
// it stopped if it did.
func (p *Point) Describe() string {
	w := p.w.Load()
	if w == nil {
		return "off"
	}
	msg := fmt.Sprintf("%s (%d frames, %d dropped)", w.Path(), p.stats.Frames.Load(), p.stats.Dropped.Load())
	if err := w.Err(); err != nil {
		msg += " stopped: " + err.Error()
	}
	return msg
}
