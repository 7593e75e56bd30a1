// Package netdev turns a --netdev string into endpoints and connections: it parses the
// spec (QEMU's -netdev syntax from tapgro's side), plays the role the spec names
// (listen, dial, bind, adopt a supervisor's socket, register a netmap port) and hands
// out one live Port at a time, built by package sockport (stream and datagram sockets)
// or netmapio (netmap). It owns every socket path tapgro creates and the rules that
// keep them safe. It never touches frames: what crosses a Port is the transports'
// business.
//
// # Specs
//
// A Spec (ParseSpec) mirrors QEMU's -netdev syntax from tapgro's side; Spec.QEMUOption
// prints the matching option for QEMU (the mirror image: tapgro server means QEMU client,
// datagram local and remote swap). A netmap ifname= is checked by netmapio.ParseName, the
// decoder netmapio.Open registers with, so a name that parses is one the port accepts.
// Spec.PortCaps is what the spec's ports will carry and accept, which the engine needs
// to set the TAP's offloads before the first peer connects.
//
// # Roles and reconnecting
//
// An Endpoint (Open) turns a Spec into a sequence of Ports, one live at a time. Each
// role is one small type (server.go, client.go, inherit.go, dgram.go, netmap.go) on the
// bookkeeping they share (core: the live Port, the counters, the close sequence); a
// Port's Close releases the role for the next one through port.Base's close hook, so the
// Port handed out is the transport's own type and keeps its optional capabilities.
//
//   - server (stream server=on, socket listen=): listens and serves one client at a time,
//     as QEMU's own listeners do. An accept goroutine takes every further connection and
//     closes it at once, reporting OnReject with the peer's SO_PEERCRED pid/uid (UNIX) or
//     address (TCP), so a second client gets a clean refusal rather than a hang. When the
//     live Port is closed, Next hands out the next client. A UNIX socket path is created
//     with mode 0600 (set between bind and listen; see Socket paths below); an existing
//     path is removed only if it is a socket that nobody answers on (a leftover of a
//     killed tapgro), a live one is reported with ErrAddrInUse, and a path that is not a
//     socket is never touched. Close removes the path only if it is still the inode we
//     created (same device and inode number).
//   - client (stream server=off, socket connect=): Next dials, retrying with exponential
//     backoff from 100 ms to 5 s (each failure reported with OnRetry) until it connects
//     or ctx ends; after a Port dies, the next Next dials again, after a pause if the
//     connection lasted under a second. That policy is package redial, which
//     vhostnet's Net.ServeClient (vhost-user server=off) uses as well.
//   - inheritedConn (stream server=off,addr.type=fd, socket,fd=N): the connected socket a
//     supervisor passed, handed out once (see below).
//   - datagram (socket udp=, dgram): Open binds; Next returns that socket at once, and
//     after it is closed binds a fresh one at the same address.
//   - attach (netmap): Open registers the port; Next returns it at once, and after it
//     is closed registers it again (fresh rings; the header length is set again).
//
// A vnet-hdr=on stream runs sockport's hello on every connection before Next returns it;
// a peer that fails it (QEMU, a plain tapgro) is reported with OnHelloFail and the role
// goes on (the server waits for the next client, the client backs off and dials again).
//
// Why the client side retries and which side to pick: QEMU 7.2 (Debian 12) has no
// reconnect= for a stream client, so a QEMU client that loses tapgro stays down until QEMU
// restarts (QEMU net/stream.c; reconnect= arrived in 8.0, reconnect-ms= in 9.2, see
// NetdevStreamOptions in qapi/net.json). A QEMU server, on the other hand, re-arms its
// listener after a disconnect. So with QEMU 7.2 the arrangement that survives a restart of
// either process is QEMU server=on and tapgro server=off: tapgro keeps dialling until QEMU
// listens again. With tapgro as the server, a tapgro restart needs QEMU >= 8.0 with
// reconnect=. Legacy socket behaves the same way (connect= never reconnects, listen=
// re-accepts). Datagram links have no connection to lose. While the link is down QEMU
// silently discards guest transmits.
//
// # Inherited sockets and socket permissions
//
// A supervisor may hand tapgro its socket instead (inherit.go), in QEMU's own words:
// stream,server=on,addr.type=fd,addr.str=N is a listening socket, server=off (or socket,fd=N)
// a connected stream. The descriptor is checked at Open (a socket, a stream, listening or
// not as the role needs), so a wrong number fails at start-up with a reason. An inherited
// connection cannot be redialled: once it ends, Next returns ErrInheritedClosed. systemd
// socket activation (ListenFDs: LISTEN_PID must be this process, fds 3..3+LISTEN_FDS-1;
// the variables are removed from the environment, as sd_listen_fds(3) describes) is
// passed in Options.ListenFDs: a server whose addr.path or host:port is the address a
// passed socket is bound to uses it instead of binding, so one command line works with
// and without activation. A path the endpoint did not create (inherited) is never
// removed. Options also set the mode (default 0600), owner and group given to socket
// paths the endpoint creates, between bind and listen. SpecOf reports the spec with an
// inherited listener resolved to its address, for the QEMU option printed at start-up.
//
// # Socket paths
//
// Every socket path the package creates (a server's listener, a datagram port's local
// path, and through ListenUnix tapgro's control socket) follows the same rules.
//
// The directory must not be writable by other users unless it has the sticky bit: Open
// and ListenUnix fail with ErrUnsafeDir for a group- or world-writable directory without
// it (Options.AllowUnsafeDir, --allow-unsafe-dir, waives this). Whoever can write such a
// directory can rename tapgro's socket and bind a listener of their own in its place,
// and QEMU, which connects by path, would talk to it; nothing done at bind time can
// prevent that. The sticky bit restricts renaming and unlinking an entry to its owner,
// the directory's owner and root (inode(7)), which closes it.
//
// The mode and owner are never set through the path: between bind(2) and chmod(2)
// another user who can write the directory could put a symlink where the socket was,
// and chmod and chown follow symlinks, so a root tapgro would widen the mode of any file
// the link names. fchmod(2) on the socket's descriptor does not help (it changes the
// sockfs inode, not the file bind created). Instead the path is opened once with
// O_PATH|O_NOFOLLOW, which opens a symlink itself rather than its target; the inode must
// be a socket and the very one bound to our descriptor (the kernel says which through
// sock_diag(7) UDIAG_SHOW_VFS; without CONFIG_UNIX_DIAG, a socket owned by our effective
// uid, which an unprivileged user cannot create), else bind fails with
// ErrSocketReplaced and nothing at the path is changed. The owner is then set with
// fchownat(AT_EMPTY_PATH) and the mode with fchmodat2(AT_EMPTY_PATH) (Linux >= 6.6) or
// chmod of /proc/self/fd/N, all on that descriptor. Only then does a stream socket
// listen, so no client ever connects while the path has umask permissions.
//
// # Memory a peer can cause
//
// A server serves one client and closes every other at accept, so at most one
// connection's buffers are live (extra clients cost only the transient socket); what a
// connection itself may cost is bounded by the transports (package sockport).
//
// # What this package does not do
//
// It does not log (Events tells the supervisor what happened), apply policy on remote
// listening addresses (a non-loopback host is used exactly as given; --allow-remote is
// the caller's), implement multicast, or take inherited datagram sockets.
package netdev
