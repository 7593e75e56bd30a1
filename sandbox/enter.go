package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"
)

// Mode is --sandbox.
type Mode int

const (
	// On confines the process; an unlisted system call traps.
	On Mode = iota
	// Log confines the process, but an unlisted system call is allowed and logged by
	// the kernel (dmesg: "audit: type=1326 ... syscall=N"). For debugging only.
	Log
	// Off leaves the process as set-up left it (apart from --user).
	Off
)

// ParseMode reads --sandbox.
func ParseMode(s string) (Mode, error) {
	switch s {
	case "on":
		return On, nil
	case "log":
		return Log, nil
	case "off":
		return Off, nil
	}
	return Off, fmt.Errorf("--sandbox %q: want on, log or off", s)
}

func (m Mode) String() string { return [...]string{"on", "log", "off"}[m] }

// Account is who the process becomes (--user), resolved before Enter: nothing can be
// looked up by name afterwards.
type Account struct {
	UID, GID int
}

// Plan is what the process keeps after Enter.
type Plan struct {
	Mode  Mode
	Needs Needs
	// WriteDirs are directories whose files are opened by name at run time (the log
	// on SIGHUP, capture files): kept at their paths, files in them may be created,
	// written and truncated.
	WriteDirs []string
	// DialDirs are directories of UNIX socket paths dialled at run time: kept at their
	// paths, read-only.
	DialDirs []string
	// RemoveDirs are directories of sockets tapgro created and removes at exit through
	// a descriptor of the directory (package netdev): removing files there is allowed.
	RemoveDirs []string
	// TCPConnectPorts are the TCP ports a client port connects to.
	TCPConnectPorts []uint16
	// AbstractUnix: the port dials or binds an abstract UNIX socket, so abstract
	// sockets are not scoped.
	AbstractUnix bool
	// User, when set, is taken before the capabilities go.
	User *Account
	// Netlink is kept open (the TAP's addresses); nothing to do here, named so that the
	// report can say it.
}

// Report is what Enter put in force, for the start-up line and tapgro ctl status.
type Report struct {
	Mode       Mode
	Namespaces string // "mnt,ipc,uts" or why none
	Root       string // "empty tmpfs" (+ kept paths) or why the host's
	Caps       string // "none", or what is left and why
	NoNewPrivs bool
	Landlock   string // "ABI 7" or why not
	Seccomp    string // "N calls, trap" or why not
	Calls      int
}

func (r Report) String() string {
	if r.Mode == Off {
		return "off (--sandbox off)"
	}
	return fmt.Sprintf("namespaces %s; root %s; capabilities %s; no_new_privs %t; landlock %s; seccomp %s",
		r.Namespaces, r.Root, r.Caps, r.NoNewPrivs, r.Landlock, r.Seccomp)
}

// Fields is Report as key-value pairs for a structured log line.
func (r Report) Fields() map[string]any {
	if r.Mode == Off {
		return map[string]any{"sandbox": "off"}
	}
	return map[string]any{
		"sandbox": r.Mode.String(), "sandbox_ns": r.Namespaces, "sandbox_root": r.Root,
		"sandbox_caps": r.Caps, "sandbox_landlock": r.Landlock, "sandbox_seccomp": r.Seccomp,
	}
}

