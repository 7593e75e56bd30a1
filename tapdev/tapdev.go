package tapdev

import (
	"errors"
	"net/netip"
	"sync/atomic"
)

// ErrUnsupported is returned by every function on platforms without Linux TAP devices.
var ErrUnsupported = errors.New("tapdev: TAP devices with IFF_VNET_HDR need Linux")

// Config selects the TAP device to open.
type Config struct {
	// Name is the interface name (at most 15 bytes, no '%' pattern). The device is
	// created if it does not exist and attached to if it does.
	Name string
	// MultiQueue opens one queue of an IFF_MULTI_QUEUE device; each Open adds a queue.
	// It must match how an existing device was created.
	MultiQueue bool
	// VnetHdrLen is the virtio_net_hdr length carried by every read and write: 10
	// (virtio_net_hdr) or 12 (virtio_net_hdr_mrg_rxbuf). 0 means 10.
	VnetHdrLen int
}

// LinkConfig is the link-level set-up ConfigureLink applies. Zero fields are left alone.
type LinkConfig struct {
	// MTU of the TAP netdev, 68..65521 (the tun driver's min/max MTU); 0 keeps it.
	MTU int
	// TxQueueLen is the kernel->us ring size in frames (the tun ptr_ring follows
	// tx_queue_len, default 500 = TUN_READQ_SIZE in include/uapi/linux/if_tun.h); 0 keeps it.
	TxQueueLen int
	// Addrs are added to the link (IPv4 and IPv6; IPv6 without DAD). An address that
	// is already present is not an error.
	Addrs []netip.Prefix
	// Up brings the link up; false leaves the administrative state as it is.
	Up bool
}

// Stats are the device's counters. They are updated atomically on the packet path and
// may be read at any time; nothing in this package ever resets them.
type Stats struct {
	ReadBatches    atomic.Uint64 // ReadBatch calls that returned at least one frame
	ReadCalls      atomic.Uint64 // read(2) system calls, including those that found nothing (EAGAIN)
	FramesRead     atomic.Uint64
	BytesRead      atomic.Uint64 // including the vnet header of each frame
	Truncated      atomic.Uint64 // frames that filled their buffer exactly: possibly cut short by the kernel
	ReadErrors     atomic.Uint64 // read(2) failures other than EAGAIN/EINTR
	WriteCalls     atomic.Uint64 // write(2) system calls, including those that hit EAGAIN
	FramesWritten  atomic.Uint64
	BytesWritten   atomic.Uint64 // including the vnet header of each frame
	WriteErrEINVAL atomic.Uint64 // frame rejected by the kernel (bad vnet header / GSO / length)
	WriteErrEIO    atomic.Uint64 // link administratively down: frame dropped
	WriteErrOther  atomic.Uint64
}
