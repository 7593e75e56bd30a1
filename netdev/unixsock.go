package netdev

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// unixSocketMode is the mode of every socket path tapgro creates: only its own user may
// connect or send (unix(7): connecting to a stream socket or sending to a datagram
// socket needs write permission on its path; gvisor-tap-vsock learnt this late, PR #683).
const unixSocketMode = 0o600

// ErrAddrInUse is wrapped by Open when a UNIX socket path is bound by a live process.
var ErrAddrInUse = errors.New("address in use by a running process")

// ErrUnsafeDir is wrapped by Open and ListenUnix when a socket path's directory is
// writable by users other than its owner and has no sticky bit (Options.AllowUnsafeDir).
var ErrUnsafeDir = errors.New("directory is writable by other users and has no sticky bit")

// ErrSocketReplaced is wrapped when the path no longer names the socket just bound: some
// other process renamed or replaced it between bind(2) and the chmod. Nothing at the path
// is changed then.
var ErrSocketReplaced = errors.New("the socket just bound was replaced at its path")

// euid is read at start: geteuid(2) is not on the confined allow-list, and a socket is
// re-bound at run time (redial, reconnect).
var euid = uint32(os.Geteuid())

// checkSocketDir refuses a socket path whose directory others may write without the
// sticky bit. In such a directory any user who can write it may rename or unlink the
// socket tapgro created (the sticky bit restricts both to the entry's owner, the
// directory's owner and CAP_FOWNER; inode(7), the sticky bit on directories) and put a listener of
// their own in its place, which QEMU, connecting by path, would then talk to. No care
// taken at bind time can prevent that, so tapgro refuses to start there.
func checkSocketDir(path string) error {
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir) // a symlinked directory is judged by what it points to
	if err != nil {
		return fmt.Errorf("netdev: socket directory: %w", err)
	}
	perm := fi.Mode()
	if perm&0o022 != 0 && perm&fs.ModeSticky == 0 {
		who := "all users"
		if perm&0o002 == 0 {
			who = "its group"
		}
		return fmt.Errorf("netdev: %s: %w: %s is mode %04o, writable by %s, so another user could swap "+
			"the socket for a listener of their own; use a directory only tapgro's user can write, "+
			"set its sticky bit (chmod +t), or pass --allow-unsafe-dir to start anyway",
			path, ErrUnsafeDir, dir, perm.Perm(), who)
	}
	return nil
}

// prepareUnixPath makes path free for bind(2). A leftover socket that nobody answers on
// (the previous tapgro was killed) is removed; a socket with a live owner is left alone
// and reported with ErrAddrInUse; anything that is not a socket is never removed
// (gvisor-tap-vsock PR #681 deleted arbitrary files this way).
// Between the probe and the bind another process could take the path; bind then fails
// with EADDRINUSE, which is reported as is.
func prepareUnixPath(path string, sotype int) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("netdev: %w", err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("netdev: %s exists and is not a socket (%s); not removing it", path, fi.Mode().Type())
	}
	// Non-blocking, so a live listener with a full backlog answers EAGAIN at once
	// instead of hanging the probe; that still means "in use".
	fd, err := unix.Socket(unix.AF_UNIX, sotype|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("netdev: probe %s: %w", path, err)
	}
	err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
	unix.Close(fd)
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("netdev: remove stale socket: %w", err)
		}
		return nil
	case err == nil, errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINPROGRESS):
		return fmt.Errorf("netdev: %s: %w", path, ErrAddrInUse)
	case errors.Is(err, unix.EPROTOTYPE):
		// A socket of the other type (stream vs datagram) is bound there: someone
		// else's, and alive or not it is not ours to remove.
		return fmt.Errorf("netdev: %s is a socket of another type; not removing it", path)
	}
	return fmt.Errorf("netdev: probe %s: %w", path, err)
}

