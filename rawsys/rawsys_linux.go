package rawsys

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read is read(2).
func Read(fd uintptr, b []byte) (int, syscall.Errno) {
	return call(unix.SYS_READ, fd, unsafe.Pointer(unsafe.SliceData(b)), len(b))
}

// Write is write(2).
func Write(fd uintptr, b []byte) (int, syscall.Errno) {
	return call(unix.SYS_WRITE, fd, unsafe.Pointer(unsafe.SliceData(b)), len(b))
}

// Readv is readv(2) into iov.
func Readv(fd uintptr, iov []unix.Iovec) (int, syscall.Errno) {
	return call(unix.SYS_READV, fd, unsafe.Pointer(unsafe.SliceData(iov)), len(iov))
}

// Writev is writev(2) from iov.
func Writev(fd uintptr, iov []unix.Iovec) (int, syscall.Errno) {
	return call(unix.SYS_WRITEV, fd, unsafe.Pointer(unsafe.SliceData(iov)), len(iov))
}

// PollNow is ppoll(2) over fds with a zero timeout: it reports which are ready now and
// never sleeps, so it obeys the package's rule whatever the descriptors are.
func PollNow(fds []unix.PollFd) (int, syscall.Errno) {
	r, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(unsafe.SliceData(fds))), uintptr(len(fds)),
		uintptr(unsafe.Pointer(&zeroTimeout)), 0, 0, 0)
	return int(r), e
}

// zeroTimeout is PollNow's timeout: package-level, so the pointer the kernel reads
// needs no keep-alive.
var zeroTimeout unix.Timespec

// Recvmmsg is recvmmsg(2) into msgs with no timeout.
func Recvmmsg(fd uintptr, msgs []unix.Mmsghdr, flags int) (int, syscall.Errno) {
	return mmsg(unix.SYS_RECVMMSG, fd, msgs, flags)
}

// Sendmmsg is sendmmsg(2) of msgs.
func Sendmmsg(fd uintptr, msgs []unix.Mmsghdr, flags int) (int, syscall.Errno) {
	return mmsg(unix.SYS_SENDMMSG, fd, msgs, flags)
}

// call passes p as a uintptr inside the RawSyscall expression itself, the form the
// unsafe.Pointer rules (case 4, "when calling syscall.Syscall") keep the object alive
// for. A nil p (empty slice) is passed as 0, which the kernel accepts for a zero count.
func call(trap, fd uintptr, p unsafe.Pointer, n int) (int, syscall.Errno) {
	r, _, e := unix.RawSyscall(trap, fd, uintptr(p), uintptr(n))
	return int(r), e
}

func mmsg(trap, fd uintptr, msgs []unix.Mmsghdr, flags int) (int, syscall.Errno) {
	r, _, e := unix.RawSyscall6(trap, fd, uintptr(unsafe.Pointer(unsafe.SliceData(msgs))), uintptr(len(msgs)), uintptr(flags), 0, 0)
	return int(r), e
}
