// Package sockport is the socket transports: QEMU's socket-family network backends
// (-netdev stream, socket and dgram) and tapgro's own vnet-hdr=on stream between two
// tapgro instances, with its shared-memory rings. Each is a port.Port over one
// connected or bound socket; package netdev makes the sockets and hands the Ports out.
// Everything on the far side of a Port is untrusted input.
//
// # Ports
//
// A Port moves Ethernet frames in batches: ReadBatch fills caller-owned buffers with
// every frame that is ready, blocking only when none is; WriteBatch hands many frames to
// the kernel per system call. One goroutine reads and another writes, each owning its
// half of the port's state, so the data path takes no locks and allocates nothing in
// steady state (each port preallocates its receive buffer, iovecs, length prefixes and
// mmsghdrs). The packet path never logs: drops and errors go to the atomic counters in
// port.Stats.
//
// QEMU's socket-family backends carry no virtio_net_hdr (net/socket.c, net/stream.c and
// net/dgram.c define no has_vnet_hdr, so hw/net/virtio-net.c offers the guest no offloads
// and writes it zero headers): for their Ports VnetHdrLen() == 0 and Accepts() == 0, so
// frames written to them must be plain, fully checksummed and no larger than the MTU, and
// the pipelines do GSO splitting and checksum completion before WriteBatch. Every Port
// is also a port.Backend (backend.go), QEMU's backend offload callbacks (NetClientInfo's
// has_vnet_hdr, has_vnet_hdr_len, set_offload in QEMU include/net/net.h) as one
// interface.
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
// then walks the prefixes with a Deframer: each record is taken by one record step and
// then either copied out (the copy path) or, for a caller that takes frames in place
// (port.Lender), lent in place (the lend path, which the datapath uses: no copy in
// tapgro between the socket and the GRO engine); a trailing partial frame is moved to the
// front of the buffer and completed by later reads. It writes up to 512 frames per writev(2)
// (IOV_MAX is 1024 iovecs: a prefix and a frame each), resuming mid-iovec after short
// writes, so the peer always sees one contiguous byte stream. When the socket is full,
// the Go netpoller waits for writability; nothing spins.
//
// Ports also implement port.BatchSender for the TAP→port receive pool (package rxpool):
// TryWriteBatch writes until the socket is full and returns port.ErrWouldBlock instead of
// waiting (a stream record the kernel took in part is resumed by the next call, which
// must begin with the same frame), WaitWritable parks in the netpoller, and Room reads
// SIOCOUTQ against SO_SNDBUF so the pool can wait for enough room to flush in one go.
//
// Both port kinds also implement port.VecSender: TryWriteVecs takes each frame as a
// port.Vec, headers the pool built followed by a payload left in the TAP's read
// buffer, so no payload byte is copied in userspace. A stream record is at most two
// iovecs — the length prefix is written into the Vec's 4-byte headroom, in front of
// its head — so 512 records still fill one writev; longer batches are several
// writevs of whole records, and a record the kernel took in part is resumed by the
// next call exactly as with TryWriteBatch (same Vec first, else ErrPartialRecord). A
// datagram is one sendmmsg message with the iovec pair as its msg_iov.
//
// Datagram links (UDP, or AF_UNIX datagrams; -netdev dgram and socket udp=) carry one
// frame per datagram with no prefix. DgramPort moves up to 512 datagrams per
// recvmmsg(2)/sendmmsg(2), sends to the one configured remote address and accepts
// datagrams from any source, as QEMU does (net/socket.c net_socket_udp_init, net/dgram.c).
//
// # The vnet-hdr=on stream and shared memory
//
// tapgro's own vnet-hdr=on stream (vnetstream.go), for a link between two tapgro
// instances, opens with a 16-byte hello in both directions ("TAPGRO\x00", version,
// header length, accepted offloads; 5 s timeout), then carries records of
// [length][12-byte virtio_net_hdr][frame], so 64 KiB GSO frames cross whole. QEMU, or a
// plain tapgro, fails the hello at once on both ends. Over AF_UNIX the two ends may also
// agree on shared-memory rings (shm.go): large frames then stay in a memfd slot the
// sender read the TAP into, a descriptor crosses the stream in their place, and the
// receiver writes the TAP from the slot (port.ShmSender on the sending side, port.Lender
// on the receiving one). The rings of one connection are one shmLink: the send half
// over this end's ring belongs to the writer, the receive half over the peer's to the
// reader.
//
// # Limits
//
// A frame is 14 bytes (port.MinFrame, an Ethernet header) to 69632 bytes (port.MaxFrame,
// QEMU's NET_BUFSIZE = 4096 + 65536). On a stream, a length prefix outside that range
// means the peer is broken or hostile and the stream has lost sync: ReadBatch returns a
// *port.FrameError with the length and the limit, counts it in Stats.BadLength, and the
// caller must Close the Port (QEMU itself drops the connection on an oversized record;
// passt resets it on a short one). A length of 0 is not rejected by QEMU but we never
// send one. A stream that ends in the middle of a frame is reported as such
// (io.ErrUnexpectedEOF). On a datagram link a bad-sized datagram is only dropped and
// counted (ShortDatagram, OversizeDatagram); oversize ones are detected with MSG_TRUNC.
// WriteBatch refuses to send a frame outside the range on any port, returning a
// *port.FrameError for it.
//
// # Memory a peer can cause
//
// Nothing a peer sends grows memory beyond fixed bounds: a stream port reads into one
// 256 KiB buffer per connection and rejects any length prefix above port.MaxFrame before
// reading the record; a datagram port receives into the caller's buffers and drops what
// does not fit (MSG_TRUNC); the shared rings are fixed at set-up and the peer's is
// checked against what it announced. The callers' buffers (batch x (MaxFrame + header))
// are allocated per connection by the pipelines, never per frame.
//
// # unsafe
//
// The package uses unsafe for three things, all on memory of this process: iovec and
// mmsghdr arrays of its own handed to writev(2), recvmmsg(2) and sendmmsg(2) (through
// package rawsys, which every data-path call on the socket uses; golang.org/x/sys/
// unix.Writev would also build a fresh []Iovec per call), advancing an
// iovec base after a short write, and the atomic u32 words of a shared ring's control
// page. A shared ring is a memfd mapped MAP_SHARED by both tapgro processes: user
// memory another process writes, not kernel memory, so it is checked like wire input
// (sealed against resizing, size as announced, every descriptor and completion counter
// bounds-checked; shm.go). Kernel-shared memory (netmap's rings) is netmapio's alone.
//
// # What this package does not do
//
// It does not log, bind, dial or listen (package netdev makes the sockets), carry vnet
// headers on QEMU-framed streams, or segment or checksum frames: the pipelines do that
// before WriteBatch.
package sockport
