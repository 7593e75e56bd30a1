//go:build linux && tapgro_unlogged_rx

package vhostuser

// Built with -tags tapgro_unlogged_rx, the dirty log is not told about bytes written
// into receive chains (used rings still are). That breaks live migration on purpose:
// the migration tests build a back-end this way as their control, to show that they
// catch one that forgets receive buffers. No production build has it.
func init() { unloggedRX = true }
