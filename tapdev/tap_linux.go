package tapdev

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"tapgro/rawsys"
	"tapgro/vnethdr"
)

// Device is one queue of a TAP device opened with IFF_VNET_HDR.
//
// ReadBatch and Write may run concurrently with each other, but each must be called from
// one goroutine at a time (they reuse per-device scratch state so they allocate nothing).
// The control-plane methods (offloads, ConfigureLink, Close) are safe from any goroutine.
type Device struct {
	file       *os.File
	rc         syscall.RawConn
	name       string
	vnetHdrLen int
	multiQueue bool
	ns         netns.NsHandle  // namespace the device was opened in; ConfigureLink works there
	nl         *netlink.Handle // rtnetlink in ns, opened with the device (LinkInfo)
	nlMu       sync.Mutex      // one request at a time on nl
	closed     atomic.Bool
	stats      Stats

	mu        sync.Mutex // guards the offload state below
	offloads  vnethdr.Offloads
	probed    vnethdr.Offloads
	probeDone bool

	// ReadBatch scratch: the callback handed to RawConn.Read is a method value created
	// once in Open, and its arguments travel through these fields.
	readFn func(fd uintptr) bool
	rbufs  [][]byte
	rsizes []int
	roff   int
	rn     int
	rerr   error

	// Write scratch, same idea.
	writeFn func(fd uintptr) bool
	wpkt    []byte
	wn      int
	werr    error
	// Preallocated errors for the two write failures a caller reacts to, so a link that
	// is down (EIO on every frame) does not allocate per frame either.
	errWriteEINVAL error
	errWriteEIO    error
}

// Open creates or attaches to the TAP device cfg.Name in the calling thread's network
// namespace, with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR (and IFF_MULTI_QUEUE when asked). It sets
// the vnet header size explicitly (it persists on persistent devices,
// drivers/net/tun_vnet.h tun_vnet_ioctl) and resets the device's read offloads to none, as
// QEMU does for each queue it opens; for a multiqueue device open every queue first, then
// call SetOffloads once.
func Open(cfg Config) (*Device, error) {
	hdrLen := cfg.VnetHdrLen
	if hdrLen == 0 {
		hdrLen = vnethdr.Len
	}
	if hdrLen != vnethdr.Len && hdrLen != vnethdr.LenMrgRxbuf {
		return nil, fmt.Errorf("tapdev: vnet header length %d not supported (want %d or %d)",
			hdrLen, vnethdr.Len, vnethdr.LenMrgRxbuf)
	}
	if err := checkName(cfg.Name); err != nil {
		return nil, err
	}
	// Attaching rewrites a single-queue device's flags to ours (tun_set_iff copies
	// TUN_FEATURES from the request), so the only reliable way to see how an existing
	// device was created is to ask before attaching.
	if err := checkExisting(cfg); err != nil {
		return nil, err
	}

	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("tapdev: open /dev/net/tun: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()

	ifr, err := unix.NewIfreq(cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("tapdev: interface name %q: %w", cfg.Name, err)
	}
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if cfg.MultiQueue {
		flags |= unix.IFF_MULTI_QUEUE
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return nil, explainSetIff(cfg, err)
	}
	name := ifr.Name()

	// A multiqueue device that already has queues keeps its flags on attach; check
	// what we actually got. TUNGETIFF copies a whole 40-byte ifreq out (drivers/net/tun.c
	// __tun_chr_ioctl), which is what unix.Ifreq is.
	got, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, got); err != nil {
		return nil, fmt.Errorf("tapdev: TUNGETIFF %q: %w", name, err)
	}
	if err := checkFlags(name, cfg.MultiQueue, got.Uint16()); err != nil {
		return nil, err
	}
	return adopt(fd, name, hdrLen, cfg.MultiQueue, &ok)
}

// Adopt takes over fd, a TAP queue opened by someone else (a manager, as QEMU's
// "-netdev tap,fd=N"): it must be a TAP with IFF_VNET_HDR and IFF_NO_PI, which TUNGETIFF
// tells; its header length and read offloads are reset as Open does. Link
// configuration is the opener's: tapgro needs no privilege for this. The name comes
// from the device. On failure fd is left open.
func Adopt(fd, vnetHdrLen int) (*Device, error) {
	if vnetHdrLen == 0 {
		vnetHdrLen = vnethdr.Len
	}
	got, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, got); err != nil {
		return nil, fmt.Errorf("tapdev: fd %d is not an open TAP queue (TUNGETIFF: %w)", fd, err)
	}
	flags := got.Uint16()
	if flags&unix.IFF_TAP == 0 || flags&unix.IFF_VNET_HDR == 0 || flags&unix.IFF_NO_PI == 0 {
		return nil, fmt.Errorf("tapdev: fd %d (%s) was opened with flags %#x; tapgro needs IFF_TAP|IFF_NO_PI|IFF_VNET_HDR", fd, got.Name(), flags)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("tapdev: fd %d: %w", fd, err)
	}
	unix.CloseOnExec(fd)
	var owned bool
	return adopt(fd, got.Name(), vnetHdrLen, flags&unix.IFF_MULTI_QUEUE != 0, &owned)
}

