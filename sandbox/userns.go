package sandbox

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// superviseUserNS runs tapgro again as a child in new user, PID, mount, IPC and UTS
// namespaces, forwards signals to it and exits with its status; it returns only when
// the kernel refuses the namespaces (then the report says why and tapgro goes on
// without them).
//
// A fork, not an execve in place as with CAP_SYS_ADMIN: unshare(CLONE_NEWUSER) refuses
// a multi-threaded caller (kernel/fork.c ksys_unshare → check_unshare_flags), and
// a Go process has threads before main runs, so the only way into a user namespace is a
// process created in it (clone(2) with CLONE_NEWUSER, which syscall.ForkExec does from
// a single thread in the child). The child maps the starting uid and gid to 0 (with
// setgroups denied, user_namespaces(7)), so after its execve it holds every capability
// inside its own namespaces and none outside them: enough for the mount work of Enter,
// nothing over the host's network, TAP or files beyond what the starting user had.
//
// Once it is a new process anyway, it is also put in a new PID namespace, as passt
// does: tapgro is its PID 1, sees no other process and cannot be seen by PID from
// inside. The cost is a second process: this supervisor, which holds nothing but the
// child's PID, forwards SIGINT, SIGTERM, SIGHUP (log reopen) and SIGQUIT (stack dump),
// and takes the child down with it if it is killed (PR_SET_PDEATHSIG). The child is in
// its own process group so that a terminal's ^C reaches it once, through here.
func superviseUserNS() error {
	// The parent-death signal fires when the thread that forked exits (prctl(2)
	// PR_SET_PDEATHSIG): this one, kept until the process exits.
	runtime.LockOSThread()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	attr := &syscall.ProcAttr{
		Env:   childEnv(),
		Files: []uintptr{0, 1, 2}, // and every inherited descriptor without O_CLOEXEC
		Sys: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS |
				syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
			GidMappingsEnableSetgroups: false,
			Setpgid:                    true,
			// SIGKILL, because syscall's fork path then checks getppid() against this
			// PID, which in a new PID namespace reads 0, and signals the child at once:
			// a signal the child sends its own PID 1 without a handler is ignored
			// (kernel/signal.c sig_task_ignored, SIGNAL_UNKILLABLE), while the real
			// parent-death signal comes from outside the namespace and is forced.
			Pdeathsig: syscall.SIGKILL,
		},
	}
	pid, err := syscall.ForkExec("/proc/self/exe", os.Args, attr)
	if err != nil {
		signal.Stop(sigs)
		reexecSkipped = fmt.Sprintf("started unprivileged and the kernel refused a user namespace (%v)", err)
		return nil
	}
	go func() {
		for s := range sigs {
			unix.Kill(pid, s.(syscall.Signal))
		}
	}()
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err != syscall.EINTR {
			break
		}
	}
	switch {
	case ws.Exited():
		os.Exit(ws.ExitStatus())
	case ws.Signaled():
		os.Exit(128 + int(ws.Signal()))
	}
	os.Exit(1)
	return nil
}

// childEnv is the environment for the child: the stage marker, and systemd's
// LISTEN_PID renamed to the PID the child will have (1) when it named this process.
func childEnv() []string {
	env := append(os.Environ(), stageEnv+"="+stageUserNS)
	self := "LISTEN_PID=" + strconv.Itoa(os.Getpid())
	for i, kv := range env {
		if kv == self {
			env[i] = "LISTEN_PID=1"
		}
	}
	return env
}

// ownProc mounts a procfs of the new PID namespace over /proc, in the child's own mount
// namespace: the host's one would show the host's PID 1 at /proc/1, which is what
// getpid() now returns (psx, in a cgo build, lists /proc/PID/task). Mounting procfs
// in a user namespace is refused where the host's /proc is partly covered (container
// runtimes mask files in it: fs/namespace.c mount_too_revealing); a build that needs it
// then fails here, one that does not goes on with the host's (/proc/self still resolves).
func ownProc() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("sandbox: make mounts private: %w", err)
	}
	err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err == nil {
		procOwn = true
		return nil
	}
	if psxNeedsProc {
		return fmt.Errorf("sandbox: mount /proc for the new PID namespace: %w (--sandbox off runs without namespaces)", err)
	}
	return nil
}

// NamespaceID translates a uid (or, with gid set, a gid) of the host into the user
// namespace tapgro runs in, the way SO_PEERCRED reports it there: the identity in the
// initial namespace, the starting user's as 0 in the one superviseUserNS made. ok is
// false for an id the namespace does not map (the kernel reports such a peer as the
// overflow id, so no check could tell it apart from any other unmapped one).
func NamespaceID(id uint32, gid bool) (uint32, bool) {
	file := "/proc/self/uid_map"
	if gid {
		file = "/proc/self/gid_map"
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return id, true // no procfs: no way to be in a namespace we made either
	}
	// Each line: first id inside, first id outside, count (user_namespaces(7)).
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		in, err1 := strconv.ParseUint(f[0], 10, 32)
		out, err2 := strconv.ParseUint(f[1], 10, 32)
		n, err3 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		if uint64(id) >= out && uint64(id)-out < n {
			return uint32(in + (uint64(id) - out)), true
		}
	}
	return 0, false
}
