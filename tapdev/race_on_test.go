//go:build race

package tapdev

// raceEnabled says the tests run under -race, where allocation counts of pooled
// scratch are meaningless: the race detector makes sync.Pool drop a share of Puts on
// purpose.
const raceEnabled = true
