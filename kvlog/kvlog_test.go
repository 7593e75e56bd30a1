package kvlog

import (
	"errors"
	"fmt"
	"testing"
)

func TestPrintf(t *testing.T) {
	var got string
	l := Printf(func(format string, args ...any) { got = fmt.Sprintf(format, args...) })
	for _, c := range []struct {
		log  func(string, ...any)
		msg  string
		kv   []any
		want string
	}{
		{l.Info, "session ended", nil, "INFO session ended"},
		{l.Warn, "ring stopped", []any{"ring", 3, "error", errors.New("kick storm")},
			`WARN ring stopped ring=3 error="kick storm"`},
		{l.Debug, "odd", []any{"empty", "", "eq", "a=b", "regions", []int{0, 2}},
			`DEBUG odd empty="" eq="a=b" regions="[0 2]"`},
		{l.Info, "bad keys", []any{7, "k", "v", "last"}, "INFO bad keys !BADKEY=7 k=v !BADKEY=last"},
	} {
		c.log(c.msg, c.kv...)
		if got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
	}
	if _, ok := Printf(nil).(Nop); !ok {
		t.Error("Printf(nil) is not Nop")
	}
}
