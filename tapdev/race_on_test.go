//go:build race

package tapdev

// The race detector makes sync.Pool drop a share of Puts on purpose, so allocation
// counts of pooled scratch are meaningless under -race.
const raceEnabled = true