// bindUnix creates a socket of sotype bound to path with mode 0600 (or opt's mode and
// owner) and returns it as a *os.File together with the path's identity (for removing
// exactly what we created). The chown and chmod happen between bind and listen, so no
// client can connect while the path still has umask permissions.
//
// They are not done by path: between bind and chmod another user who can write the
// directory may rename the socket away and put a symlink in its place, and chmod(2)
// follows symlinks (Linux fs/open.c: do_fchmodat looks the path up with LOOKUP_FOLLOW),
// so a root tapgro would change the mode of whatever the link points to. A socket's own
// descriptor is no help either: fchmod(2) on it changes the sockfs inode (net/socket.c,
// sock_alloc), not the file unix_bind created (net/unix/af_unix.c). So the path is opened
// once with O_PATH|O_NOFOLLOW (open(2): a symlink itself is opened, never followed),
// that inode is checked to be the one bound to our descriptor (ownSocketInode), and the
// owner and mode are set on it through the descriptor, never through the name again.
func bindUnix(path string, sotype int, opt Options) (*os.File, fs.FileInfo, error) {
	if !opt.AllowUnsafeDir {
		if err := checkSocketDir(path); err != nil {
			return nil, nil, err
		}
	}
	if err := prepareUnixPath(path, sotype); err != nil {
		return nil, nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, sotype|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("netdev: socket: %w", err)
	}
	fail := func(op string, err error) (*os.File, fs.FileInfo, error) {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("netdev: %s %s: %w", op, path, err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return fail("bind", err)
	}
	node, err := ownSocketInode(path, fd)
	if err != nil {
		// Whatever is at the path now is not ours to remove; our own inode, wherever it
		// was moved, goes when the last name of it does.
		return fail("bind", err)
	}
	defer node.Close()
	var fi fs.FileInfo
	created := func(op string, err error) (*os.File, fs.FileInfo, error) {
		if fi != nil {
			removeOurs(path, fi)
		}
		return fail(op, err)
	}
	if fi, err = node.Stat(); err != nil {
		return created("stat", err)
	}
	fi = ownSocket(path, fi)
	if opt.SocketUID > 0 || opt.SocketGID > 0 {
		uid, gid := -1, -1
		if opt.SocketUID > 0 {
			uid = opt.SocketUID
		}
		if opt.SocketGID > 0 {
			gid = opt.SocketGID
		}
		// AT_EMPTY_PATH: the inode the O_PATH descriptor holds (fchownat(2)).
		if err := unix.Fchownat(int(node.Fd()), "", uid, gid, unix.AT_EMPTY_PATH); err != nil {
			return created("chown", err)
		}
	}
	if err := fchmodPath(node, opt.mode()); err != nil {
		return created("chmod", err)
	}
	if sotype == unix.SOCK_STREAM {
		// QEMU's own stream listener uses a backlog of 0 (net/stream.c); a few slots
		// let extra clients be accepted and turned away with a reason instead of hanging.
		if err := unix.Listen(fd, 8); err != nil {
			return created("listen", err)
		}
	}
	return os.NewFile(uintptr(fd), "unix:"+path), fi, nil
}

// ownSocketInode opens what path names now without following a symlink and returns it
// if it is the inode bound to the socket sock, else an error wrapping ErrSocketReplaced.
// The comparison asks the kernel which file the socket is bound to (sock_diag(7),
// UDIAG_SHOW_VFS); where that interface is missing (a kernel without CONFIG_UNIX_DIAG)
// it falls back to "a socket owned by our effective uid", which an unprivileged user
// cannot forge for a root tapgro: a file's owner is its creator's fsuid (Linux
// fs/inode.c inode_init_owner), and protected_hardlinks (on by default) stops them
// linking in a socket they do not own.
func ownSocketInode(path string, sock int) (*os.File, error) {
	nfd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSocketReplaced, err)
	}
	node := os.NewFile(uintptr(nfd), path)
	var st unix.Stat_t
	if err := unix.Fstat(nfd, &st); err != nil {
		node.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		node.Close()
		return nil, fmt.Errorf("%w (by %s)", ErrSocketReplaced, fileKind(st.Mode))
	}
	dev, ino, err := socketVFSInode(sock)
	switch {
	case err == nil:
		if dev != st.Dev || ino != uint32(st.Ino) {
			node.Close()
			return nil, fmt.Errorf("%w (by another socket)", ErrSocketReplaced)
		}
	case st.Uid != euid:
		node.Close()
		return nil, fmt.Errorf("%w (by a socket of uid %d)", ErrSocketReplaced, st.Uid)
	}
	return node, nil
}

// fileKind names the file type of a stat(2) st_mode, for error messages.
func fileKind(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return "a device"
}

// fchmodPath sets the mode of the inode an O_PATH descriptor holds. fchmod(2) refuses
// O_PATH descriptors (EBADF, open(2)); fchmodat2(2) with AT_EMPTY_PATH (Linux 6.6) takes
// them, and before that chmod(2) of /proc/self/fd/N reaches the same inode: the proc
// magic link resolves to the file the descriptor holds, not to a name that could have
// been replaced (proc(5), /proc/pid/fd).
func fchmodPath(node *os.File, mode fs.FileMode) error {
	fd := int(node.Fd())
	err := unix.Fchmodat(fd, "", uint32(mode.Perm()), unix.AT_EMPTY_PATH)
	if err == nil || !(errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL)) {
		return err
	}
	return chmodProcFD(fd, mode)
}

// chmodProcFD is chmod(2) of /proc/self/fd/fd: the inode fd holds.
func chmodProcFD(fd int, mode fs.FileMode) error {
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), uint32(mode.Perm()))
}

