// Package vuproto is the vhost-user wire format, as QEMU docs/interop/vhost-user.rst
// specifies it for QEMU 7.2: the 12-byte message header {request, flags, size} and its
// flags, the front-end request codes, the protocol feature bits, and the payloads a net
// device's session carries (struct vhost_vring_state, struct vhost_vring_addr,
// VhostUserMemory). Numbers are little-endian on the wire.
//
// Both ends of tapgro's sockets speak it: the back-end (package vhostuser) parses it and
// the front-end double (vhostuser/vhostusertest) writes it. This leaf package, which
// imports nothing, is where both read it from, so the double does not import the
// back-end it plays against, and vhostuser's own tests can use the double. It holds
// names and layouts only: framing, validation and decoding are the back-end's, encoding
// is the double's.
package vuproto

// HeaderSize is the length of the message header: request, flags and payload size, a
// u32 each (vhost-user.rst "Message Specification").
const HeaderSize = 12

// Header flags (QEMU hw/virtio/vhost-user.c VHOST_USER_VERSION_MASK,
// VHOST_USER_REPLY_MASK, VHOST_USER_NEED_REPLY_MASK).
const (
	FlagVersion     = 0x1 // the protocol version, in the low two bits
	FlagVersionMask = 0x3
	FlagReply       = 0x4 // set on replies only
	FlagNeedReply   = 0x8 // the front-end asks for a REPLY_ACK

	// ReplyFlags are a reply's flags: QEMU's vhost_user_read_header insists on exactly
	// these.
	ReplyFlags = FlagVersion | FlagReply
)

// Front-end → back-end request codes (QEMU hw/virtio/vhost-user.c enum
// VhostUserRequest; vhost-user.rst "Front-end message types").
const (
	ReqGetFeatures         = 1
	ReqSetFeatures         = 2
	ReqSetOwner            = 3
	ReqResetOwner          = 4
	ReqSetMemTable         = 5
	ReqSetLogBase          = 6
	ReqSetLogFd            = 7
	ReqSetVringNum         = 8
	ReqSetVringAddr        = 9
	ReqSetVringBase        = 10
	ReqGetVringBase        = 11
	ReqSetVringKick        = 12
	ReqSetVringCall        = 13
	ReqSetVringErr         = 14
	ReqGetProtocolFeatures = 15
	ReqSetProtocolFeatures = 16
	ReqGetQueueNum         = 17
	ReqSetVringEnable      = 18
	ReqSendRARP            = 19
	ReqNetSetMTU           = 20
)

// Protocol feature bits (QEMU hw/virtio/vhost-user.c enum VhostUserProtocolFeature).
const (
	ProtoMQ       = 0
	ProtoLogShmfd = 1
	ProtoRARP     = 2
	ProtoReplyAck = 3
	ProtoNetMTU   = 4
)

// The u64 payload of SET_VRING_KICK, SET_VRING_CALL and SET_VRING_ERR: the ring index
// in the low byte, and a flag saying no fd rides along (VHOST_USER_VRING_IDX_MASK,
// VHOST_USER_VRING_NOFD_MASK).
const (
	VringIndexMask = 0xff
	VringNoFd      = 1 << 8
)

// MaxRegions is how many regions a SET_MEM_TABLE carries at most, one fd each
// (VHOST_MEMORY_BASELINE_NREGIONS).
const MaxRegions = 8

// VringState is struct vhost_vring_state (linux include/uapi/linux/vhost_types.h): 8
// bytes.
type VringState struct {
	Index uint32
	Num   uint32
}

// VringAddr is struct vhost_vring_addr: the ring parts as front-end virtual addresses,
// 40 bytes. Note the order: used before avail.
type VringAddr struct {
	Index uint32
	Flags uint32
	Desc  uint64
	Used  uint64
	Avail uint64
	Log   uint64
}

// MemRegion is VhostUserMemoryRegion (QEMU hw/virtio/vhost-user.c): 32 bytes.
type MemRegion struct {
	GPA        uint64 // guest_phys_addr
	Size       uint64 // memory_size
	UserAddr   uint64 // userspace_addr in the front-end
	MmapOffset uint64 // where the region starts in its fd
}

// MemTable is VhostUserMemory without the padding: a u32 region count, 4 bytes of
// padding, then the regions.
type MemTable struct {
	N       int
	Regions [MaxRegions]MemRegion
}
