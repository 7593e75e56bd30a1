package main

import (
	"path/filepath"

	"tapgro/netdev"
	"tapgro/sandbox"
)

// sandboxPlan is what tapgro keeps once confined (package sandbox), from the flags:
// the system calls of its port kind, the directories it opens files in by name at run
// time (the log on SIGHUP, captures: --log-file, --pcap-*, --pcap-dir), the socket
// directories it dials (client mode) or removes its own sockets from at exit, and the
// TCP port a client port connects to.
func sandboxPlan(o *options) sandbox.Plan {
	p := sandbox.Plan{Mode: o.sandbox}
	sp := o.netdev
	switch sp.Backend {
	case netdev.BackendVhostUser:
		p.Needs |= sandbox.NeedVhostUser
		if sp.Role != netdev.RoleServer {
			p.Needs |= sandbox.NeedDial
			p.DialDirs = append(p.DialDirs, filepath.Dir(sp.Remote.Path))
		} else if sp.Local.Type != netdev.AddrFD {
			p.RemoveDirs = append(p.RemoveDirs, filepath.Dir(sp.Local.Path))
		}
	case netdev.BackendNetmap:
		p.Needs |= sandbox.NeedNetmap
	default:
		if sp.Role == netdev.RoleClient && sp.Remote.Type != netdev.AddrFD {
			p.Needs |= sandbox.NeedDial
			switch sp.Remote.Type {
			case netdev.AddrUnix:
				p.DialDirs = append(p.DialDirs, filepath.Dir(sp.Remote.Path))
			default:
				p.TCPConnectPorts = append(p.TCPConnectPorts, sp.Remote.Port)
			}
		}
		// A datagram port sends to its peer's path with every frame: sendto(2) resolves
		// it each time.
		if sp.Role == netdev.RoleDatagram && sp.Remote.Type == netdev.AddrUnix {
			p.DialDirs = append(p.DialDirs, filepath.Dir(sp.Remote.Path))
		}
		if (sp.Role == netdev.RoleServer || sp.Role == netdev.RoleDatagram) && sp.Local.Type == netdev.AddrUnix {
			p.RemoveDirs = append(p.RemoveDirs, filepath.Dir(sp.Local.Path))
		}
	}
	if o.ctlSocket != "" {
		p.RemoveDirs = append(p.RemoveDirs, filepath.Dir(o.ctlSocket))
	}
	for _, f := range []string{o.logFile, o.pcapTap, o.pcapPort} {
		if f != "" {
			p.WriteDirs = append(p.WriteDirs, filepath.Dir(f))
		}
	}
	if o.pcapDir != "" {
		p.WriteDirs = append(p.WriteDirs, o.pcapDir)
	}
	if o.user != nil {
		p.User = &sandbox.Account{UID: o.user.uid, GID: o.user.gid}
	}
	return p
}
