// Package rawsys makes the data path's system calls on non-blocking descriptors — read,
// write, readv, writev, recvmmsg, sendmmsg, and poll with a zero timeout — without the Go scheduler's system-call
// bookkeeping.
//
// # Why
//
// syscall.Syscall (and golang.org/x/sys/unix's wrappers, which use it) brackets the call
// with runtime.entersyscall and exitsyscall, so that the goroutine's P can be handed to
// other work if the call sleeps in the kernel. entersyscall also wakes the runtime's
// sysmon thread when it is in its deep sleep (runtime/proc.go, reentersyscall →
// entersyscallWakeSysmon), and a sysmon woken that way starts over at its shortest period:
// a 20 µs usleep, kept up while it keeps finding Ps in system calls to retake
// (runtime/proc.go, sysmon and retake). tapgro's pipelines alternate short calls with
// short waits in the netpoller, which puts every P to sleep, so sysmon was woken again on
// nearly every batch: in the stream benchmark runtime.sysmon and its nanosleeps were 7–12
// % of each tapgro's CPU (perf record -g, children), on top of the bookkeeping itself.
//
// A call on a non-blocking descriptor never sleeps: it copies what it can and returns,
// or fails with EAGAIN, and the waiting is done by the netpoller (syscall.RawConn's Read
// and Write, which park the goroutine without a system call). There is nothing for the
// bookkeeping to hand off, so these functions use unix.RawSyscall, as gVisor's fdbased
// link endpoint does for the same calls (gvisor pkg/rawfile, NonBlockingWrite,
// NonBlockingSendMMsg).
//
// # The rule
//
// Only descriptors tapgro alone controls, opened or set O_NONBLOCK, whose calls are
// bounded by the bytes they copy: TAP devices (tapdev opens /dev/net/tun non-blocking),
// sockets from package net (non-blocking by construction) and eventfds of tapgro's own.
// Never a descriptor a peer shares: O_NONBLOCK lives in the open file description, and
// a peer holding the same description (a vhost-user front-end's eventfds) can clear it
// (vhostuser/signal.go). A goroutine in a raw call keeps its P, so
// a stop-the-world or another goroutine on that P waits for the call, which is the copy
// of at most a batch (tens of µs). A blocking descriptor here would stall its P for as
// long as the kernel sleeps, so it must never be passed.
//
// Every function returns the kernel's result and errno as they are (EINTR and EAGAIN
// included); the callers' loops already decide what each means.
package rawsys
