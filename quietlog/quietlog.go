// Package quietlog keeps the lines a peer can make tapgro log from flooding the log.
//
// A front-end decides when tapgro sees a SET_FEATURES, an MTU, a RARP request, a
// connection or a broken ring, and a hostile or looping one can send them thousands of
// times a second; each is worth a line the first time, and again now and then, but not
// at the peer's rate. A Gate lets a line through the first time its key is seen and
// then at most once per Every, and never more than PerSecond lines a second in all (so
// a peer that varies its keys floods nothing either); it counts the lines it held back
// per key, so the next line of that key can say how many were left out. Keys are
// Key(line) by default: the line with its digits removed, so that the same event with
// another address or count is the same key. Nothing is lost from the counters: a Gate
// only decides what is written as text.
package quietlog

import (
	"strings"
	"sync"
	"time"
)

// Defaults for a Gate whose fields are zero.
const (
	DefaultEvery     = 10 * time.Second
	DefaultPerSecond = 5
	maxKeys          = 64
)

// Gate decides which of a stream of lines to write. The zero value is ready, with the
// defaults above; a Gate is safe for concurrent use.
type Gate struct {
	Every     time.Duration // a key goes through again after this
	PerSecond int           // most lines a second, all keys together

	mu     sync.Mutex
	keys   map[string]*seen
	second time.Time // the start of the current one-second window
	inSec  int       // lines let through in it
}

type seen struct {
	at   time.Time
	held int
}

// Pass reports whether the line with key should be written now, and how many lines of
// that key were held back since the last one that was.
func (g *Gate) Pass(key string) (ok bool, held int) { return g.passAt(key, time.Now()) }

func (g *Gate) passAt(key string, now time.Time) (bool, int) {
	every, perSec := g.Every, g.PerSecond
	if every == 0 {
		every = DefaultEvery
	}
	if perSec == 0 {
		perSec = DefaultPerSecond
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.keys == nil {
		g.keys = map[string]*seen{}
	}
	s := g.keys[key]
	if now.Sub(g.second) >= time.Second {
		g.second, g.inSec = now, 0
	}
	if s != nil && now.Sub(s.at) < every || g.inSec >= perSec {
		if s == nil {
			s = g.add(key, time.Time{})
		}
		s.held++
		return false, 0
	}
	if s == nil {
		s = g.add(key, now)
	}
	held := s.held
	s.at, s.held = now, 0
	g.inSec++
	return true, held
}

// add remembers key, forgetting the one seen longest ago when the table is full (its
// held count is lost: the counters keep the events).
func (g *Gate) add(key string, at time.Time) *seen {
	if len(g.keys) >= maxKeys {
		var oldest string
		var when time.Time
		for k, v := range g.keys {
			if oldest == "" || v.at.Before(when) {
				oldest, when = k, v.at
			}
		}
		delete(g.keys, oldest)
	}
	s := &seen{at: at}
	g.keys[key] = s
	return s
}

// Key is the default key of a line: the line without its numbers (decimal digits, and
// hexadecimal ones after 0x), so that the same event at another address, index or
// count shares one key.
func Key(line string) string {
	var b strings.Builder
	for i := 0; i < len(line); i++ {
		c := line[i]
		if c == '0' && i+1 < len(line) && (line[i+1] == 'x' || line[i+1] == 'X') {
			for i += 2; i < len(line) && isHex(line[i]); i++ {
			}
			i--
			continue
		}
		if c >= '0' && c <= '9' {
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
