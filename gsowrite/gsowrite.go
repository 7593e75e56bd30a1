// Package gsowrite is what a TAP writer does when the kernel refuses a GSO write: the
// one policy every tapgro datapath follows (the socket engine's port→TAP writer and
// vhost-user's guest→TAP workers).
//
// Linux's tun_get_user hands every virtio-net header to virtio_net_hdr_to_skb
// (include/linux/virtio_net.h) and answers EINVAL for one it rejects. A valid GSO frame
// should never be refused, but some kernels have (Tailscale met it on 6.6.44,
// tailscale/tailscale#13041), and then every frame of that kind would be lost. So a
// refused GSO frame is always re-sent as plain segments (Splitter), and whether the
// offload is turned off for good is decided by evidence about the kernel, not about the
// frame: a probe frame tapgro builds itself, of the same GSO kind (gso_type with its
// ECN bit, IP version), must be refused too (Prober). If the kernel takes the probe, it
// objected to that one frame and nothing is turned off, so a peer's crafted header
// costs at most its own frame. Callers validate the frame with vnethdr.ValidatePeer
// first (a frame failing it is dropped as malformed and proves nothing).
//
// Probe frames are addressed to a MAC that is not the TAP's: once tun_get_user has
// validated the header, the stack drops them as PACKET_OTHERHOST (ip_rcv, ipv6_rcv).
// Nothing here allocates after first use.
package gsowrite

import (
	"errors"

	"golang.org/x/sys/unix"

	"tapgro/vnethdr"
)

// Offload names the offloads a GSO header uses (TSO4, TSO6 or USO, with TSO_ECN for
// the ECN bit); 0 for a header that is not GSO.
func Offload(h *vnethdr.Hdr) vnethdr.Offloads {
	need, ok := h.Needs()
	if !ok || !h.IsGSO() {
		return 0
	}
	return need &^ vnethdr.OffloadCSUM
}

// Prober asks the kernel whether it refuses a GSO kind. Not safe for concurrent use:
// one per writing goroutine.
type Prober struct{ buf []byte }

// KindRefused writes, with write, a probe frame of frame's GSO kind (its header h)
// behind a hdrLen-byte header, and reports whether the kernel refused it with EINVAL.
// Any other outcome (taken; EIO from a link that went down) says the offload works or
// says nothing, and kills nothing.
func (p *Prober) KindRefused(write func(pkt []byte) error, hdrLen int, frame []byte, h *vnethdr.Hdr) bool {
	if p.buf == nil {
		p.buf = make([]byte, 0, ProbeCap(vnethdr.LenMrgRxbuf))
	}
	ipv6 := false
	if l, err := vnethdr.ParseLayout(frame); err == nil {
		ipv6 = l.IPv6
	}
	p.buf = AppendProbe(p.buf[:0], hdrLen, h.GSOType, ipv6)
	return errors.Is(write(p.buf), unix.EINVAL)
}

// Splitter cuts GSO frames into plain segments in one slab that grows to the largest
// frame seen and is then reused. Not safe for concurrent use.
type Splitter struct {
	slab  []byte
	segs  [][]byte
	views [][]byte
	sizes []int
}

// Split cuts frame (its header h, from vnethdr.ValidatePeer or the engine) into its
// segments, each behind a zeroed hdrLen-byte header with its checksum complete, and
// calls emit with each in order. emit must not keep the slice. It returns an error,
// having emitted nothing, for a frame that cannot be segmented.
func (s *Splitter) Split(frame []byte, h *vnethdr.Hdr, hdrLen int, emit func(seg []byte)) error {
	pl, err := vnethdr.Plan(frame, h)
	if err != nil {
		return err
	}
	if s.sizes == nil {
		// vnethdr.Plan admits no more segments.
		s.segs = make([][]byte, vnethdr.MaxSegments)
		s.views = make([][]byte, vnethdr.MaxSegments)
		s.sizes = make([]int, vnethdr.MaxSegments)
	}
	segCap, nseg := hdrLen+pl.SegCap, pl.Segments
	if need := segCap * nseg; len(s.slab) < need {
		s.slab = make([]byte, need)
	}
	for i := range nseg {
		s.segs[i] = s.slab[i*segCap : (i+1)*segCap]
		s.views[i] = s.segs[i][hdrLen:]
	}
	n, err := vnethdr.Split(frame, h, s.views[:nseg], s.sizes[:nseg])
	if err != nil {
		return err
	}
	for i := range n {
		out := s.segs[i][:hdrLen+s.sizes[i]]
		vnethdr.Zero(out, hdrLen)
		emit(out)
	}
	return nil
}
