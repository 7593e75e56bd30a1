// Package kvlog is the one logging contract of tapgro's libraries (datapath, ops,
// vhostuser, vhostnet): a Logger with three levels, each taking a constant message and
// the event's details as alternating key/value pairs.
//
// One contract, so that the daemon adapts its logger once and every library's lines
// come out alike. Constant messages, so that a structured logger (logrus, slog, a JSON
// sink) keeps the details as fields an operator can filter and a program can parse,
// instead of numbers folded into free text; and so that the same event is the same
// message whatever its values. By convention an error goes under the key "error".
//
// Libraries log rare events only (a session's start and end, a refusal, a
// configuration change): the packet path never logs, and what happens per packet is a
// counter. So a Logger may allocate and take locks as it likes.
package kvlog

import (
	"fmt"
	"strconv"
	"strings"
)

// Logger receives a library's events. kv are alternating keys (strings) and values.
// Implementations must be safe for concurrent use: libraries call them from their own
// goroutines.
type Logger interface {
	Debug(msg string, kv ...any)
	Info(msg string, kv ...any)
	Warn(msg string, kv ...any)
}

// Nop discards everything: the Logger of a library configured with none.
type Nop struct{}

func (Nop) Debug(string, ...any) {}
func (Nop) Info(string, ...any)  {}
func (Nop) Warn(string, ...any)  {}

// Printf is a Logger on a printf-style function such as testing.T.Logf: each event is
// one line, "LEVEL msg k=v k=v". A value that is empty or holds white space, a quote
// or an '=' is quoted, so the line still splits into its pairs; a key that is not a
// string, or a last value without its key, is written as "!BADKEY=value" (log/slog's
// marker). A nil f gives Nop.
func Printf(f func(format string, args ...any)) Logger {
	if f == nil {
		return Nop{}
	}
	return printfLogger(f)
}

type printfLogger func(format string, args ...any)

func (p printfLogger) Debug(msg string, kv ...any) { p.line("DEBUG", msg, kv) }
func (p printfLogger) Info(msg string, kv ...any)  { p.line("INFO", msg, kv) }
func (p printfLogger) Warn(msg string, kv ...any)  { p.line("WARN", msg, kv) }

func (p printfLogger) line(level, msg string, kv []any) {
	var b strings.Builder
	b.WriteString(level)
	b.WriteByte(' ')
	b.WriteString(msg)
	for len(kv) > 0 {
		key, ok := kv[0].(string)
		val := kv[0]
		if ok && len(kv) > 1 {
			val, kv = kv[1], kv[2:]
		} else {
			key, kv = "!BADKEY", kv[1:]
		}
		b.WriteByte(' ')
		b.WriteString(key)
		b.WriteByte('=')
		b.WriteString(quoted(fmt.Sprint(val)))
	}
	p("%s", b.String())
}

// quoted is v, in double quotes if it would not read back as one value.
func quoted(v string) string {
	if v == "" || strings.ContainsAny(v, " \t\n\"=") {
		return strconv.Quote(v)
	}
	return v
}
