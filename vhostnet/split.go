//go:build linux

package vhostnet

import (
	"time"

	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// Segmenting toward the guest (TAP → guest). A GSO frame the guest cannot take whole is
// cut into plain, fully checksummed frames here, one per gso_size bytes, as the kernel
// would have cut it before the TAP (net/ipv4/udp_offload.c __udp_gso_segment,
// tcp_offload.c tcp_gso_segment): vnethdr.SplitHeaders builds each segment's headers
// in private memory and points at its payload in a private copy of the frame.
//
// The case this is for is UDP. A guest that did not ack GUEST_USO4/6 is the common one —
// Linux guests before 6.2 cannot, and QEMU 10.0 clears the bits for a vhost-user peer
// (net/vhost-user.c has no has_uso hook, so hw/net/virtio-net.c
// virtio_net_get_features drops them) — and a host application that sends with
// UDP_SEGMENT (QUIC, WireGuard) hands the kernel 64 KB UDP GSO packets. Without USO on
// the TAP the kernel segments each one before tun and tapgro pays one TAP read per
// datagram; with USO on (applyOffloads sets it whenever the guest takes partial
// checksums), one read brings up to 64 datagrams and the cutting costs a copy each,
// which the reads into the guest's chains cost anyway. So TUNSETOFFLOAD carries USO
// even for a guest that acked neither bit, and frames of an IP version whose
// GUEST_USO bit is missing come here. The kernel insists on TUN_F_USO4 and USO6
// together (drivers/net/tun.c set_offload), so a guest that acked one of the two gets
// the other version's frames cut here too.
//
// TCP GSO frames come here only in a transition: frames the TAP queued before a
// SET_FEATURES (or `tapgro ctl offload`) narrowed TUNSETOFFLOAD. They used to be dropped;
// cutting them loses nothing.
//
// Where the frame comes from: in the zero-copy path the TAP has already written it into
// the guest's chains, so it is copied out once into rxSplit.frame (the chains go back
// to the ring unused) — guest memory the guest can rewrite, but the only reader of what
// is cut is that same guest, and every header the cutting decides from is parsed from
// the private copy, never read twice. In the bounce and RSC paths it already sits in
// private memory and is copied once more into rxSplit.frame (their buffers are reused
// by the next read).
//
// Each segment goes to the guest as its own frame: a header with no GSO and
// DATA_VALID when the guest acked GUEST_CSUM (the checksums were just computed; the
// driver may skip verifying them, virtio spec "Processing of Incoming Packets"), then
// the segment's headers and payload, put into reserved chains. When the ring runs out
// mid-frame the rest waits here, the worker stops reading the TAP and waits for the
// guest's buffers (as rx.go's stall), and the next batch resumes at the segment after
// the last one delivered: nothing is reordered, since no frame is read meanwhile.

// rxSplit is one RX worker's segmenter; its buffers are made at first use and reused.
type rxSplit struct {
	frame   []byte   // the frame being cut (no virtio header)
	hdrArea []byte   // segment i's headers at [i·hdrLen, (i+1)·hdrLen)
	hdrs    [][]byte // views into hdrArea, for SplitHeaders
	pays    [][]byte // each segment's payload, a view into frame
	vh      [vnethdr.LenMrgRxbuf]byte
	nseg    int // segments of the current frame
	next    int // the next segment to deliver (next < nseg: pending)
	hdrLen  int
	csum    bool // the guest acked GUEST_CSUM: segments carry DATA_VALID
}

// pending reports whether segments of a cut frame wait for guest buffers.
func (s *rxSplit) pending() bool { return s != nil && s.next < s.nseg }

// load copies the frame (header h decoded; the frame after the virtio header is
// frameLen bytes of iov from byte skip) into private memory and cuts it. It returns
// false, with nothing pending, if the frame cannot be cut (vnethdr.Plan's reasons: a
// header that contradicts the frame), which the caller counts as an offload violation.
func (s *rxSplit) load(iov [][]byte, skip, frameLen int, h *vnethdr.Hdr, csum bool) bool {
	if s.frame == nil {
		s.frame = make([]byte, MaxFrame)
		s.hdrs = make([][]byte, vnethdr.MaxSegments)
		s.pays = make([][]byte, vnethdr.MaxSegments)
	}
	f := s.frame[:frameLen]
	vhostuser.CopyFrom(f, iov, skip)
	p, err := vnethdr.Plan(f, h)
	if err != nil {
		return false
	}
	if need := p.Segments * p.HdrLen; len(s.hdrArea) < need {
		s.hdrArea = make([]byte, need)
	}
	for i := range p.Segments {
		s.hdrs[i] = s.hdrArea[i*p.HdrLen : (i+1)*p.HdrLen]
	}
	n, err := vnethdr.SplitHeaders(f, h, s.hdrs[:p.Segments], s.pays[:p.Segments])
	if err != nil {
		return false
	}
	s.nseg, s.next, s.hdrLen, s.csum = n, 0, p.HdrLen, csum
	return true
}

// loadFlat is load for a frame already in private memory.
func (s *rxSplit) loadFlat(frame []byte, h *vnethdr.Hdr, csum bool) bool {
	var one [1][]byte
	one[0] = frame
	return s.load(one[:], 0, len(frame), h, csum)
}

// drain delivers the pending segments, in order, into reserved chains (under the
// batch's read lock). It returns false if the ring ran out of buffers (segments still
// pending) or broke (broken true); the caller then stops reading the TAP.
func (n *Net) drainSplit(v vhostuser.Queue, st *rxState, ringHL int) (ok, broken bool) {
	s := &st.split
	var h vnethdr.Hdr
	if s.csum {
		h.Flags = vnethdr.FlagDataValid
	}
	h.Encode(s.vh[:], ringHL) // num_buffers is commit's
	for s.next < s.nseg {
		i := s.next
		total := ringHL + s.hdrLen + len(s.pays[i])
		segs, capTotal, err := st.resv.reserve(v, total, st.iov, n.mrg)
		if err != nil {
			return false, err != vhostuser.ErrEmpty
		}
		s.next++
		if capTotal < total {
			// Without MRG_RXBUF a frame takes one chain, and this one is too short.
			st.resv.release(v)
			n.stats.Drops[DropRXTruncated].Add(1)
			continue
		}
		putAt(segs, 0, s.vh[:ringHL])
		putAt(segs, ringHL, s.hdrs[i])
		putAt(segs, ringHL+s.hdrLen, s.pays[i])
		if cw := n.capture.Writer(); cw != nil {
			cw.WriteFrameV(time.Now(), segs, ringHL, total-ringHL)
		}
		used := st.resv.commit(v, total, ringHL)
		if n.perFrame {
			v.Publish()
		}
		n.countRX(st.q, total-ringHL, used, false)
	}
	n.stats.GSOSegmented.Add(1)
	return true, false
}