// adopt finishes Open and Adopt on an attached queue: header length, offloads reset,
// the namespace and a netlink handle for run-time reads, and the runtime poller. *ok is
// set once the returned Device (or the os.File) owns fd.
func adopt(fd int, name string, hdrLen int, multiQueue bool, ok *bool) (*Device, error) {
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, hdrLen); err != nil {
		return nil, fmt.Errorf("tapdev: TUNSETVNETHDRSZ %d on %q: %w", hdrLen, name, err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, 0); err != nil {
		return nil, fmt.Errorf("tapdev: TUNSETOFFLOAD 0 on %q: %w", name, err)
	}
	nsh, err := deviceNetns(fd)
	if err != nil {
		return nil, fmt.Errorf("tapdev: %s's network namespace: %w", name, err)
	}
	// One rtnetlink socket for the device's life: LinkInfo reads the link's addresses
	// at run time, when a confined tapgro can no longer open /proc (which netns.Get
	// needs) or enter a namespace.
	nl, err := handleIn(nsh)
	if err != nil {
		nsh.Close()
		return nil, fmt.Errorf("tapdev: netlink in %s's namespace: %w", name, err)
	}

	// The fd is non-blocking, so os.NewFile registers it with the runtime poller: reads
	// park the goroutine instead of a thread, deadlines work, and Close wakes a blocked
	// ReadBatch (songgao/water#22 is what happens otherwise).
	file := os.NewFile(uintptr(fd), "/dev/net/tun:"+name)
	*ok = true // file owns the fd now
	rc, err := file.SyscallConn()
	if err != nil {
		nl.Close()
		nsh.Close()
		file.Close()
		return nil, fmt.Errorf("tapdev: %q: %w", name, err)
	}
	d := &Device{
		file:       file,
		rc:         rc,
		name:       name,
		vnetHdrLen: hdrLen,
		multiQueue: multiQueue,
		ns:         nsh,
		nl:         nl,
	}
	d.readFn = d.readFrames
	d.writeFn = d.writeFrame
	d.errWriteEINVAL = fmt.Errorf("tapdev: write %s: %w", name, unix.EINVAL)
	d.errWriteEIO = fmt.Errorf("tapdev: write %s (link down?): %w", name, unix.EIO)
	return d, nil
}

func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("tapdev: a TAP name is required")
	case len(name) >= unix.IFNAMSIZ:
		return fmt.Errorf("tapdev: TAP name %q is %d bytes, the limit is %d", name, len(name), unix.IFNAMSIZ-1)
	case strings.ContainsAny(name, "%/: \t\n"):
		return fmt.Errorf("tapdev: TAP name %q contains a character not allowed in an interface name", name)
	}
	return nil
}

func recreateHint(name string, mq bool) string {
	opts := "vnet_hdr"
	if mq {
		opts += " multi_queue"
	}
	return fmt.Sprintf("ip tuntap del dev %s mode tap && ip tuntap add dev %s mode tap %s", name, name, opts)
}

// checkExisting refuses a device that exists but was not created the way we need. A
// netlink failure other than "no such link" is not fatal: TUNSETIFF and TUNGETIFF still
// catch the multiqueue mismatch.
func checkExisting(cfg Config) error {
	var link netlink.Link
	err := retryDump(func() (err error) {
		link, err = netlink.LinkByName(cfg.Name)
		return err
	})
	if err != nil {
		return nil
	}
	tt, ok := link.(*netlink.Tuntap)
	if !ok {
		return fmt.Errorf("tapdev: %q exists and is a %s device, not a TAP; pick another name or delete it with: ip link del dev %s",
			cfg.Name, link.Type(), cfg.Name)
	}
	return describeMismatch(cfg.Name, cfg.MultiQueue, tt.Mode == netlink.TUNTAP_MODE_TAP,
		tt.Flags&netlink.TUNTAP_VNET_HDR != 0, tt.Flags&netlink.TUNTAP_MULTI_QUEUE != 0)
}

