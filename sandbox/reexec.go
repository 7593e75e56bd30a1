package sandbox

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// stageEnv marks the image Reexec started, so it does not re-execute again. Its value
// says which way it was started.
const stageEnv = "TAPGRO_SANDBOX_STAGE"

const (
	stageSamePID = "1"      // execve on a thread that unshared mnt, ipc and uts
	stageUserNS  = "userns" // a child in new user, pid, mnt, ipc and uts namespaces
)

var (
	reexeced      bool   // this image runs in the namespaces Reexec made
	inUserNS      bool   // ... and they include a user namespace (started unprivileged)
	procOwn       bool   // /proc was remounted for the new PID namespace
	reexecSkipped string // why not, for the report
)

// Reexec moves the process into new namespaces before set-up; the package doc says
// which, and why by re-executing. Started with CAP_SYS_ADMIN, tapgro re-executes itself
// in place. Started with no capability at all, it becomes a small supervisor of a
// child that runs in a new user namespace (superviseUserNS), and Reexec does not
// return in the supervisor. It returns in the new image (reexeced), when the
// namespaces cannot be had (the report says why), or with an error. Call it first thing
// in the daemon's path, before anything is opened: descriptors without O_CLOEXEC survive
// into the new image (LISTEN_FDS sockets and --tap-fd do, on purpose).
func Reexec(mode Mode) error {
	switch os.Getenv(stageEnv) {
	case stageSamePID:
		os.Unsetenv(stageEnv)
		reexeced = true
		return nil
	case stageUserNS:
		os.Unsetenv(stageEnv)
		reexeced, inUserNS = true, true
		return ownProc()
	}
	if mode == Off {
		return nil
	}
	if !hasCap(unix.CAP_SYS_ADMIN) {
		if !hasNoCaps() {
			// A user namespace would cost the capabilities set-up was given for the
			// host's network namespace (CAP_NET_ADMIN to create the TAP).
			reexecSkipped = "started with some capabilities but not CAP_SYS_ADMIN"
			return nil
		}
		return superviseUserNS()
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("sandbox: find tapgro's binary: %w", err)
	}
	runtime.LockOSThread() // never unlocked: this thread's namespaces differ from the rest
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS); err != nil {
		return fmt.Errorf("sandbox: unshare: %w", err)
	}
	env := append(os.Environ(), stageEnv+"="+stageSamePID)
	// /proc/self/exe, not the path: the binary may have been replaced on disk since.
	err = syscall.Exec("/proc/self/exe", os.Args, env)
	return fmt.Errorf("sandbox: re-execute %s: %w", exe, err)
}

// hasCap reports whether c is in the calling thread's effective set.
func hasCap(c int) bool {
	data, err := capGet()
	return err == nil && data[c/32].Effective&(1<<(uint(c)%32)) != 0
}

// hasNoCaps reports whether the calling thread has no capability in its effective or
// permitted set: it was started unprivileged.
func hasNoCaps() bool {
	data, err := capGet()
	return err == nil && data[0].Effective|data[1].Effective|data[0].Permitted|data[1].Permitted == 0
}

func capGet() ([2]unix.CapUserData, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	err := unix.Capget(&hdr, &data[0])
	return data, err
}
