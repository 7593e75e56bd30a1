package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"tapgro/netdev"
	"tapgro/sandbox"
	"tapgro/vhostnet"
)

// Whoever can write to tapgro's port can put frames into a guest, so every way in is
// closed by default: UNIX socket paths are 0600, TCP listeners and UDP
// binds are loopback-only unless --allow-remote, and --user drops root once everything
// privileged has been opened.

// exposedAddrs lists the non-loopback addresses the port would accept frames on: a
// listening server's, or a datagram socket's local address (a datagram port takes
// frames from any sender, so it is as exposed as a listener).
func exposedAddrs(o *options) []string {
	sp := o.netdev
	if sp.Role != netdev.RoleServer && sp.Role != netdev.RoleDatagram {
		return nil
	}
	a := sp.Local
	if a.Type != netdev.AddrInet {
		return nil
	}
	if a.Host == "localhost" {
		return nil
	}
	if ip, err := netip.ParseAddr(a.Host); err == nil && ip.IsLoopback() {
		return nil
	}
	return []string{a.String()}
}

// parseSocketMode reads --socket-mode: octal permission bits, owner read-write at least
// (tapgro's own user must be able to use its socket), no execute or special bits.
func parseSocketMode(s string) (os.FileMode, error) {
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m&^0o666 != 0 || m&0o600 != 0o600 {
		return 0, fmt.Errorf("--socket-mode %q: want octal permissions with owner read-write and no execute bits, such as 0600, 0660 or 0666", s)
	}
	return os.FileMode(m), nil
}

// lookupGroup turns a group name or number into a gid.
func lookupGroup(flagName, s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("%s %q: want a group name or a gid >= 0", flagName, s)
		}
		return n, nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", flagName, s, err)
	}
	return strconv.Atoi(g.Gid)
}

// account is who tapgro becomes after the privileged set-up (--user, --group).
type account struct {
	name     string
	uid, gid int
}

func (a *account) String() string {
	return fmt.Sprintf("%s (uid %d, gid %d)", a.name, a.uid, a.gid)
}

// parseAccount resolves --user and --group. A numeric uid with no passwd entry is
// allowed with an explicit --group, so a container without /etc/passwd can use it.
func parseAccount(userName, groupName string) (*account, error) {
	if userName == "" {
		if groupName != "" {
			return nil, errors.New("--group needs --user")
		}
		return nil, nil
	}
	a := &account{name: userName, gid: -1}
	if n, err := strconv.Atoi(userName); err == nil {
		if n < 0 {
			return nil, fmt.Errorf("--user %q: want a user name or a uid >= 0", userName)
		}
		a.uid = n
		if u, err := user.LookupId(userName); err == nil {
			a.name = u.Username
			a.gid, _ = strconv.Atoi(u.Gid)
		}
	} else {
		u, err := user.Lookup(userName)
		if err != nil {
			return nil, fmt.Errorf("--user %q: %w", userName, err)
		}
		a.uid, _ = strconv.Atoi(u.Uid)
		a.gid, _ = strconv.Atoi(u.Gid)
	}
	if groupName != "" {
		gid, err := lookupGroup("--group", groupName)
		if err != nil {
			return nil, err
		}
		a.gid = gid
	}
	if a.gid < 0 {
		return nil, fmt.Errorf("--user %q has no passwd entry to take a group from; add --group", userName)
	}
	if a.uid == 0 {
		return nil, fmt.Errorf("--user %q is root: there would be nothing to drop", userName)
	}
	return a, nil
}

// socketOptions are the endpoint settings the security flags decide. Socket paths are
// owned by the --user account, so "0600" keeps meaning "only the user tapgro runs as".
func socketOptions(o *options, listenFDs []int) netdev.Options {
	opt := netdev.Options{SocketMode: o.socketMode, SocketGID: o.socketGroup, ListenFDs: listenFDs,
		AllowUnsafeDir: o.allowUnsafeDir}
	if o.user != nil {
		opt.SocketUID = o.user.uid
		if opt.SocketGID == 0 {
			opt.SocketGID = o.user.gid
		}
	}
	return opt
}

