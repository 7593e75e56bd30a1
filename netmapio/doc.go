// Package netmapio connects tapgro to QEMU's socket-family network backends (-netdev
// stream, socket and dgram) and to netmap ports (-netdev netmap: a VALE switch, a NIC in
// netmap mode, a netmap pipe). Everything on the far side of a Port is untrusted input.
//
// # Ports
//
// A Port is one live link to a peer. It moves Ethernet frames in batches: ReadBatch
// fills caller-owned buffers with every frame that is ready, blocking only when none is;
// WriteBatch hands many frames to the kernel per system call. One goroutine reads and
// another writes, each owning its half of the port's state, so the data path takes no
// locks and allocates nothing in steady state (each port preallocates its receive buffer,
// iovecs, length prefixes and mmsghdrs). The packet path never logs: drops and errors go
// to the atomic counters in Stats.
//
// QEMU's socket-family backends carry no virtio_net_hdr (net/socket.c, net/stream.c and
// net/dgram.c define no has_vnet_hdr, so hw/net/virtio-net.c offers the guest no offloads
// and writes it zero headers): for their Ports VnetHdrLen() == 0 and Accepts() == 0, so
// frames written to them must be plain, fully checksummed and no larger than the MTU, and
// the pipelines do GSO splitting and checksum completion before WriteBatch.
//
// The exception is tapgro's own vnet-hdr=on stream (vnetstream.go), for a link between
// two tapgro instances: a 16-byte hello in both directions ("TAPGRO\x00", version,
// header length, accepted offloads; 5 s timeout), then records of [length][12-byte
// virtio_net_hdr][frame], so 64 KiB GSO frames cross whole. QEMU, or a plain tapgro,
// fails the hello at once on both ends. Over AF_UNIX the two ends may also agree on
// shared-memory rings (shm.go): large frames then stay in a memfd slot the sender read
// the TAP into, a descriptor crosses the stream in their place, and the receiver writes
// the TAP from the slot (ShmSender on the sending side, Lender on the receiving one).
// Every Port is also a VnetBackend (backend.go), QEMU's backend offload callbacks
// (NetClientInfo's has_vnet_hdr, has_vnet_hdr_len, has_ufo, has_uso, set_offload and
// set_vnet_hdr_len in QEMU include/net/net.h) as one interface.
//
// # Framing
//
// Stream links (TCP or UNIX; -netdev stream and socket listen=/connect=) carry records
// of a 4-byte big-endian length followed by that many bytes of Ethernet frame; the length
// excludes the prefix (QEMU net/net.c net_fill_rstate).
//
//	+--------+--------+--------+--------+-------------------------------+
//	|          length (uint32 BE)       |  Ethernet frame (length bytes) | ...
//	+--------+--------+--------+--------+-------------------------------+
//
// StreamPort reads with one read(2) into a 256 KiB buffer per connection (allocated once),
// then walks the prefixes with a Deframer: every complete frame is copied out, and a
// trailing partial frame is moved to the front of the buffer and completed by later
// reads. It writes up to 512 frames per writev(2) (IOV_MAX is 1024 iovecs: a prefix and
// a frame each), resuming mid-iovec after short writes, so the peer always sees one
// contiguous byte stream. When the socket is full, the Go netpoller waits for
// writability; nothing spins.
//
// Ports also implement BatchSender for the TAP→port receive pool (package rxpool):
// TryWriteBatch writes until the socket is full and returns ErrWouldBlock instead of
// waiting (a stream record the kernel took in part is resumed by the next call, which
// must begin with the same frame), WaitWritable parks in the netpoller, and Room reads
// SIOCOUTQ against SO_SNDBUF so the pool can wait for enough room to flush in one go.
//
// Datagram links (UDP, or AF_UNIX datagrams; -netdev dgram and socket udp=) carry one
// frame per datagram with no prefix. DgramPort moves up to 512 datagrams per
// recvmmsg(2)/sendmmsg(2), sends to the one configured remote address and accepts
// datagrams from any source, as QEMU does (net/socket.c net_socket_udp_init, net/dgram.c).
//
// # netmap
//
// NetmapPort (spec netmap,ifname=NAME[,vnet-hdr=0|10|12]) opens /dev/netmap, registers
// the port with the API v14 request (NIOCCTRL, NETMAP_REQ_REGISTER, all NIC rings of
// the name — or its host rings with "^", both with "*" — and NR_NO_TX_POLL, since it
// syncs TX itself), maps the region and walks netmap_if → rings → slots → buffers
// (netmap sys/net/netmap.h, sys/net/netmap_user.h). On a VALE port it then sets the
// virtio-net header length with NETMAP_REQ_PORT_HDR_SET (the port must exist first, so this
// comes after registering; NR_ACCEPT_VNET_HDR lets a persistent port that already has a
// header register at all), reads it back, and discards whatever arrived before with the old
// length. Between VALE ports of equal header length frames cross untouched, so with
// vnet-hdr=12 (what QEMU uses once the guest acks VERSION_1 or MRG_RXBUF) 64 KB GSO frames
// pass both ways unsegmented; Accepts() is then CSUM|TSO4|TSO6|TSO_ECN|UFO (UFO by QEMU's
// rule; no USO: QEMU's netmap backend never offers it and VALE cannot segment it). Without
// /dev/netmap Open fails with ErrNoNetmap: the module is out-of-tree and must be loaded.
//
// Reads run one NIOCRXSYNC per batch (none when Pending), copy every complete packet out
// and hand the slots back (head = cur) at the next sync. A packet longer than a buffer
// (2048 bytes by default) spans consecutive slots, all but the last flagged NS_MOREFRAG,
// at most 64 (NETMAP_MAX_FRAGS); a chain cut at tail is not released — head stays at its
// first slot, cur runs ahead to tail — until the rest arrives. Writes copy each frame
// into as many TX slots as it needs, header whole in the first, and publish head = cur
// once per batch before one NIOCTXSYNC; a frame that does not fit whole waits (cur =
// tail, then poll), so the peer never sees part of one. Only TX ring 0 is used, keeping
// frames in order. The /dev/netmap descriptor sits in the Go netpoller (netmap's poll
// registers its wait queues unconditionally on Linux, so epoll works; it is added only
// after registration, before which poll registers nothing). Every access to the shared
// region happens inside a RawConn callback, which holds the descriptor open, so Close
// can unmap safely once the file is closed.
//
// The region is written by the kernel on behalf of another process and is not trusted.
// All access to it is in netmap_unsafe.go: ring offsets, slot counts, buffer sizes and
// buf_ofs are checked against the mapping when the port opens; every buf_idx and len is
// checked on use. A bad RX slot drops its packet (NetmapStats.BadSlot), a chain longer
// than 64 slots or filling the whole ring is dropped (BadChain), an out-of-range or
// backwards tail, or a TX slot whose buffer lies outside the region, ends the port with a
// *RingError (BadRing), and the Endpoint registers afresh on the next Next. The ring
// logic (netmap_ring.go) is OS-independent and is tested against an in-process model of
// the kernel's memory layout and sync behaviour; it has not been run against a real
// netmap module here.
//
// # Limits
//
// A frame is 14 bytes (MinFrame, an Ethernet header) to 69632 bytes (MaxFrame, QEMU's
// NET_BUFSIZE = 4096 + 65536). On a stream, a length prefix outside that range means the
// peer is broken or hostile and the stream has lost sync: ReadBatch returns a *FrameError
// with the length and the limit, counts it in Stats.BadLength, and the caller must Close
// the Port (QEMU itself drops the connection on an oversized record; passt resets it on a
// short one). A length of 0 is not rejected by QEMU but we never send one. A stream that
// ends in the middle of a frame is reported as such (io.ErrUnexpectedEOF). On a datagram
// link a bad-sized datagram is only dropped and counted (ShortDatagram,
// OversizeDatagram); oversize ones are detected with MSG_TRUNC. WriteBatch refuses to send
// a frame outside the range on any port, returning a *FrameError for it.
//
// # Roles and reconnecting
//
// A Spec (ParseSpec) mirrors QEMU's -netdev syntax from tapgro's side; Spec.QEMUOption
// prints the matching option for QEMU. An Endpoint (Open) turns a Spec into a sequence of
// Ports, one live at a time:
//
//   - Server (stream server=on, socket listen=): listens and serves one client at a time,
//     as QEMU's own listeners do. An accept goroutine takes every further connection and
//     closes it at once, reporting OnReject with the peer's SO_PEERCRED pid/uid (UNIX) or
//     address (TCP), so a second client gets a clean refusal rather than a hang. When the
//     live Port is closed, Next hands out the next client. A UNIX socket path is created
//     with mode 0600 (set between bind and listen; see Socket paths below); an existing
//     path is removed only if it is a socket that nobody answers on (a leftover of a
//     killed tapgro), a live one is reported with ErrAddrInUse, and a path that is not a
//     socket is never touched. Close removes the path only if it is still the inode we
//     created (same device and inode number).
//   - Client (stream server=off, socket connect=): Next dials, retrying with exponential
//     backoff from 100 ms to 5 s (each failure reported with OnRetry) until it connects
//     or ctx ends; after a Port dies, the next Next dials again.
//   - Datagram (socket udp=, dgram): Open binds; Next returns that socket at once, and
//     after it is closed binds a fresh one at the same address.
//   - Attach (netmap): Open registers the port; Next returns it at once, and after it
//     is closed registers it again (fresh rings; the header length is set again).
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
// the variables are removed from the environment) is passed in Options.ListenFDs: a
// server whose addr.path or host:port is the address a passed socket is bound to uses
// it instead of binding, so one command line works with and without activation. A path
// the endpoint did not create (inherited) is never removed. Options also set the mode
// (default 0600), owner and group given to socket paths the endpoint creates, between
// bind and listen. Endpoint.Spec (SpecOf) reports the spec with an inherited listener
// resolved to its address, for the QEMU option printed at start-up.
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
// Nothing a peer sends grows memory beyond fixed bounds: a stream port reads into one
// 256 KiB buffer per connection and rejects any length prefix above MaxFrame before
// reading the record; a datagram port receives into the caller's buffers and drops what
// does not fit (MSG_TRUNC); a server serves one client and closes every other at
// accept, so at most one connection's buffers are live (extra clients cost only the
// transient socket). The callers' buffers (batch x (MaxFrame + header)) are allocated per
// connection by the pipelines, never per frame.
//
// # What this package does not do
//
// It does not log, apply policy on remote listening addresses (a non-loopback host is
// used exactly as given; --allow-remote is the caller's), implement multicast,
// inherited datagram sockets or vnet headers on streams, use more than one netmap TX ring,
// or use netmap's zero-copy buffer swapping (frames are copied in and out of the
// rings). It never segments or checksums frames; the pipelines do that before
// WriteBatch.
package netmapio
