// Package quietlog keeps the lines a peer can make tapgro log from flooding the log.
//
// A front-end decides when tapgro sees a SET_FEATURES, an MTU, a RARP request, a
// connection or a broken ring, and a hostile or looping one can send them thousands of
// times a second; each is worth a line the first time, and again when it changes, but
// not at the peer's rate. A Gate lets a line through when its key differs from the last
// one let through (at most one a MinGap), or when Every has passed since that one, and
// counts the lines it held back, so the next line can say how many were left out.
// Nothing is lost from the counters: a Gate only decides what is written as text.
package quietlog

import (
	"sync"
	"time"
)

// Defaults for a Gate whose fields are zero.
const (
	DefaultMinGap = time.Second
	DefaultEvery  = 10 * time.Second
)

// Gate decides which of a stream of lines to write. The zero value is ready, with the
// defaults above; a Gate is safe for concurrent use.
type Gate struct {
	MinGap time.Duration // least time between two lines let through
	Every  time.Duration // a line with an unchanged key goes through again after this

	mu   sync.Mutex
	last string
	at   time.Time
	held int
	used bool
}

// Pass reports whether the line with key should be written now, and how many lines were
// held back since the last one that was.
func (g *Gate) Pass(key string) (ok bool, held int) {
	return g.passAt(key, time.Now())
}

func (g *Gate) passAt(key string, now time.Time) (bool, int) {
	minGap, every := g.MinGap, g.Every
	if minGap == 0 {
		minGap = DefaultMinGap
	}
	if every == 0 {
		every = DefaultEvery
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	since := now.Sub(g.at)
	if g.used && !(key != g.last && since >= minGap) && since < every {
		g.held++
		return false, 0
	}
	held := g.held
	g.last, g.at, g.held, g.used = key, now, 0, true
	return true, held
}
