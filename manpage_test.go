package main

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
)

// TestManPage: the man page is written from the flag definitions, so every flag is in
// it, each under its own name with its help text; and nothing in it starts a line that
// roff would take for a request it does not know.
func TestManPage(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := realMain([]string{"__manpage"}, &out, &errOut); code != 0 {
		t.Fatalf("tapgro __manpage: exit %d: %s", code, errOut.String())
	}
	page := out.String()
	if !strings.HasPrefix(page, ".TH TAPGRO 8") {
		t.Fatalf("not a man page: %.60q", page)
	}
	checkManPageFlags(t, page)
	for i, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, ".") {
			req := strings.Fields(line)[0]
			switch req {
			case ".TH", ".SH", ".TP", ".B", ".br", ".BR":
			default:
				t.Errorf("line %d: %q starts with a roff request tapgro does not use", i+1, line)
			}
		}
	}
}

// checkManPageFlags checks that page (roff) has every flag parseFlags defines, each
// under its own name, and every environment variable envFlags reads.
func checkManPageFlags(t *testing.T, page string) {
	t.Helper()
	var fs *flag.FlagSet
	captureFlags = func(f *flag.FlagSet) { fs = f }
	parseFlags(nil, io.Discard)
	captureFlags = nil
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(page, ".B \\-\\-"+strings.ReplaceAll(f.Name, "-", "\\-")) {
			t.Errorf("the man page lacks --%s", f.Name)
		}
	})
	if n < 50 {
		t.Errorf("only %d flags seen", n)
	}
	for _, e := range envFlags {
		if !strings.Contains(page, ".B "+e.env+"\n") {
			t.Errorf("the man page lacks %s", e.env)
		}
	}
}