// describeMismatch turns the properties of an existing device into the error that tells
// an operator exactly what to run, or nil when the device suits us.
func describeMismatch(name string, wantMQ, isTap, vnetHdr, mq bool) error {
	hint := recreateHint(name, wantMQ)
	switch {
	case !isTap:
		return fmt.Errorf("tapdev: %q exists as a TUN (layer 3) device; tapgro needs a TAP. Recreate it with: ip tuntap del dev %s mode tun && %s",
			name, name, strings.SplitN(hint, " && ", 2)[1])
	case !vnetHdr:
		return fmt.Errorf("tapdev: tap %q exists without vnet_hdr; recreate it with: %s", name, hint)
	case mq && !wantMQ:
		return fmt.Errorf("tapdev: tap %q exists with multi_queue but a single queue was asked for; enable multiqueue in tapgro or recreate it with: %s", name, hint)
	case !mq && wantMQ:
		return fmt.Errorf("tapdev: tap %q exists without multi_queue but multiqueue was asked for; disable multiqueue in tapgro or recreate it with: %s", name, hint)
	}
	return nil
}

func checkFlags(name string, wantMQ bool, flags uint16) error {
	return describeMismatch(name, wantMQ, flags&unix.IFF_TAP != 0, flags&unix.IFF_VNET_HDR != 0,
		flags&unix.IFF_MULTI_QUEUE != 0)
}

// explainSetIff translates TUNSETIFF's terse errnos. EINVAL on an existing device means
// a TUN/TAP or IFF_MULTI_QUEUE mismatch (drivers/net/tun.c tun_set_iff).
func explainSetIff(cfg Config, err error) error {
	switch {
	case errors.Is(err, unix.EINVAL):
		var link netlink.Link
		if lerr := retryDump(func() (e error) { link, e = netlink.LinkByName(cfg.Name); return e }); lerr == nil {
			if tt, ok := link.(*netlink.Tuntap); ok {
				if m := describeMismatch(cfg.Name, cfg.MultiQueue, tt.Mode == netlink.TUNTAP_MODE_TAP,
					true, tt.Flags&netlink.TUNTAP_MULTI_QUEUE != 0); m != nil {
					return fmt.Errorf("%w (TUNSETIFF: %w)", m, err)
				}
			}
		}
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("tapdev: tap %q is already attached to another file descriptor (a single-queue TAP has one; is another tapgro or QEMU using it?): %w", cfg.Name, err)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("tapdev: not allowed to create or attach tap %q: needs CAP_NET_ADMIN, or the device's owner/group: %w", cfg.Name, err)
	}
	return fmt.Errorf("tapdev: TUNSETIFF %q: %w", cfg.Name, err)
}

// Name is the interface name the kernel reported.
func (d *Device) Name() string { return d.name }

// VnetHdrLen is the virtio_net_hdr length in front of every frame read or written.
func (d *Device) VnetHdrLen() int { return d.vnetHdrLen }

// Stats returns the live counters.
func (d *Device) Stats() *Stats { return &d.stats }

// setOffloadLocked issues TUNSETOFFLOAD (argument by value, drivers/net/tun.c
// __tun_chr_ioctl).
func (d *Device) setOffloadLocked(o vnethdr.Offloads) error {
	var ierr error
	err := d.rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, int(o))
	})
	if err == nil {
		err = ierr
	}
	return err
}

// ProbeOffloads reports which TUN_F_* read offloads the kernel accepts, found by trying
// them one at a time under the TUNSETOFFLOAD rules (drivers/net/tun.c set_offload): CSUM
// alone first, then each of TSO4, TSO6 and UFO with CSUM, TSO_ECN with CSUM and the TSO
// bits found, and USO4|USO6 together with CSUM. The mask set before the probe is restored.
// The result is cached. Probing toggles device-wide features, so do it before traffic
// flows.
func (d *Device) ProbeOffloads() vnethdr.Offloads {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.probeLocked()
}

func (d *Device) probeLocked() vnethdr.Offloads {
	if d.probeDone {
		return d.probed
	}
	const csum = vnethdr.OffloadCSUM
	try := func(o vnethdr.Offloads) bool { return d.setOffloadLocked(o) == nil }
	var got vnethdr.Offloads
	if try(csum) {
		got = csum
		for _, bit := range [...]vnethdr.Offloads{vnethdr.OffloadTSO4, vnethdr.OffloadTSO6, vnethdr.OffloadUFO} {
			if try(csum | bit) {
				got |= bit
			}
		}
		if tso := got & (vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6); tso != 0 && try(csum|tso|vnethdr.OffloadTSOECN) {
			got |= vnethdr.OffloadTSOECN
		}
		if try(csum | vnethdr.OffloadUSO) { // Linux 6.2+
			got |= vnethdr.OffloadUSO
		}
	}
	restored := d.setOffloadLocked(d.offloads) == nil
	// A probe on a closed device finds nothing; do not remember that.
	if restored && !d.closed.Load() {
		d.probed, d.probeDone = got, true
	}
	return got
}

