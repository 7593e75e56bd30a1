//go:build linux

package vhostuser

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// checkEventfd returns an error unless fd is an eventfd, which is what vhost-user.rst
// says kick, call and err are. /proc/self/fd names an eventfd "anon_inode:[eventfd]"
// (fs/eventfd.c eventfd_create → anon_inode_getfd); without /proc (a chroot) only the
// inode type can be checked: an anonymous inode has no file type bits, which rules out
// pipes, sockets, files and devices. A kick is read by the worker, so it must not be
// in semaphore mode either (EFD_SEMAPHORE: every read takes 1 off the count, so a count
// of 2^64-2 would keep the worker reading for ever); Linux 6.5 and later show the mode
// in /proc/self/fdinfo (fs/eventfd.c eventfd_show_fdinfo), and Vring.sleep stops a ring
// whose kick never goes quiet where that line is missing.
func checkEventfd(fd int, kick bool) error {
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
	if kick {
		info, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
		if err == nil && bytes.Contains(info, []byte("\neventfd-semaphore: 1")) {
			return fmt.Errorf("fd is an eventfd in semaphore mode: a kick must count, not take one at a time")
		}
	}
	return nil
}
