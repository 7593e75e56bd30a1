// Package virtio is the one table of virtio feature bits tapgro uses: their numbers
// and names, for every package that negotiates or shows them (vhostuser takes the ring
// bits, vhostnet the network device's, ops and the test doubles show them). The
// numbers are the virtio spec's (1.x, "Reserved Feature Bits" and "Network Device /
// Feature bits"), as linux include/uapi/linux/virtio_config.h, virtio_ring.h and
// virtio_net.h define them.
package virtio

import (
	"fmt"
	"math/bits"
	"strings"
)

// Network device feature bits (VIRTIO_NET_F_*).
const (
	NetCsum          = 0  // the driver may send partial checksums (NEEDS_CSUM)
	NetGuestCsum     = 1  // the driver takes partial checksums and DATA_VALID
	NetMTU           = 3  // the device advises an MTU
	NetGuestTSO4     = 7  // the driver takes TCPv4 GSO frames
	NetGuestTSO6     = 8  // the driver takes TCPv6 GSO frames
	NetGuestECN      = 9  // ... with ECN
	NetHostTSO4      = 11 // the device takes TCPv4 GSO frames
	NetHostTSO6      = 12 // the device takes TCPv6 GSO frames
	NetHostECN       = 13 // ... with ECN
	NetMrgRxbuf      = 15 // a received frame may span several chains (num_buffers)
	NetGuestAnnounce = 21 // the driver announces itself when the device asks (after a migration)
	NetMQ            = 22 // several queue pairs
	NetGuestUSO4     = 54 // the driver takes UDPv4 GSO frames
	NetGuestUSO6     = 55 // the driver takes UDPv6 GSO frames
	NetHostUSO       = 56 // the device takes UDP GSO frames
)

// Device-independent bits (VIRTIO_F_* and VIRTIO_RING_F_*) and vhost's.
const (
	LogAll           = 26 // VHOST_F_LOG_ALL: the back-end logs the pages it writes (migration)
	RingIndirectDesc = 28 // indirect descriptor tables
	RingEventIdx     = 29 // used_event / avail_event notification suppression
	// VhostUserProtocolFeatures is vhost-user's bit 30 (VHOST_USER_F_PROTOCOL_FEATURES,
	// QEMU docs/interop/vhost-user.rst), not virtio's: GET/SET_PROTOCOL_FEATURES exist.
	VhostUserProtocolFeatures = 30
	Version1                  = 32 // virtio 1.x: little-endian rings, the 12-byte net header
	RingPacked                = 34 // the packed virtqueue layout
)

// names are the bits a vhost-user-net front-end can exchange, named as in the virtio
// spec without the VIRTIO_NET_F_ / VIRTIO_F_ prefixes.
var names = map[uint]string{
	0: "CSUM", 1: "GUEST_CSUM", 2: "CTRL_GUEST_OFFLOADS", 3: "MTU", 5: "MAC",
	6: "GSO", 7: "GUEST_TSO4", 8: "GUEST_TSO6", 9: "GUEST_ECN", 10: "GUEST_UFO",
	11: "HOST_TSO4", 12: "HOST_TSO6", 13: "HOST_ECN", 14: "HOST_UFO", 15: "MRG_RXBUF",
	16: "STATUS", 17: "CTRL_VQ", 18: "CTRL_RX", 19: "CTRL_VLAN", 20: "CTRL_RX_EXTRA",
	21: "GUEST_ANNOUNCE", 22: "MQ", 23: "CTRL_MAC_ADDR", 24: "NOTIFY_ON_EMPTY",
	26: "LOG_ALL", 27: "ANY_LAYOUT", 28: "INDIRECT_DESC", 29: "EVENT_IDX",
	30: "PROTOCOL_FEATURES",
	32: "VERSION_1", 33: "ACCESS_PLATFORM", 34: "RING_PACKED", 35: "IN_ORDER",
	36: "ORDER_PLATFORM", 37: "SR_IOV", 38: "NOTIFICATION_DATA", 40: "RING_RESET",
	54: "GUEST_USO4", 55: "GUEST_USO6", 56: "HOST_USO", 57: "HASH_REPORT",
	59: "GUEST_HDRLEN", 60: "RSS", 61: "RSC_EXT", 62: "STANDBY", 63: "SPEED_DUPLEX",
}

// Names lists the set bits of f by name, lowest bit first; a bit without a name is
// shown as bit(N).
func Names(f uint64) []string {
	var out []string
	for f != 0 {
		b := uint(bits.TrailingZeros64(f))
		f &^= 1 << b
		if name, ok := names[b]; ok {
			out = append(out, name)
		} else {
			out = append(out, fmt.Sprintf("bit(%d)", b))
		}
	}
	return out
}

// String is Names joined with spaces ("none" for 0).
func String(f uint64) string {
	if f == 0 {
		return "none"
	}
	return strings.Join(Names(f), " ")
}
