// Package tapdev opens a Linux TAP device with a virtio_net_hdr in front of every frame
// and moves frames in and out of it without allocating.
//
// # Opening
//
// Open opens /dev/net/tun with O_RDWR|O_CLOEXEC|O_NONBLOCK and issues TUNSETIFF with
// IFF_TAP|IFF_NO_PI|IFF_VNET_HDR, plus IFF_MULTI_QUEUE when asked, in which case every
// Open adds one queue (at most 256, MAX_TAP_QUEUES in drivers/net/tun.c). The name is
// required: a missing device is created (and disappears with its last fd), an existing one
// is attached to. Attaching to a single-queue device silently rewrites its flags to ours
// (tun_set_iff copies TUN_FEATURES from the request, checked on 6.18), so Open first asks
// rtnetlink how the device was made (IFLA_TUN_TYPE/VNET_HDR/MULTI_QUEUE) and refuses a TUN,
// a TAP without vnet_hdr, or a multiqueue mismatch with a message that names the
// `ip tuntap` commands that fix it. After attaching it checks TUNGETIFF again (a
// multiqueue device that already has queues keeps its flags), and translates TUNSETIFF's
// bare EINVAL
// (multiqueue or TUN/TAP mismatch, drivers/net/tun.c tun_set_iff) and EBUSY into the same
// kind of message.
//
// TUNSETVNETHDRSZ is always set (10, or 12 for virtio_net_hdr_mrg_rxbuf): the size is
// per device and persists on persistent TAPs (drivers/net/tun_vnet.h tun_vnet_ioctl).
// Header fields are little-endian on x86_64 without TUNSETVNETLE; vnethdr encodes them
// explicitly. On read the kernel fills the first 10 bytes; bytes 10..11 of a 12-byte header
// are undefined.
//
// The fd is non-blocking and wrapped with os.NewFile, which registers it with the Go
// netpoller: a ReadBatch waiting for frames parks its goroutine rather than a thread,
// SetReadDeadline works, and Close wakes a blocked ReadBatch with os.ErrClosed (the
// problem songgao/water#22 had). A device deleted under us reads EBADFD, also reported
// as os.ErrClosed. The network namespace Open ran in is remembered, so ConfigureLink
// works from any goroutine.
//
// # Offloads
//
// TUNSETOFFLOAD only says what the kernel may hand us on read: partial checksums
// (TUN_F_CSUM) and TCPv4/TCPv6/UDP-L4 GSO super-frames up to 64 KiB (TSO4, TSO6, USO4|USO6;
// TSO_ECN for CWR-marked TSO). Writes may always carry NEEDS_CSUM and GSO headers,
// whatever is set (drivers/net/tun.c tun_get_user validates them with virtio_net_hdr_to_skb
// regardless). The kernel's set_offload processes no bit without CSUM, rejects TSO_ECN
// without TSO4/TSO6, USO4 without USO6 and any unknown bit with EINVAL and changes nothing,
// so ProbeOffloads tries the bits one at a time (CSUM; CSUM+TSO4; CSUM+TSO6; CSUM+UFO;
// CSUM+TSO+TSO_ECN; CSUM+USO4+USO6) and restores the mask it found. UFO is accepted and
// ignored since Linux 4.14; USO exists from 6.2. SetOffloads sets the wanted ∩ probed bits
// whose prerequisites are present. The mask is device-wide and there is no ioctl to read it
// back, so Open resets it to none (as QEMU does per queue) and Offloads reports what this
// Device last set. A fresh TAP has all offloads off (ethtool shows "off [requested on]").
//
// # Reading and writing
//
// One read(2) returns one frame, [vnet header][Ethernet frame]; a buffer shorter than the
// header makes the kernel drop the frame (EINVAL) and a short buffer truncates silently,
// so ReadBatch rejects buffers that cannot hold the header and counts frames that fill
// their buffer exactly. 65593 bytes plus the header hold the largest frame (14 Ethernet + 4
// VLAN + 40 IPv6 + 65535, drivers/net/tun.c tun_put_user). A TAP fd is not a socket, so
// there is no recvmmsg: a batch is one wait for readability followed by non-blocking reads
// until EAGAIN or the batch is full, all inside one syscall.RawConn.Read callback (the
// reads and writes go through package rawsys: the fd is non-blocking). Bigger
// batches come from GSO (one read, up to 64 KiB) and from multiple queues. The kernel
// queues at most txqueuelen frames per queue (default 500) and drops the rest, so the
// reader should not stall.
//
// One write(2) is one frame. The kernel validates the header (drivers/net/tun.c
// tun_get_user, include/linux/virtio_net.h virtio_net_hdr_to_skb) and answers EINVAL for a
// frame it rejects and EIO while the link is down; Write returns those errnos wrapped
// (errors.Is works) and neither affects later frames. EAGAIN parks the writer on the poller
// instead of spinning.
//
// ReadBatch and Write reuse per-device scratch fields and callbacks built once in Open,
// so steady-state calls allocate nothing (TestAllocs); each must be called by one
// goroutine at a time, but the two may run concurrently. Counters are plain atomics in
// Stats; the package never logs.
//
// # Link set-up
//
// ConfigureLink sets MTU (68..65521, the tun driver's limits), txqueuelen, addresses
// (IPv6 with IFA_F_NODAD so they are usable at once; re-adding is not an error) and the
// up flag over rtnetlink with github.com/vishvananda/netlink, retrying requests the kernel
// answers with NLM_F_DUMP_INTR (netlink.ErrDumpInterrupted, vishvananda/netlink#1018).
//
// # What it does not do
//
// It does not use github.com/songgao/water, which cannot set IFF_VNET_HDR, TUNSETOFFLOAD
// or TUNSETVNETHDRSZ and opens without O_CLOEXEC. It does not make devices persistent, set
// owners, install steering programs, or bridge the TAP; those belong to whoever
// administers the host.
//
// # Queues
//
// OpenQueues opens n queues of one device (IFF_MULTI_QUEUE when n > 1). SetQueueEnabled
// detaches a queue (TUNSETQUEUE IFF_DETACH_QUEUE) so that the kernel steers it no frames
// and purges what it held, or attaches it again, as QEMU's TAP back-end does per queue
// pair (net/tap-linux.c tap_fd_enable/tap_fd_disable). A detached queue's fd stays bound
// to the device: writes and ioctls still work on it (drivers/net/tun.c __tun_detach keeps
// tfile->tun unless the fd is closed).
package tapdev
