//go:build linux && tapgro_unlogged_rx

package vhostnet

import "testing"

// TestDirtyLogUnloggedControl is the control of TestDirtyLog: built with
// tapgro_unlogged_rx, the back-end does not mark receive buffers, which must leave pages
// changed and unmarked for the diff to see. test.sh runs it with that tag.
func TestDirtyLogUnloggedControl(t *testing.T) {
	tc := logCases()[0]
	e := newEnvCfg(t, tc.o, Config{})
	marked, changed := runLogged(t, e, tc.traffic)
	if len(minus(changed, marked)) == 0 {
		t.Fatalf("with receive buffers unlogged every changed page was still marked (%d pages)", len(changed))
	}
}
