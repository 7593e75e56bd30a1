// Package sandbox confines tapgro once its set-up is done, the way passt confines
// itself (passt's isolation.c, "Theory of Operation"), adapted to a Go process.
//
// Everything privileged happens first, with the flags' privileges: the TAP is opened
// and configured, sockets are bound, the log and capture files opened. What the process
// does afterwards is only reading and writing descriptors it already holds, mapping the
// memory a front-end hands over, accepting on its listeners and, in client mode,
// connecting to its peer. Enter then takes away everything else:
//
//  1. Filesystem. Reexec, called before set-up, moves the whole process into new mount,
//     IPC and UTS namespaces (CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUTS). A Go process
//     has several threads by the time main runs, and unshare(2) of a mount namespace
//     only moves the calling thread, so the namespaces are entered on a locked thread
//     that then execve(2)s tapgro again with the same arguments: execve keeps the
//     thread's namespaces, the PID (the thread becomes the group leader:
//     fs/exec.c de_thread) and the descriptors, and the new image starts with every
//     thread inside. Set-up then runs in a private copy of the host's mounts (same
//     filesystems, so a bound socket is visible to everyone). Enter mounts an empty
//     tmpfs, pivot_root(2)s into it and detaches the old root (passt's "pivot_root(".",
//     ".") then umount2(MNT_DETACH)" sequence), then remounts it read-only. Only what
//     run time opens by name is bind-mounted in, at its own path: the directories of
//     the log and capture files, and, in client mode, of the peer's socket.
//     Started with no capability at all (a manager handed it the TAP with --tap-fd
//     and perhaps its sockets), tapgro cannot unshare a user namespace in place either
//     (unshare refuses CLONE_NEWUSER to a multi-threaded process), so it forks:
//     Reexec becomes a supervisor that forwards signals and returns the exit status,
//     and the real tapgro is a child created in new user, PID, mount, IPC and UTS
//     namespaces (userns.go says why each), mapping the starting user to 0 and no one
//     else, as passt's isolate_initial does. With CAP_SYS_ADMIN no user namespace is
//     made: execve in place keeps the PID systemd and managers know, and a user
//     namespace would take away CAP_NET_ADMIN in the host's network namespace, which
//     set-up needs. A start with some capabilities but not CAP_SYS_ADMIN skips the
//     namespaces; Landlock (below) still denies the filesystem.
//  2. Capabilities. The bounding set is emptied (PR_CAPBSET_DROP), ambient ones
//     cleared, --user's account taken, and the effective, permitted and inheritable
//     sets zeroed (capset). Capabilities, no_new_privs and Landlock domains are
//     per-thread attributes in Linux, so these calls go to every thread of the process
//     at once through package psx (libcap's, which uses the runtime's
//     AllThreadsSyscall, or a pthread_create wrapper in cgo builds). Nothing tapgro
//     does at run time needs a capability: TUNSETOFFLOAD on an open TAP checks none
//     (drivers/net/tun.c __tun_chr_ioctl), and the TAP's addresses are read over a
//     netlink socket opened at set-up.
//  3. PR_SET_NO_NEW_PRIVS, and PR_SET_DUMPABLE 0 (no core dumps of guest memory, no
//     ptrace by the same user).
//  4. Landlock (where the kernel has it): every filesystem right handled, none granted
//     beyond the kept directories (write and create files for the log and captures,
//     remove for the sockets tapgro created), TCP bind denied and TCP connect only to
//     a client port's peer, signals and abstract UNIX sockets scoped to the process.
//  5. seccomp: an allow-list (syscalls.go) for the port kind in use, installed on every
//     thread with SECCOMP_FILTER_FLAG_TSYNC. Anything else traps (SIGSYS): the Go
//     runtime then prints the goroutine that made the call, which is the bug report.
//     Mode "log" allows and logs instead (the kernel log names each call), for finding
//     what a new code path needs.
//
// The libraries: go-seccomp-bpf (Elastic) assembles the filter from syscall names and
// argument conditions, so the list reads as names and the x32 ABI is refused for us;
// go-landlock's syscall layer and libcap's psx apply the per-thread attributes to all
// threads (psx uses the runtime's AllThreadsSyscall in a build without cgo, and a small C
// wrapper of pthread_create in one with cgo).
package sandbox