// Enter confines the process as the package doc describes. It must run after every
// privileged step of set-up and before the data path starts taking peer input. An
// error leaves the process partly confined; the caller exits.
func Enter(p Plan) (Report, error) {
	r := Report{Mode: p.Mode}
	if p.Mode == Off {
		if p.User != nil {
			if err := becomeUser(p.User); err != nil {
				return r, err
			}
		}
		return r, nil
	}
	if inUserNS && p.User != nil {
		return r, errors.New("sandbox: --user needs a start as root; started unprivileged, tapgro keeps the account that started it")
	}
	// The directories Landlock's rules name, held before the pivot makes them
	// unreachable by path.
	dirs, err := openRuleDirs(p)
	if err != nil {
		return r, err
	}
	defer func() { dirs.close() }()
	if err := enterRoot(p, &r); err != nil {
		return r, err
	}
	if psxNeedsProc {
		// psx confirms each all-threads call by listing /proc/PID/task, also right
		// after the calling thread got the Landlock domain: that one directory stays
		// listable.
		task := fmt.Sprintf("/proc/%d/task", os.Getpid())
		fd, err := unix.Open(task, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return r, fmt.Errorf("sandbox: %s (psx, cgo build): %w", task, err)
		}
		dirs = append(dirs, ruleDir{fd, llsys.AccessFSReadDir})
	}
	// Not dumpable: no core file with guest memory in it, and no ptrace or
	// /proc/PID/mem by processes of the same uid (ptrace(2), PR_SET_DUMPABLE). A
	// property of the memory map, so one call covers every thread.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return r, fmt.Errorf("sandbox: PR_SET_DUMPABLE: %w", err)
	}
	if err := dropCaps(p.User, &r); err != nil {
		return r, err
	}
	if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, 0); e != 0 {
		return r, fmt.Errorf("sandbox: PR_SET_NO_NEW_PRIVS: %w", e)
	}
	r.NoNewPrivs = true
	if err := restrictLandlock(p, dirs, &r); err != nil {
		return r, err
	}
	if err := loadSeccomp(p, &r); err != nil {
		return r, err
	}
	return r, nil
}

// keptDirs is every directory enterRoot binds into the new root, writable or not.
type keptDir struct {
	path     string
	writable bool
}

func keptDirs(p Plan) []keptDir {
	seen := map[string]int{}
	var out []keptDir
	add := func(d string, w bool) {
		d = filepath.Clean(d)
		if i, ok := seen[d]; ok {
			out[i].writable = out[i].writable || w
			return
		}
		seen[d] = len(out)
		out = append(out, keptDir{d, w})
	}
	for _, d := range p.WriteDirs {
		add(d, true)
	}
	for _, d := range p.DialDirs {
		add(d, false)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].path < out[j].path })
	return out
}

