//go:build !cgo

package sandbox

// psxNeedsProc: see cgo_on.go.
const psxNeedsProc = false
