package sandbox

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// stageEnv marks the image Reexec started, so it does not re-execute again.
const stageEnv = "TAPGRO_SANDBOX_STAGE"

var (
	reexeced      bool   // this image runs in the namespaces Reexec made
	reexecSkipped string // why not, for the report
)

// Reexec moves the process into new mount, IPC and UTS namespaces by re-executing
// tapgro on a thread that unshared them (the package doc says why a thread and an
// execve). It returns only in the new image (reexeced), when the namespaces cannot be
// had (no CAP_SYS_ADMIN: the report says so), or with an error from execve. Call it
// first thing in the daemon's path, before anything is opened: descriptors without
// O_CLOEXEC would survive into the new image (LISTEN_FDS sockets do, on purpose).
func Reexec(mode Mode) error {
	if os.Getenv(stageEnv) != "" {
		os.Unsetenv(stageEnv)
		reexeced = true
		return nil
	}
	if mode == Off {
		return nil
	}
	if !hasCap(unix.CAP_SYS_ADMIN) {
		reexecSkipped = "started without CAP_SYS_ADMIN"
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("sandbox: find tapgro's binary: %w", err)
	}
	runtime.LockOSThread() // never unlocked: this thread's namespaces differ from the rest
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("sandbox: unshare: %w", err)
	}
	env := append(os.Environ(), stageEnv+"=1")
	// /proc/self/exe, not the path: the binary may have been replaced on disk since.
	err = syscall.Exec("/proc/self/exe", os.Args, env)
	return fmt.Errorf("sandbox: re-execute %s: %w", exe, err)
}

// hasCap reports whether c is in the calling thread's effective set.
func hasCap(c int) bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[c/32].Effective&(1<<(uint(c)%32)) != 0
}
