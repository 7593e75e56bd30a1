//go:build linux

package netmapio

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"tapgro/port"
)

// netmap API v14 request interface (NETMAP_API, NIOCCTRL, struct nmreq_header and
// nmreq_register in netmap sys/net/netmap.h).
const (
	nmDevice = DevicePath
	nmAPI    = 14

	nmIoctlCtrl   = 0xc0586997 // NIOCCTRL = _IOWR('i', 151, struct nmreq_header)
	nmIoctlTxSync = 0x6994     // NIOCTXSYNC = _IO('i', 148)
	nmIoctlRxSync = 0x6995     // NIOCRXSYNC = _IO('i', 149)

	nmReqRegister = 1
	nmReqHdrSet   = 6
	nmReqHdrGet   = 7

	nrAcceptVnetHdr = 0x8000
	nrNoTxPoll      = 0x20000
)

// nmreqHeader is struct nmreq_header (88 bytes on 64-bit). Body is a pointer typed as
// one, so the garbage collector keeps the body alive and a stack move would update it.
type nmreqHeader struct {
	Version  uint16
	ReqType  uint16
	Reserved uint32
	Name     [64]byte
	Options  unsafe.Pointer
	Body     unsafe.Pointer
}

// nmreqRegister is struct nmreq_register (56 bytes).
type nmreqRegister struct {
	Offset      uint64
	MemSize     uint64
	TxSlots     uint32
	RxSlots     uint32
	TxRings     uint16
	RxRings     uint16
	HostTxRings uint16
	HostRxRings uint16
	MemID       uint16
	RingID      uint16
	Mode        uint32
	ExtraBufs   uint32
	_           uint32
	Flags       uint64
}

// nmreqPortHdr is struct nmreq_port_hdr (8 bytes).
type nmreqPortHdr struct {
	HdrLen uint32
	_      uint32
}

// ErrNoNetmap means /dev/netmap does not exist: the netmap module is not loaded.
var ErrNoNetmap = errors.New("netmapio: /dev/netmap is missing: the netmap kernel module is needed (modprobe netmap); " +
	"netmap is out-of-tree (github.com/luigirizzo/netmap) and no distribution kernel ships it")

// nmFd is the syncer of a registered /dev/netmap descriptor. Its ioctls run only inside
// RawConn callbacks (or before the file is handed to the runtime), so fd is valid.
type nmFd struct{ fd int }

func (d nmFd) txsync() error { return d.ioctl(nmIoctlTxSync, 0) }
func (d nmFd) rxsync() error { return d.ioctl(nmIoctlRxSync, 0) }

func (d nmFd) ioctl(req, arg uintptr) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), req, arg)
		if e != unix.EINTR {
			if e != 0 {
				return e
			}
			return nil
		}
	}
}

// ctrl runs one NIOCCTRL request with body for port name.
func (d nmFd) ctrl(reqType uint16, name string, body unsafe.Pointer) error {
	h := &nmreqHeader{Version: nmAPI, ReqType: reqType, Body: body}
	copy(h.Name[:nmNameMax], name)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), nmIoctlCtrl, uintptr(unsafe.Pointer(h)))
	runtime.KeepAlive(h)
	runtime.KeepAlive(body)
	if e != 0 {
		return e
	}
	return nil
}

func (d nmFd) setHdrLen(name string, n int) error {
	ph := &nmreqPortHdr{HdrLen: uint32(n)}
	if err := d.ctrl(nmReqHdrSet, name, unsafe.Pointer(ph)); err != nil {
		return fmt.Errorf("netmap: NETMAP_REQ_PORT_HDR_SET %d on %s: %w", n, name, err)
	}
	got := &nmreqPortHdr{}
	if err := d.ctrl(nmReqHdrGet, name, unsafe.Pointer(got)); err != nil {
		return fmt.Errorf("netmap: NETMAP_REQ_PORT_HDR_GET on %s: %w", name, err)
	}
	if int(got.HdrLen) != n {
		return fmt.Errorf("netmap: %s has a %d-byte vnet header after setting %d", name, got.HdrLen, n)
	}
	return nil
}