// enterRoot pivots into an empty tmpfs when the process is in a mount namespace of
// its own (Reexec), binding the kept directories in at their paths.
func enterRoot(p Plan, r *Report) error {
	if !reexeced {
		why := reexecSkipped
		if why == "" {
			why = "not re-executed into them"
		}
		r.Namespaces = "none (" + why + ")"
		r.Root = "the host's (Landlock denies it)"
		return nil
	}
	r.Namespaces = "mnt,ipc,uts"
	if inUserNS {
		r.Namespaces = "user (uid 0 inside = the starting uid outside),pid,mnt,ipc,uts"
		if !procOwn {
			r.Namespaces += " (the host's /proc: a new one was refused)"
		}
	}
	// Nothing done below may reach the host's mount table.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("sandbox: make mounts private: %w", err)
	}
	kept := keptDirs(p)
	// Clone each kept directory's mount now, while its path still resolves: a detached
	// copy (open_tree(2) OPEN_TREE_CLONE) survives the pivot and is attached in the new
	// root by move_mount(2).
	trees := make([]int, len(kept))
	for i, k := range kept {
		fd, err := unix.OpenTree(unix.AT_FDCWD, k.path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
		if err != nil {
			return fmt.Errorf("sandbox: keep %s: open_tree: %w", k.path, err)
		}
		defer unix.Close(fd)
		trees[i] = fd
	}
	// The new root: a tmpfs over /tmp in this namespace only (passt mounts it on
	// TMPDIR the same way), no devices, no set-uid, nothing executable.
	const base = "/tmp"
	if err := unix.Mount("tapgro", base, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, "size=1m,mode=0755"); err != nil {
		return fmt.Errorf("sandbox: mount tmpfs: %w", err)
	}
	for i, k := range kept {
		at := filepath.Join(base, k.path)
		if err := os.MkdirAll(at, 0o755); err != nil {
			return fmt.Errorf("sandbox: keep %s: %w", k.path, err)
		}
		if err := unix.MoveMount(trees[i], "", unix.AT_FDCWD, at, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("sandbox: keep %s: move_mount: %w", k.path, err)
		}
		flags := uintptr(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOEXEC)
		if !k.writable {
			flags |= unix.MOUNT_ATTR_RDONLY
		}
		attr := unix.MountAttr{Attr_set: uint64(flags)}
		if err := unix.MountSetattr(unix.AT_FDCWD, at, unix.AT_RECURSIVE, &attr); err != nil {
			return fmt.Errorf("sandbox: keep %s: mount_setattr: %w", k.path, err)
		}
	}
	if psxNeedsProc {
		at := filepath.Join(base, "proc")
		if err := os.Mkdir(at, 0o555); err != nil {
			return fmt.Errorf("sandbox: /proc for psx: %w", err)
		}
		if err := unix.Mount("proc", at, "proc", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, "subset=pid"); err != nil {
			return fmt.Errorf("sandbox: /proc for psx: %w", err)
		}
	}
	// pivot_root(".", ".") stacks the old root on top of the new one at "/", and the
	// detach takes it away (pivot_root(2) NOTES; passt isolation.c isolate_prefork).
	// Every thread's root and working directory move with it: they share one
	// fs_struct (the runtime creates threads with CLONE_FS) and pivot_root updates all
	// that pointed at the old root (fs/namespace.c chroot_fs_refs).
	if err := unix.Chdir(base); err != nil {
		return fmt.Errorf("sandbox: chdir: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("sandbox: pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("sandbox: detach the old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("sandbox: chdir /: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("sandbox: make the root read-only: %w", err)
	}
	r.Root = "empty read-only tmpfs"
	if len(kept) > 0 || psxNeedsProc {
		var names []string
		if psxNeedsProc {
			names = append(names, "/proc (cgo build: psx lists /proc/PID/task; Landlock denies the rest)")
		}
		for _, k := range kept {
			names = append(names, k.path)
		}
		r.Root += " + " + strings.Join(names, ",")
	}
	return nil
}

// dropCaps empties the bounding set while CAP_SETPCAP is still there, clears the
// ambient set, takes --user's account, then zeroes effective, permitted and
// inheritable. Each is a per-thread attribute, hence psx.
func dropCaps(u *Account, r *Report) error {
	var kept []string
	for c := 0; c <= 63; c++ {
		_, _, e := psx.Syscall3(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0)
		if e == unix.EINVAL {
			break // past CAP_LAST_CAP
		}
		if e == unix.EPERM {
			kept = append(kept, "bounding set (no CAP_SETPCAP)")
			break
		}
		if e != 0 {
			return fmt.Errorf("sandbox: PR_CAPBSET_DROP %d: %w", c, e)
		}
	}
	if _, _, e := psx.Syscall6(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0, 0); e != 0 && e != unix.EINVAL {
		return fmt.Errorf("sandbox: clear ambient capabilities: %w", e)
	}
	if u != nil {
		if err := becomeUser(u); err != nil {
			return err
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if _, _, e := psx.Syscall3(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("sandbox: capset: %w", e)
	}
	runtime.KeepAlive(&data)
	r.Caps = "none"
	if len(kept) > 0 {
		r.Caps = "none; kept: " + strings.Join(kept, ", ")
	}
	return nil
}

// becomeUser takes u's uid and gid for good. Go's syscall.Setgroups/Setgid/Setuid apply
// to every thread (AllThreadsSyscall, or libc's setxid broadcast with cgo).
func becomeUser(u *Account) error {
	if err := unix.Setgroups([]int{u.GID}); err != nil {
		return fmt.Errorf("sandbox: setgroups: %w", err)
	}
	if err := unix.Setresgid(u.GID, u.GID, u.GID); err != nil {
		return fmt.Errorf("sandbox: setresgid %d: %w", u.GID, err)
	}
	if err := unix.Setresuid(u.UID, u.UID, u.UID); err != nil {
		return fmt.Errorf("sandbox: setresuid %d: %w", u.UID, err)
	}
	if err := unix.Setuid(0); err == nil && u.UID != 0 {
		return errors.New("sandbox: setuid(0) still succeeds after taking --user's account")
	}
	return nil
}

// ruleDir is a directory a Landlock rule names, with the rights it grants.
type ruleDir struct {
	fd     int
	access uint64
}

type ruleDirs []ruleDir

func (d ruleDirs) close() {
	for _, r := range d {
		unix.Close(r.fd)
	}
}

func openRuleDirs(p Plan) (ruleDirs, error) {
	var out ruleDirs
	add := func(dir string, access uint64) error {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			out.close()
			return fmt.Errorf("sandbox: keep %s: %w", dir, err)
		}
		out = append(out, ruleDir{fd, access})
		return nil
	}
	for _, d := range p.WriteDirs {
		if err := add(d, llsys.AccessFSWriteFile|llsys.AccessFSMakeReg|llsys.AccessFSTruncate); err != nil {
			return nil, err
		}
	}
	for _, d := range p.DialDirs {
		if err := add(d, llsys.AccessFSResolveUnix); err != nil {
			return nil, err
		}
	}
	for _, d := range p.RemoveDirs {
		if err := add(d, llsys.AccessFSRemoveFile); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// restrictLandlock builds the ruleset and applies it to every thread.
func restrictLandlock(p Plan, dirs ruleDirs, r *Report) error {
	abi, err := llsys.LandlockGetABIVersion()
	if err != nil || abi < 1 {
		r.Landlock = "none (the kernel has no Landlock)"
		return nil
	}
	r.Landlock = fmt.Sprintf("ABI %d", abi)
	attr := llsys.RulesetAttr{HandledAccessFS: fsRights(abi)}
	if abi >= 4 {
		attr.HandledAccessNet = llsys.AccessNetBindTCP | llsys.AccessNetConnectTCP
	}
	if abi >= 6 {
		attr.Scoped = llsys.ScopeSignal
		if !p.AbstractUnix {
			attr.Scoped |= llsys.ScopeAbstractUnixSocket
		}
	}
	rs, err := llsys.LandlockCreateRuleset(&attr, 0)
	if err != nil {
		return fmt.Errorf("sandbox: landlock_create_ruleset: %w", err)
	}
	defer unix.Close(rs)
	for _, d := range dirs {
		access := d.access & attr.HandledAccessFS
		if access == 0 {
			continue // a right this kernel does not handle is not denied either
		}
		if err := llsys.LandlockAddPathBeneathRule(rs, &llsys.PathBeneathAttr{AllowedAccess: access, ParentFd: d.fd}, 0); err != nil {
			return fmt.Errorf("sandbox: landlock rule: %w", err)
		}
	}
	if abi >= 4 {
		for _, port := range p.TCPConnectPorts {
			if err := llsys.LandlockAddNetPortRule(rs, &llsys.NetPortAttr{AllowedAccess: llsys.AccessNetConnectTCP, Port: uint64(port)}, 0); err != nil {
				return fmt.Errorf("sandbox: landlock TCP port %d: %w", port, err)
			}
		}
	}
	if err := llsys.AllThreadsLandlockRestrictSelf(rs, 0); err != nil {
		return fmt.Errorf("sandbox: landlock_restrict_self: %w", err)
	}
	return nil
}

// fsRights is every filesystem right the kernel's ABI knows: all of them are denied
// unless a rule grants them.
func fsRights(abi int) uint64 {
	r := uint64(llsys.AccessFSExecute | llsys.AccessFSWriteFile | llsys.AccessFSReadFile |
		llsys.AccessFSReadDir | llsys.AccessFSRemoveDir | llsys.AccessFSRemoveFile |
		llsys.AccessFSMakeChar | llsys.AccessFSMakeDir | llsys.AccessFSMakeReg |
		llsys.AccessFSMakeSock | llsys.AccessFSMakeFifo | llsys.AccessFSMakeBlock | llsys.AccessFSMakeSym)
	if abi >= 2 {
		r |= llsys.AccessFSRefer
	}
	if abi >= 3 {
		r |= llsys.AccessFSTruncate
	}
	if abi >= 5 {
		r |= llsys.AccessFSIoctlDev
	}
	if abi >= 9 {
		r |= llsys.AccessFSResolveUnix
	}
	return r
}

// loadSeccomp installs the allow-list on every thread.
func loadSeccomp(p Plan, r *Report) error {
	if !seccomp.Supported() {
		r.Seccomp = "none (the kernel has no seccomp filters)"
		return nil
	}
	def := seccomp.ActionTrap
	verdict := "trap"
	if p.Mode == Log {
		def, verdict = seccomp.ActionLog, "log (allows every call)"
	}
	pol := policy(p.Needs, def)
	if err := seccomp.LoadFilter(seccomp.Filter{NoNewPrivs: true, Flag: seccomp.FilterFlagTSync, Policy: pol}); err != nil {
		return fmt.Errorf("sandbox: seccomp: %w", err)
	}
	r.Calls = len(Calls(p.Needs))
	r.Seccomp = fmt.Sprintf("%d calls allowed, others %s", r.Calls, verdict)
	return nil
}