// dropPrivileges becomes a, for good: supplementary groups, gid, then uid (the other
// order would leave no right to change groups). Since Go 1.16 these calls apply to
// every thread of the process on Linux (they go through AllThreadsSyscall, or libc's
// setxid broadcast with cgo). Leaving uid 0 clears the permitted and effective capability
// sets (capabilities(7): no SECBIT_KEEP_CAPS is set), so nothing privileged is kept:
// the datapath only reads and writes descriptors already open.
//
// What needs root afterwards, and so stops working: re-registering a netmap port
// (/dev/netmap), unlinking a socket path in a directory the account cannot write (the
// stale path is replaced at the next start instead), dialling a peer's socket the account
// may not open, and reopening a --log-file the account cannot write (the old file stays
// in use). Nothing else after start-up needs it: TUNSETOFFLOAD on an open TAP checks no
// capability, and netlink is only read (the TAP's addresses for announcements).
func dropPrivileges(a *account) error {
	if err := syscall.Setgroups([]int{a.gid}); err != nil {
		return fmt.Errorf("--user %s: setgroups: %w", a, err)
	}
	if err := syscall.Setgid(a.gid); err != nil {
		return fmt.Errorf("--user %s: setgid: %w", a, err)
	}
	if err := syscall.Setuid(a.uid); err != nil {
		return fmt.Errorf("--user %s: setuid: %w", a, err)
	}
	// no_new_privs is a per-thread attribute; AllThreadsSyscall sets it on every thread,
	// but exists only in binaries built without cgo (ENOTSUP otherwise). tapgro execs
	// nothing, so this is defence in depth, not the drop itself.
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); errno != 0 && errno != syscall.ENOTSUP {
		return fmt.Errorf("--user %s: PR_SET_NO_NEW_PRIVS: %w", a, errno)
	}
	// Prove it: a process that can become root again has dropped nothing.
	if err := syscall.Setuid(0); err == nil {
		return fmt.Errorf("--user %s: setuid(0) still succeeds after the drop", a)
	}
	if os.Getuid() != a.uid || os.Geteuid() != a.uid || os.Getgid() != a.gid {
		return fmt.Errorf("--user %s: still uid %d euid %d gid %d", a, os.Getuid(), os.Geteuid(), os.Getgid())
	}
	return checkNoCaps()
}

// checkNoCaps reads the effective capability set back from /proc/self/status.
func checkNoCaps() error {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil // no procfs: the setuid(0) check above has to do
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			if n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && n != 0 {
				return fmt.Errorf("capabilities left after dropping privileges: CapEff %s", strings.TrimSpace(v))
			}
		}
	}
	return nil
}

// peerList is --allow-peer: uid:USER and gid:GROUP entries, names or numbers, comma
// separated and repeatable, resolved at start (vhostnet.Peers says how they are used).
type peerList []string

func (p *peerList) String() string { return strings.Join(*p, ",") }

func (p *peerList) Set(v string) error {
	for _, e := range strings.Split(v, ",") {
		kind, who, ok := strings.Cut(strings.TrimSpace(e), ":")
		if !ok || (kind != "uid" && kind != "gid") || who == "" {
			return fmt.Errorf("%q: want uid:USER or gid:GROUP (a name or a number)", e)
		}
		*p = append(*p, kind+":"+who)
	}
	return nil
}

// errUnmapped: SO_PEERCRED reports ids in the reader's user namespace, and the one a
// tapgro started unprivileged runs in maps only the starting user and group.
var errUnmapped = errors.New("not visible in tapgro's user namespace (started unprivileged, only the starting user and group are; start as root, or allow only those)")

// resolve looks the entries up and translates them into the user namespace tapgro
// runs in, where SO_PEERCRED reports them.
func (p peerList) resolve() (vhostnet.Peers, error) {
	var out vhostnet.Peers
	for _, e := range p {
		kind, who, _ := strings.Cut(e, ":")
		if kind == "gid" {
			gid, err := lookupGroup("--allow-peer", who)
			if err != nil {
				return out, err
			}
			in, ok := sandbox.NamespaceID(uint32(gid), true)
			if !ok {
				return out, fmt.Errorf("--allow-peer gid:%s: %w", who, errUnmapped)
			}
			out.GIDs = append(out.GIDs, in)
			continue
		}
		uid, err := strconv.Atoi(who)
		if err != nil {
			u, lerr := user.Lookup(who)
			if lerr != nil {
				return out, fmt.Errorf("--allow-peer uid:%s: %w", who, lerr)
			}
			uid, _ = strconv.Atoi(u.Uid)
		}
		if uid < 0 {
			return out, fmt.Errorf("--allow-peer uid:%s: want a user name or a uid >= 0", who)
		}
		in, ok := sandbox.NamespaceID(uint32(uid), false)
		if !ok {
			return out, fmt.Errorf("--allow-peer uid:%s: %w", who, errUnmapped)
		}
		out.UIDs = append(out.UIDs, in)
	}
	return out, nil
}