// socketVFSInode asks sock_diag(7) for the device and inode of the file a bound AF_UNIX
// socket was bound to (UNIX_DIAG_VFS; the inode is reported in 32 bits). The socket is
// named by its sockfs inode, which fstat(2) of the socket descriptor reports.
func socketVFSInode(sock int) (dev uint64, ino uint32, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(sock, &st); err != nil {
		return 0, 0, err
	}
	nl, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(nl)
	// A reply that never comes must not hang the bind: 1 s is ample for a local query.
	tv := unix.Timeval{Sec: 1}
	if err := unix.SetsockoptTimeval(nl, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return 0, 0, err
	}
	const (
		udiagShowVFS = 0x2 // linux/unix_diag.h
		unixDiagVFS  = 1
		hdrLen       = unix.SizeofNlMsghdr
		reqLen       = 24 // struct unix_diag_req
		msgLen       = 16 // struct unix_diag_msg
	)
	req := make([]byte, hdrLen+reqLen)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	req[hdrLen] = unix.AF_UNIX                        // sdiag_family
	ne.PutUint32(req[hdrLen+4:], 0xffffffff)          // udiag_states: any
	ne.PutUint32(req[hdrLen+8:], uint32(st.Ino))      // udiag_ino
	ne.PutUint32(req[hdrLen+12:], udiagShowVFS)       // udiag_show
	ne.PutUint64(req[hdrLen+16:], 0xffffffffffffffff) // udiag_cookie: INET_DIAG_NOCOOKIE
	if err := unix.Sendto(nl, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, 0, err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(nl, buf, 0)
	if err != nil {
		return 0, 0, err
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, 0, err
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if e := int32(ne.Uint32(m.Data)); e != 0 {
					return 0, 0, unix.Errno(-e)
				}
			}
			return 0, 0, errors.New("sock_diag: error reply")
		case unix.SOCK_DIAG_BY_FAMILY:
			if len(m.Data) < msgLen || ne.Uint32(m.Data[4:]) != uint32(st.Ino) {
				continue
			}
			for a := m.Data[msgLen:]; len(a) >= unix.SizeofRtAttr; {
				l := int(ne.Uint16(a[0:]))
				if l < unix.SizeofRtAttr || l > len(a) {
					break
				}
				if ne.Uint16(a[2:]) == unixDiagVFS && l >= unix.SizeofRtAttr+8 {
					vino := ne.Uint32(a[4:])
					kdev := ne.Uint32(a[8:]) // the kernel's dev_t: major << 20 | minor
					return unix.Mkdev(kdev>>20, kdev&0xfffff), vino, nil
				}
				a = a[min(len(a), (l+3)&^3):]
			}
			return 0, 0, errors.New("sock_diag: socket is not bound to a file")
		}
	}
	return 0, 0, errors.New("sock_diag: no reply for the socket")
}

// listenUnix is bindUnix for a stream listener.
func listenUnix(path string, opt Options) (*net.UnixListener, fs.FileInfo, error) {
	f, fi, err := bindUnix(path, unix.SOCK_STREAM, opt)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close() // FileListener holds its own dup
	ln, err := net.FileListener(f)
	if err != nil {
		removeOurs(path, fi)
		return nil, nil, fmt.Errorf("netdev: listen %s: %w", path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // we unlink ourselves, and only our own inode
	return ul, fi, nil
}

// bindUnixgram is bindUnix for a datagram socket.
func bindUnixgram(path string, opt Options) (*net.UnixConn, fs.FileInfo, error) {
	f, fi, err := bindUnix(path, unix.SOCK_DGRAM, opt)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		removeOurs(path, fi)
		return nil, nil, fmt.Errorf("netdev: bind %s: %w", path, err)
	}
	return c.(*net.UnixConn), fi, nil
}

// ownedSocket is the identity of a socket path tapgro created, with its directory held
// open (O_PATH) so that the path can still be removed when the process no longer sees
// the filesystem by name: once confined (package sandbox), tapgro's root is an empty
// tmpfs, and the directory descriptor, with Landlock's REMOVE_FILE right on it, is
// how the socket goes at exit.
type ownedSocket struct {
	fs.FileInfo
	dir  int // O_PATH descriptor of the path's directory; -1 if it could not be opened
	name string
}

func ownSocket(path string, fi fs.FileInfo) fs.FileInfo {
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		dir = -1
	}
	return &ownedSocket{FileInfo: fi, dir: dir, name: filepath.Base(path)}
}

// removeOurs unlinks path if it is still the socket we created (same device and inode),
// so a path someone else has since bound is left alone. It looks through the directory
// held since the bind (ownedSocket) where there is one.
func removeOurs(path string, fi fs.FileInfo) {
	if fi == nil {
		return
	}
	o, ok := fi.(*ownedSocket)
	if !ok || o.dir < 0 {
		if cur, err := os.Lstat(path); err == nil && os.SameFile(fi, cur) {
			os.Remove(path)
		}
		return
	}
	dir := o.dir
	o.dir = -1
	defer unix.Close(dir)
	var cur unix.Stat_t
	st, _ := o.Sys().(*syscall.Stat_t)
	if st == nil || unix.Fstatat(dir, o.name, &cur, unix.AT_SYMLINK_NOFOLLOW) != nil {
		return
	}
	if cur.Dev == st.Dev && cur.Ino == st.Ino {
		unix.Unlinkat(dir, o.name, 0)
	}
}
