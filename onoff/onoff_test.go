package onoff

import "testing"

func TestParse(t *testing.T) {
	for _, w := range []string{"on", "yes", "true", "y", "1"} {
		if on, ok := Parse(w); !on || !ok {
			t.Errorf("Parse(%q) = %v, %v", w, on, ok)
		}
	}
	for _, w := range []string{"off", "no", "false", "n", "0"} {
		if on, ok := Parse(w); on || !ok {
			t.Errorf("Parse(%q) = %v, %v", w, on, ok)
		}
	}
	for _, w := range []string{"", "ON", "enable", "2", "of"} {
		if _, ok := Parse(w); ok {
			t.Errorf("Parse(%q) accepted", w)
		}
	}
	if String(true) != "on" || String(false) != "off" {
		t.Error("String")
	}
	for _, b := range []bool{true, false} {
		if on, ok := Parse(String(b)); !ok || on != b {
			t.Errorf("String(%v) does not parse back", b)
		}
	}
}