// Open registers the netmap port ifname (an ifname= value: netmap:IFNAME[^|*], valeX:Y or a
// pipe; see ParseName), maps its rings and, on a VALE port, sets the virtio-net header
// length to hdrLen (0, 10 or 12). st and nst may be nil for private counters.
func Open(ifname string, hdrLen int, st *port.Stats, nst *NetmapStats) (*NetmapPort, error) {
	if st == nil {
		st = new(port.Stats)
	}
	if nst == nil {
		nst = new(NetmapStats)
	}
	if unsafe.Sizeof(nmreqHeader{}) != 88 || unsafe.Sizeof(nmreqRegister{}) != 56 {
		return nil, errors.New("netmapio: netmap needs a 64-bit platform (struct nmreq_header is 88 bytes there)")
	}
	name, err := ParseName(ifname)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(nmDevice, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			return nil, ErrNoNetmap
		}
		return nil, fmt.Errorf("netmapio: open %s: %w", nmDevice, err)
	}
	d := nmFd{fd}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()

	// A VALE port we are about to give a header length must accept headers at
	// registration: a persistent port may already have one, and REGISTER then fails
	// with EIO without the flag (netmap sys/dev/netmap/netmap.c, NETMAP_REQ_REGISTER). We set
	// the length right after.
	reg := &nmreqRegister{Mode: name.mode, Flags: nrNoTxPoll}
	if name.vale {
		reg.Flags |= nrAcceptVnetHdr
	}
	if err := d.ctrl(nmReqRegister, name.kernel, unsafe.Pointer(reg)); err != nil {
		return nil, registerError(name.kernel, err)
	}
	if reg.MemSize == 0 || reg.MemSize > 1<<40 || reg.Offset >= reg.MemSize {
		return nil, fmt.Errorf("netmap: register %s: region of %d bytes with netmap_if at %d", name.kernel, reg.MemSize, reg.Offset)
	}
	mem, err := unix.Mmap(fd, 0, int(reg.MemSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("netmap: mmap %d bytes of %s: %w", reg.MemSize, name.kernel, err)
	}
	release := func() error { return unix.Munmap(mem) }
	defer func() {
		if !ok {
			release()
		}
	}()
	txFirst, txN := 0, int(reg.TxRings)
	rxFirst, rxN := 0, int(reg.RxRings)
	switch name.mode {
	case nrRegSW:
		txFirst, txN = int(reg.TxRings), int(reg.HostTxRings)
		rxFirst, rxN = int(reg.RxRings), int(reg.HostRxRings)
	case nrRegNICSW:
		txN += int(reg.HostTxRings)
		rxN += int(reg.HostRxRings)
	}
	tx, rx, err := mapRings(mem, reg.Offset, txFirst, txN, rxFirst, rxN)
	if err != nil {
		nst.BadRing.Add(1)
		return nil, fmt.Errorf("netmap: %s: %w", name.kernel, err)
	}
	core, err := newCore(tx, rx, 0, d, st, nst)
	if err != nil {
		return nil, fmt.Errorf("netmap: %s: %w", name.kernel, err)
	}
	if name.vale {
		// The port exists now (registered above), so its length can be set (ENXIO
		// before). Frames VALE delivered before this carry the old length: drop them.
		if err := d.setHdrLen(name.kernel, hdrLen); err != nil {
			return nil, err
		}
		core.hdrLen = hdrLen
		if err := core.drain(); err != nil {
			return nil, fmt.Errorf("netmap: %s: %w", name.kernel, err)
		}
	}
	// Only now does the file go to the netpoller: netmap's poll registers its wait
	// queues only on a bound descriptor, so an earlier epoll_ctl would never wake.
	f := os.NewFile(uintptr(fd), nmDevice+":"+name.kernel)
	ok = true
	p, err := newNetmapPort(f, core, "netmap:"+name.kernel, name.vale, release, st)
	if err != nil {
		f.Close()
		release()
		return nil, err
	}
	if name.vale {
		p.setHdr = func(n int) error { return d.setHdrLen(name.kernel, n) }
	}
	return p, nil
}

func registerError(name string, err error) error {
	why := ""
	switch {
	case errors.Is(err, unix.ENXIO), errors.Is(err, unix.ENOENT):
		why = " (no such interface, or it has no netmap support)"
	case errors.Is(err, unix.EBUSY):
		why = " (registered exclusively by another process)"
	case errors.Is(err, unix.EIO):
		why = " (the port carries a virtio-net header: give it to a VALE port with vnet-hdr)"
	case errors.Is(err, unix.EINVAL):
		why = " (bad name or ring request, or a netmap older than API 14)"
	}
	return fmt.Errorf("netmap: register %s: %w%s", name, err, why)
}
