//go:build linux

package vhostuser

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
)

// checkEventfd returns an error unless fd is an eventfd, which is what vhost-user.rst
// says kick, call and err are. /proc/self/fd names an eventfd "anon_inode:[eventfd]"
// (fs/eventfd.c eventfd_create → anon_inode_getfd); without /proc (a chroot) only the
// inode type can be checked: an anonymous inode has no file type bits, which rules out
// pipes, sockets, files and devices. An eventfd's mode does not matter: the worker
// never reads the kick (Vring.sleep), it only waits for its edges.
func checkEventfd(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		if st.Mode&unix.S_IFMT != 0 {
			return fmt.Errorf("fd of mode %#o is not an eventfd", st.Mode)
		}
		return nil
	}
	if link != "anon_inode:[eventfd]" {
		return fmt.Errorf("fd is %q, not an eventfd", link)
	}
	return nil
}

// vringFile handles SET_VRING_KICK/CALL/ERR: bits 0–7 ring index, bit 8 = no fd
// (vhost-user.rst SET_VRING_KICK). A kick starts the ring (libvhost-user
// vu_set_vring_kick_exec; QEMU creates the kick eventfd already signalled, so the ring
// would start at the first read anyway).
//
// Every fd must be an eventfd (checkEventfd), and is made non-blocking: the kick
// because it goes into the runtime poller, call and err so that a full counter answers
// EAGAIN. The front-end can undo that on its own copy of the file, so a write to any of
// them is made the way signal.go describes, never under a lock. Anything else (a pipe
// that fills, a file or /dev/zero that never stops being readable) ends the session
// with an error that says what the fd was: QEMU only ever sends eventfds
// (event_notifier_init).
func (s *Session) vringFile(m *message, p []byte) error {
	u, _ := decodeU64(p)
	if u&^uint64(vuproto.VringIndexMask|vuproto.VringNoFd) != 0 {
		return protoErr("request %d payload %#x", m.req, u)
	}
	v, err := s.ring(uint32(u & vuproto.VringIndexMask))
	if err != nil {
		return err
	}
	fd := -1
	if u&vuproto.VringNoFd == 0 {
		fd = m.takeFd(0)
		err := checkEventfd(fd)
		if err == nil {
			err = unix.SetNonblock(fd, true)
		}
		if err != nil {
			unix.Close(fd)
			return protoErr("%s ring %d: %v", reqName(m.req), v.index, err)
		}
	}
	v.mu.Lock()
	switch m.req {
	case ReqSetVringCall:
		v.setFDLocked(&v.call, newEventFD(fd))
		if fd >= 0 && v.state == ringRunning && v.ring.published() {
			// QEMU sends CALL after KICK (hw/virtio/vhost.c vhost_virtqueue_start), so
			// entries may have been published with no fd to signal. One spurious
			// interrupt is harmless; a lost one stalls the guest (passt signals every
			// new call fd, vhost_user.c vu_set_vring_call_exec).
			v.oweCallLocked()
		}
		v.unlockAsync()
		return nil
	case ReqSetVringErr:
		v.setFDLocked(&v.errf, newEventFD(fd))
		v.mu.Unlock()
		return nil
	}
	// Kick. The eventfd goes into the runtime poller; closing the os.File wakes a
	// blocked Read. Poke writes to a duplicate of it (signal.go).
	var f *os.File
	var rc syscall.RawConn
	var poke *eventFD
	if fd >= 0 {
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			unix.Close(fd)
			v.mu.Unlock()
			return protoErr("%s ring %d: dup: %v", reqName(m.req), v.index, err)
		}
		poke = newEventFD(dup)
		f = os.NewFile(uintptr(fd), fmt.Sprintf("vhost-user-kick-%d", v.index))
		if rc, err = f.SyscallConn(); err != nil {
			f.Close()
			poke.close()
			v.mu.Unlock()
			return protoErr("%s ring %d: %v", reqName(m.req), v.index, err)
		}
	}
	v.closeKickLocked()
	v.kick, v.kickRC, v.hasKick, v.kickNoFd = f, rc, true, fd < 0
	v.pokeFD.Store(poke)
	if v.state == ringRunning {
		v.mu.Unlock()
		return nil
	}
	ok := v.startLocked(s.mem, s.feats())
	v.announced = ok
	v.unlockAsync()
	if ok {
		s.h.RingStarted(v)
	}
	return nil
}
