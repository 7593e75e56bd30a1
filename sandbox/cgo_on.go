//go:build cgo

package sandbox

// psxNeedsProc: in a cgo build libcap's psx finds the process's threads in
// /proc/PID/task (its psx.c), so the new root keeps a procfs, which Landlock then
// denies reading. A build without cgo uses the runtime's AllThreadsSyscall instead.
const psxNeedsProc = true