// SetOffloads asks the kernel to hand us the frames described by want ∩ ProbeOffloads(),
// minus bits whose prerequisites are missing, and returns what was set. Offloads only
// govern reads: writes may always carry partial checksums and GSO (drivers/net/tun.c
// tun_get_user hands every header to virtio_net_hdr_to_skb whatever is set). The
// setting is device-wide, shared by all queues.
func (d *Device) SetOffloads(want vnethdr.Offloads) (vnethdr.Offloads, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	eff := (want & d.probeLocked()).Normalize()
	if err := d.setOffloadLocked(eff); err != nil {
		return d.offloads, fmt.Errorf("tapdev: TUNSETOFFLOAD %s on %s: %w", eff, d.name, err)
	}
	d.offloads = eff
	return eff, nil
}

// Offloads is the read-offload mask currently set through this Device.
func (d *Device) Offloads() vnethdr.Offloads {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.offloads
}

// ReadBatch blocks until at least one frame is available, then reads frames until none is
// left or len(bufs) have been read. Frame i ([vnet header][Ethernet frame]) lands at
// bufs[i][offset:] and sizes[i] is its length from offset. Every bufs[i] must have at
// least offset+VnetHdrLen() bytes; 65593+VnetHdrLen() from offset holds the largest frame
// the kernel produces (14 + 4 VLAN + 40 IPv6 + 65535, drivers/net/tun.c tun_put_user), and
// a frame that fills its buffer exactly may have been truncated (counted in
// Stats.Truncated). After Close (or once the device has been deleted) it returns
// os.ErrClosed; after a read deadline, os.ErrDeadlineExceeded.
func (d *Device) ReadBatch(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	if len(sizes) < len(bufs) {
		return 0, fmt.Errorf("tapdev: ReadBatch: %d sizes for %d buffers", len(sizes), len(bufs))
	}
	if offset < 0 {
		return 0, fmt.Errorf("tapdev: ReadBatch: negative offset %d", offset)
	}
	for i, b := range bufs {
		// The kernel drops the frame (EINVAL) if the buffer cannot hold the header.
		if len(b)-offset < d.vnetHdrLen {
			return 0, fmt.Errorf("tapdev: ReadBatch: buffer %d is %d bytes, offset %d leaves less than the %d-byte vnet header",
				i, len(b), offset, d.vnetHdrLen)
		}
	}
	d.rbufs, d.rsizes, d.roff, d.rn, d.rerr = bufs, sizes, offset, 0, nil
	err := d.rc.Read(d.readFn)
	n, rerr := d.rn, d.rerr
	d.rbufs, d.rsizes = nil, nil // do not pin the caller's buffers
	if n > 0 {
		// A read error after some frames resurfaces on the next call if it persists.
		d.stats.ReadBatches.Add(1)
		d.stats.FramesRead.Add(uint64(n))
		return n, nil
	}
	if err == nil {
		err = rerr
	}
	return 0, d.ioErr(err, "read")
}

// readFrames is the RawConn.Read callback. A TAP fd is not a socket, so there is no
// recvmmsg: a batch is one wait for readability followed by plain reads until EAGAIN.
// Returning false asks the poller to wait; it only does so before the first frame.
func (d *Device) readFrames(fd uintptr) bool {
	for d.rn < len(d.rbufs) {
		b := d.rbufs[d.rn][d.roff:]
		n, e := rawsys.Read(fd, b) // non-blocking: see package rawsys
		d.stats.ReadCalls.Add(1)
		if e != 0 {
			switch e {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return d.rn > 0
			}
			d.stats.ReadErrors.Add(1)
			d.rerr = e
			return true
		}
		if n == len(b) {
			d.stats.Truncated.Add(1)
		}
		d.stats.BytesRead.Add(uint64(n))
		d.rsizes[d.rn] = n
		d.rn++
	}
	return true
}

