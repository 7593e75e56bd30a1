package vhostnet

import (
	"fmt"
	"math/bits"
	"strings"
)

// featureNames are the virtio feature bits a vhost-user-net front-end can exchange,
// named as in the virtio spec ("Network Device / Feature bits", "Reserved Feature
// Bits") without the VIRTIO_NET_F_ / VIRTIO_F_ prefixes; linux
// include/uapi/linux/virtio_net.h and virtio_config.h number them.
var featureNames = map[uint]string{
	0: "CSUM", 1: "GUEST_CSUM", 2: "CTRL_GUEST_OFFLOADS", 3: "MTU", 5: "MAC",
	6: "GSO", 7: "GUEST_TSO4", 8: "GUEST_TSO6", 9: "GUEST_ECN", 10: "GUEST_UFO",
	11: "HOST_TSO4", 12: "HOST_TSO6", 13: "HOST_ECN", 14: "HOST_UFO", 15: "MRG_RXBUF",
	16: "STATUS", 17: "CTRL_VQ", 18: "CTRL_RX", 19: "CTRL_VLAN", 20: "CTRL_RX_EXTRA",
	21: "GUEST_ANNOUNCE", 22: "MQ", 23: "CTRL_MAC_ADDR", 24: "NOTIFY_ON_EMPTY",
	27: "ANY_LAYOUT", 28: "INDIRECT_DESC", 29: "EVENT_IDX",
	30: "PROTOCOL_FEATURES", // vhost-user's VHOST_USER_F_PROTOCOL_FEATURES, not virtio's
	32: "VERSION_1", 33: "ACCESS_PLATFORM", 34: "RING_PACKED", 35: "IN_ORDER",
	36: "ORDER_PLATFORM", 37: "SR_IOV", 38: "NOTIFICATION_DATA", 40: "RING_RESET",
	54: "GUEST_USO4", 55: "GUEST_USO6", 56: "HOST_USO", 57: "HASH_REPORT",
	59: "GUEST_HDRLEN", 60: "RSS", 61: "RSC_EXT", 62: "STANDBY", 63: "SPEED_DUPLEX",
}

// FeatureNames lists the set bits of f by name, lowest bit first; a bit without a
// name is shown as bit(N).
func FeatureNames(f uint64) []string {
	var out []string
	for f != 0 {
		b := uint(bits.TrailingZeros64(f))
		f &^= 1 << b
		if name, ok := featureNames[b]; ok {
			out = append(out, name)
		} else {
			out = append(out, fmt.Sprintf("bit(%d)", b))
		}
	}
	return out
}

// FeatureString is FeatureNames joined with spaces ("none" for 0).
func FeatureString(f uint64) string {
	if f == 0 {
		return "none"
	}
	return strings.Join(FeatureNames(f), " ")
}
