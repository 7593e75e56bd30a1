package sandbox

import (
	"os"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// Needs says which groups of system calls the port kind in use makes after Enter.
type Needs uint32

const (
	// NeedVhostUser: a vhost-user back-end maps the memory and rings a front-end hands
	// over and signals its eventfds.
	NeedVhostUser Needs = 1 << iota
	// NeedDial: the port connects to its peer at run time (client mode, stream
	// reconnect).
	NeedDial
	// NeedNetmap: a netmap port (its ioctls on /dev/netmap).
	NeedNetmap
)

// call is one allowed system call and why.
type call struct {
	name  string
	needs Needs // 0: every kind
	why   string
	cond  [][]seccomp.Condition // any of these (each all-of) matches; nil: any arguments
}

func argEq(arg uint32, v uint64) []seccomp.Condition {
	return []seccomp.Condition{{Argument: arg, Operation: seccomp.Equal, Value: v}}
}

// allowList is every system call tapgro makes once confined, hottest first (the filter
// compares one by one). Who needs each is said beside it; "runtime" is the Go runtime,
// whatever tapgro's own code does.
func allowList() []call {
	pid := uint64(os.Getpid())
	return []call{
		// The data path.
		{name: "futex", why: "runtime: parking and waking threads"},
		{name: "read", why: "TAP and socket reads, eventfds, netpoll"},
		{name: "write", why: "TAP frames, eventfd signals, log lines"},
		{name: "readv", why: "TAP reads into guest buffers"},
		{name: "writev", why: "TAP writes from guest buffers, socket port frames"},
		{name: "epoll_pwait", why: "runtime: netpoll"},
		{name: "epoll_wait", why: "runtime: netpoll"},
		{name: "epoll_ctl", why: "runtime: registering descriptors with netpoll"},
		{name: "recvmsg", why: "socket ports; vhost-user messages with their fds (SCM_RIGHTS)"},
		{name: "sendmsg", why: "socket ports; vhost-user replies"},
		{name: "recvmmsg", why: "datagram port: batched receive"},
		{name: "sendmmsg", why: "datagram port: batched send"},
		{name: "recvfrom", why: "socket ports, netlink replies"},
		{name: "sendto", why: "socket ports, netlink requests (the TAP's addresses)"},
		{name: "ppoll", why: "a look at a TAP before an RX worker parks; unjamming a full eventfd"},
		{name: "poll", why: "x/sys unix.Poll on amd64"},
		{name: "preadv2", why: "RWF_NOWAIT read of a full eventfd (vhostuser signal.go unjam)"},
		{name: "nanosleep", why: "runtime: usleep"},
		{name: "sched_yield", why: "runtime: osyield"},
		{name: "clock_gettime", why: "runtime: clocks when the vDSO is not used"},
		{name: "getpid", why: "runtime: signals to its own threads"},
		{name: "gettid", why: "runtime: signals to its own threads"},
		{name: "tgkill", why: "runtime: preemption signals, only to this process",
			cond: [][]seccomp.Condition{argEq(0, pid)}},
		{name: "rt_sigreturn", why: "runtime: return from a signal handler"},
		{name: "rt_sigprocmask", why: "runtime: signal masks of new threads"},
		{name: "rt_sigaction", why: "runtime, os/signal: handlers"},
		{name: "sigaltstack", why: "runtime: signal stacks of new threads"},
		{name: "restart_syscall", why: "kernel: restarting a call a signal interrupted"},
		{name: "madvise", why: "runtime: returning memory; vhost-user: guest memory advice"},
		{name: "mmap", why: "runtime: heap; vhost-user: guest memory, dirty log"},
		{name: "munmap", why: "runtime: heap; vhost-user: a session's mappings"},
		{name: "mprotect", why: "runtime and libc (cgo builds): thread stack guards"},
		{name: "clone", why: "runtime: new threads, never a new process",
			cond: [][]seccomp.Condition{{{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_THREAD}}}},
		{name: "exit", why: "runtime: a thread ends"},
		{name: "exit_group", why: "the process ends"},
		{name: "close", why: "descriptors of ended sessions and connections"},
		{name: "fcntl", why: "O_NONBLOCK on received fds, F_DUPFD_CLOEXEC"},
		{name: "dup", why: "vhost-user: the kick fd kept for Poke"},
		{name: "dup3", why: "os: descriptor duplication"},
		{name: "getrandom", why: "runtime and crypto randomness when the vDSO is not used"},
		{name: "getrusage", why: "procscale: the process's CPU time"},
		{name: "sched_getaffinity", why: "runtime: CPU count"},
		{name: "fstat", why: "received fds' types; file identity"},
		{name: "newfstatat", why: "os.File.Stat, socket path identity at exit"},
		{name: "statx", why: "os.File.Stat on newer runtimes"},
		{name: "fstatfs", why: "vhost-user: guest memory must be tmpfs or hugetlbfs"},
		{name: "lseek", why: "log and capture files"},
		{name: "ftruncate", why: "a capture file started afresh"},
		{name: "openat", why: "reopening the log (SIGHUP) and capture files: Landlock bounds where"},
		{name: "unlinkat", why: "removing tapgro's own sockets at exit: Landlock bounds where"},
		{name: "readlinkat", why: "vhost-user: naming a received fd (fails without /proc; the check falls back)"},
		{name: "ioctl", why: "TAP offloads and queue state on an open TAP; netmap's ioctls",
			cond: ioctls()},
		{name: "ioctl", needs: NeedNetmap, why: "netmap: NIOCTXSYNC/NIOCRXSYNC and the rest of its ioctls on /dev/netmap"},
		{name: "accept4", why: "listeners: a new peer, QEMU, the control client, /metrics"},
		{name: "getsockopt", why: "SO_PEERCRED, SO_ERROR, buffer sizes"},
		{name: "setsockopt", why: "buffer sizes and options of accepted and dialled sockets"},
		{name: "getsockname", why: "net: addresses of accepted sockets"},
		{name: "getpeername", why: "net: addresses of accepted sockets"},
		{name: "shutdown", why: "ending a connection"},
		{name: "socket", needs: NeedDial, why: "a client port's new connection (UNIX, IPv4, IPv6 only)",
			cond: [][]seccomp.Condition{argEq(0, unix.AF_UNIX), argEq(0, unix.AF_INET), argEq(0, unix.AF_INET6)}},
		{name: "connect", needs: NeedDial, why: "a client port's new connection"},
		{name: "timerfd_create", why: "vhost-user's TX hold timer; the timer flush's alarm (package alarm)"},
		{name: "timerfd_settime", why: "arming those timers"},
		{name: "memfd_create", why: "vnet-hdr=on streams: the shared-memory rings of each new connection (sockport shm.go)"},
		{name: "setitimer", why: "runtime: CPU profiling (--pprof)"},
		{name: "timer_create", why: "runtime: CPU profiling (--pprof)"},
		{name: "timer_settime", why: "runtime: CPU profiling (--pprof)"},
		{name: "timer_delete", why: "runtime: CPU profiling (--pprof)"},
		{name: "rseq", why: "libc (cgo builds): a new thread registers"},
		{name: "set_robust_list", why: "libc (cgo builds): a new thread registers"},
	}
}

// ioctls are the requests allowed on descriptors tapgro holds: the TAP's offloads,
// headers and queues (tapdev; TUNSETQUEUE when a guest changes its queue pairs), and
// SIOCINQ/SIOCOUTQ (queued bytes of sockets).
func ioctls() [][]seccomp.Condition {
	reqs := []uint64{unix.TUNSETOFFLOAD, unix.TUNGETIFF, unix.TUNSETVNETHDRSZ, unix.TUNGETVNETHDRSZ,
		unix.TUNSETQUEUE, unix.SIOCINQ, unix.SIOCOUTQ,
		unix.TCGETS, // logrus asks whether its output is a terminal at its first line
	}
	out := make([][]seccomp.Condition, 0, len(reqs))
	for _, r := range reqs {
		out = append(out, argEq(1, r))
	}
	return out
}

// Calls returns the names of the system calls allowed for needs, in filter order.
func Calls(needs Needs) []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range allowList() {
		if (c.needs == 0 || c.needs&needs != 0) && !seen[c.name] {
			seen[c.name] = true
			out = append(out, c.name)
		}
	}
	return out
}

// policy assembles the filter for needs. def is what an unlisted call gets.
func policy(needs Needs, def seccomp.Action) seccomp.Policy {
	var plain []string
	var conds []seccomp.NameWithConditions
	for _, c := range allowList() {
		if c.needs != 0 && c.needs&needs == 0 {
			continue
		}
		if c.cond == nil {
			plain = append(plain, c.name)
			continue
		}
		for _, cc := range c.cond {
			conds = append(conds, seccomp.NameWithConditions{Name: c.name, Conditions: cc})
		}
	}
	return seccomp.Policy{
		DefaultAction: def,
		Syscalls: []seccomp.SyscallGroup{
			{Names: plain, Action: seccomp.ActionAllow},
			{NamesWithCondtions: conds, Action: seccomp.ActionAllow},
			// glibc (cgo builds) tries clone3 first for a thread, whose flags a filter
			// cannot see (they are in memory); ENOSYS makes it fall back to clone.
			{Names: []string{"clone3"}, Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)},
		},
	}
}