// Write hands one frame, [vnet header][Ethernet frame], to the kernel in one write(2).
// The header may describe partial checksums and GSO regardless of SetOffloads
// (drivers/net/tun.c tun_get_user). Errors wrap the errno: errors.Is(err, unix.EINVAL)
// means the kernel rejected the frame (tun_get_user, include/linux/virtio_net.h
// virtio_net_hdr_to_skb), unix.EIO that the link is down; neither affects later
// frames. If the kernel's send buffer is full, Write parks on the poller until it drains.
func (d *Device) Write(pkt []byte) (int, error) {
	d.wpkt, d.wn, d.werr = pkt, 0, nil
	err := d.rc.Write(d.writeFn)
	n, werr := d.wn, d.werr
	d.wpkt = nil
	if err == nil {
		err = werr
	}
	if err != nil {
		switch {
		case errors.Is(err, unix.EINVAL):
			d.stats.WriteErrEINVAL.Add(1)
			return 0, d.errWriteEINVAL
		case errors.Is(err, unix.EIO):
			d.stats.WriteErrEIO.Add(1)
			return 0, d.errWriteEIO
		}
		d.stats.WriteErrOther.Add(1)
		return 0, d.ioErr(err, "write")
	}
	if n != len(pkt) {
		// tun writes are all or nothing; this would be a kernel bug.
		d.stats.WriteErrOther.Add(1)
		return n, fmt.Errorf("tapdev: write %s: %d of %d bytes: %w", d.name, n, len(pkt), io.ErrShortWrite)
	}
	d.stats.FramesWritten.Add(1)
	d.stats.BytesWritten.Add(uint64(n))
	return n, nil
}

// writeFrame is the RawConn.Write callback.
func (d *Device) writeFrame(fd uintptr) bool {
	for {
		n, e := rawsys.Write(fd, d.wpkt)
		d.stats.WriteCalls.Add(1)
		switch e {
		case 0:
			d.wn = n
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		d.werr = e
		return true
	}
}

// ioErr maps the ways a closed or vanished device shows up to os.ErrClosed: our own
// Close (the poller reports "use of closed file"), EBADF, and EBADFD (the device was
// deleted under us: tun detached the queue).
func (d *Device) ioErr(err error, op string) error {
	switch {
	case d.closed.Load(), errors.Is(err, unix.EBADF), errors.Is(err, unix.EBADFD):
		return os.ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return err
	}
	return fmt.Errorf("tapdev: %s %s: %w", op, d.name, err)
}

// SetReadDeadline makes a blocked or future ReadBatch return os.ErrDeadlineExceeded at t;
// the zero time clears it.
func (d *Device) SetReadDeadline(t time.Time) error { return d.file.SetReadDeadline(t) }

// Close releases the queue and unblocks ReadBatch and Write. A non-persistent device
// disappears with its last queue. A second Close returns os.ErrClosed.
func (d *Device) Close() error {
	if !d.closed.CompareAndSwap(false, true) {
		return os.ErrClosed
	}
	err := d.file.Close()
	d.nlMu.Lock()
	if d.nl != nil {
		d.nl.Close()
	}
	d.nlMu.Unlock()
	d.ns.Close()
	return err
}

// NameOf returns the name of the TAP device fd is a queue of (TUNGETIFF), for
// checking a descriptor before anything else is set up.
func NameOf(fd int) (string, error) {
	got, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, got); err != nil {
		return "", fmt.Errorf("not an open TAP queue (TUNGETIFF: %w)", err)
	}
	return got.Name(), nil
}

// handleIn opens an rtnetlink handle in namespace ns. netlink.NewHandleAt always
// enters ns with setns(2), which needs CAP_SYS_ADMIN over it even when the caller is
// already there: a tapgro started unprivileged with --tap-fd in its own namespace would
// fail, so that case opens the socket where the thread is.
func handleIn(ns netns.NsHandle) (*netlink.Handle, error) {
	if cur, err := netns.Get(); err == nil {
		same := cur.Equal(ns)
		cur.Close()
		if same {
			return netlink.NewHandle(unix.NETLINK_ROUTE)
		}
	}
	return netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
}

// deviceNetns is the network namespace the TAP's netdev lives in: TUNGETDEVNETNS (Linux
// 5.2, drivers/net/tun.c; it needs CAP_NET_ADMIN there), else the calling thread's,
// which is where Open created it and where a manager that passed the fd normally runs
// tapgro.
func deviceNetns(fd int) (netns.NsHandle, error) {
	if nfd, err := unix.IoctlRetInt(fd, unix.TUNGETDEVNETNS); err == nil {
		return netns.NsHandle(nfd), nil
	}
	return netns.Get()
}
