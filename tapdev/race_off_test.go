//go:build !race

package tapdev

const raceEnabled = false
