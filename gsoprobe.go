package main

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// probeGSOWrite writes one small two-segment TCPv4 GSO frame to the TAP and reports
// whether the kernel took it. Some kernels reject valid GSO frames with EINVAL (Tailscale
// met this on 6.6.44, research/gro.md §c.1); finding out now lets tapgro write plain
// segments from the start instead of discovering it on the first aggregate.
//
// The frame is addressed to a MAC that is not the TAP's, so once the kernel has validated
// the virtio header in tun_get_user the stack marks it PACKET_OTHERHOST and drops it in
// ip_rcv: nothing reaches a socket. The TAP must be up (a down TAP answers EIO, which
// says nothing about GSO, so that case is not an error here).
func probeGSOWrite(tap *tapdev.Device, hdrLen int) error {
	pkt := buildProbeFrame(hdrLen)
	_, err := tap.Write(pkt)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EIO):
		return nil
	default:
		return fmt.Errorf("GSO probe write: %w", err)
	}
}

func buildProbeFrame(hdrLen int) []byte {
	const (
		payload = 8
		segs    = 2
		l4      = 14 + 20
		total   = l4 + 20 + payload*segs
	)
	pkt := make([]byte, hdrLen+total)
	h := vnethdr.Hdr{
		Flags:      vnethdr.FlagNeedsCsum,
		GSOType:    vnethdr.GSOTCPv4,
		HdrLen:     l4 + 20,
		GSOSize:    payload,
		CsumStart:  l4,
		CsumOffset: 16,
	}
	h.Encode(pkt, hdrLen)
	f := pkt[hdrLen:]
	copy(f[0:6], []byte{0x02, 0x74, 0x61, 0x70, 0x67, 0x72}) // not the TAP's MAC: dropped as OTHERHOST
	copy(f[6:12], []byte{0x02, 0x74, 0x61, 0x70, 0x67, 0x73})
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(total-14))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8] = 64
	ip[9] = unix.IPPROTO_TCP
	copy(ip[12:16], []byte{198, 18, 255, 254})
	copy(ip[16:20], []byte{198, 18, 255, 253})
	binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip, 0))
	tcp := f[l4 : l4+20]
	binary.BigEndian.PutUint16(tcp[0:], 9) // discard
	binary.BigEndian.PutUint16(tcp[2:], 9)
	binary.BigEndian.PutUint32(tcp[4:], 1)
	binary.BigEndian.PutUint32(tcp[8:], 1)
	tcp[12] = 5 << 4
	tcp[13] = 0x10 // ACK
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	// NEEDS_CSUM: the field holds the pseudo-header sum, not inverted (wire.md §1.6).
	binary.BigEndian.PutUint16(tcp[16:], vnethdr.Fold(vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, ip[12:16], ip[16:20], 20+payload*segs)))
	return pkt
}
