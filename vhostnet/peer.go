//go:build linux

package vhostnet

import (
	"fmt"
	"net"
	"slices"

	"golang.org/x/sys/unix"
)

// Peers lets only chosen front-ends in, by the credentials the kernel recorded for the
// other end of the UNIX socket (SO_PEERCRED, socket(7); net/unix/af_unix.c copies them at
// connect(2) for the connecting side and at listen(2) for the listening one). So for a
// connection tapgro accepted they are the connecting process's, and for one it dialled
// (server=off) the process that listens on QEMU's socket. A peer is allowed when its uid
// is one of UIDs or its gid one of GIDs; with both empty everyone is, and the socket's
// own permissions decide (0600 by default: tapgro's user and root).
type Peers struct{ UIDs, GIDs []uint32 }

// Empty reports whether p allows every peer.
func (p Peers) Empty() bool { return len(p.UIDs) == 0 && len(p.GIDs) == 0 }

func (p Peers) allows(c *unix.Ucred) bool {
	return p.Empty() || slices.Contains(p.UIDs, c.Uid) || slices.Contains(p.GIDs, c.Gid)
}

func (p Peers) String() string {
	return fmt.Sprintf("uids %v gids %v", p.UIDs, p.GIDs)
}

// peerCred reads SO_PEERCRED of uc.
func peerCred(uc *net.UnixConn) (*unix.Ucred, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var c *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { c, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return c, cerr
}

// admit checks uc's peer against n.peers, logs it, and reports whether to serve it; a
// refused connection is closed here.
func (n *Net) admit(uc *net.UnixConn, how string) bool {
	c, err := peerCred(uc)
	if err != nil {
		n.log.Warn("vhostnet: closed a front-end whose credentials could not be read (SO_PEERCRED)",
			"how", how, "error", err)
		uc.Close()
		return false
	}
	ok := n.peers.allows(c)
	key := fmt.Sprint(ok, c.Uid, c.Gid) // logged when who connects changes, else now and then
	if ok {
		n.peerLine(&n.gates.peer, key, n.log.Info, "vhostnet: front-end connected",
			"how", how, "pid", c.Pid, "uid", c.Uid, "gid", c.Gid)
	} else {
		n.BackendStats().PeerRefused.Add(1)
		n.peerLine(&n.gates.peer, key, n.log.Warn, "vhostnet: refused a front-end that is not allowed",
			"allowed", n.peers.String(), "pid", c.Pid, "uid", c.Uid, "gid", c.Gid)
	}
	if !ok {
		uc.Close()
	}
	return ok
}
