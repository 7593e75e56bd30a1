package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"

	"tapgro/vnethdr"
)

// Announcements: a TAP created anew (tapgro restarted, or the TAP recreated) gets a new
// random MAC, and a peer that kept running still has the old one in its neighbour cache
// for up to a minute. So on every new connection tapgro tells the peer who it is, as
// QEMU's announce-self does for a migrated guest: a gratuitous ARP for each IPv4 address
// and an unsolicited, overriding Neighbour Advertisement for each IPv6 address. Linux
// updates an existing entry from either (arp_process treats a gratuitous ARP as an
// override; ndisc_recv_na honours the O flag) and creates none, so this is harmless to a
// peer that never knew us.

// announceFrames builds the frames for mac and addrs.
func announceFrames(mac net.HardwareAddr, addrs []netip.Prefix) [][]byte {
	if len(mac) != 6 {
		return nil
	}
	var out [][]byte
	for _, p := range addrs {
		a := p.Addr()
		switch {
		case a.Is4():
			out = append(out, garp(mac, a))
		case a.Is6() && !a.IsMulticast():
			out = append(out, unsolicitedNA(mac, a))
		}
	}
	return out
}

func garp(mac net.HardwareAddr, a netip.Addr) []byte {
	f := make([]byte, 60) // padded to the Ethernet minimum
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], 0x0806)
	arp := f[14:]
	binary.BigEndian.PutUint16(arp[0:], 1)      // Ethernet
	binary.BigEndian.PutUint16(arp[2:], 0x0800) // IPv4
	arp[4], arp[5] = 6, 4
	binary.BigEndian.PutUint16(arp[6:], 1) // request: the form every stack accepts as gratuitous
	ip := a.As4()
	copy(arp[8:14], mac)
	copy(arp[14:18], ip[:])
	copy(arp[24:28], ip[:]) // target IP = sender IP: gratuitous
	return f
}

func unsolicitedNA(mac net.HardwareAddr, a netip.Addr) []byte {
	const icmpLen = 24 + 8 // NA + target link-layer address option
	f := make([]byte, 14+40+icmpLen)
	copy(f[0:6], []byte{0x33, 0x33, 0, 0, 0, 1}) // all-nodes
	copy(f[6:12], mac)
	binary.BigEndian.PutUint16(f[12:], 0x86dd)
	ip := f[14:54]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], icmpLen)
	ip[6] = 58  // ICMPv6
	ip[7] = 255 // RFC 4861 §7.1.2: receivers drop NDP with any other hop limit
	src := a.As16()
	dst := netip.MustParseAddr("ff02::1").As16()
	copy(ip[8:24], src[:])
	copy(ip[24:40], dst[:])
	icmp := f[54:]
	icmp[0] = 136                               // Neighbor Advertisement
	binary.BigEndian.PutUint32(icmp[4:], 1<<29) // O(verride), not S(olicited)
	copy(icmp[8:24], src[:])
	icmp[24], icmp[25] = 2, 1 // target link-layer address, 8 bytes
	copy(icmp[26:32], mac)
	binary.BigEndian.PutUint16(icmp[2:], vnethdr.Checksum(icmp, vnethdr.PseudoHeaderSum(58, src[:], dst[:], icmpLen)))
	return f
}
