package datapath

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"tapgro/gsowrite"
	"tapgro/vnethdr"
)

// probeGSOWrite writes one small two-segment TCPv4 GSO frame to the TAP and reports
// whether the kernel took it. Some kernels reject valid GSO frames with EINVAL (Tailscale
// met this on 6.6.44, tailscale/tailscale#13041); finding out now lets tapgro write plain
// segments from the start instead of discovering it on the first aggregate.
//
// The frame is addressed to a MAC that is not the TAP's, so once the kernel has validated
// the virtio header in tun_get_user the stack marks it PACKET_OTHERHOST and drops it in
// ip_rcv: nothing reaches a socket. The TAP must be up (a down TAP answers EIO, which
// says nothing about GSO, so that case is not an error here).
func probeGSOWrite(tap tapIO, hdrLen int) error {
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

// buildProbeFrame is the start-up probe: a TCPv4 GSO frame behind a hdrLen-byte header.
func buildProbeFrame(hdrLen int) []byte {
	return gsowrite.AppendProbe(nil, hdrLen, vnethdr.GSOTCPv4, false)
}
