package datapath

import (
	"tapgro/coalescer"
	"tapgro/port"
	"tapgro/vnethdr"
)

// The parts of the datapath that only ports carrying a vnet header use (vnet-hdr=on
// streams, netmap VALE ports with a header). For plain ports none of this runs.

// portHeader fills p.outHdr, the header a frame passed whole to the port carries: the
// TAP's header with num_buffers zeroed (the receiver fills it for mergeable buffers,
// virtio spec "Setting Up Receive Buffers") and a hdr_len hint that fits the frame (the
// TAP's is skb_headlen, include/linux/virtio_net.h virtio_net_hdr_from_skb; a receiving
// kernel refuses hdr_len > frame length, virtio_net_hdr_to_skb).
func (p *tapToPort) portHeader(frameLen int) {
	p.outHdr = p.hdr
	p.outHdr.NumBuffers = 0
	if int(p.outHdr.HdrLen) > frameLen {
		p.outHdr.HdrLen = 0
	}
}

// A frame vnethdr.ValidatePeer admits can always be split by tapWriter.split, whose
// buffers hold maxSegs segments (this fails to compile otherwise).
const _ = uint(maxSegs - vnethdr.MaxSegments)

// addWithHeaders offers n frames read from a header-carrying port to the GRO engine
// with their headers. The header is the peer's word and is checked against the frame
// first (vnethdr.ValidatePeer, which also replaces the peer's hdr_len with the one the
// frame's own headers give): the kernel would refuse an inconsistent one with EINVAL,
// and such a frame is dropped here as malformed so it never reaches the TAP, where a
// refusal is evidence about the kernel (tapWriter.refusedGSO).
func (p *portToTap) addWithHeaders(coal *coalescer.Coalescer, n int, now int64) {
	b := p.b
	st := &b.p2t
	tl := b.cfg.vnetHdrLen
	for i := 0; i < n; i++ {
		if p.sizes[i] < p.phl+port.MinFrame {
			st.DropMalformed.Add(1)
			continue
		}
		buf := p.cur[i]
		if err := p.hdr.Decode(buf[p.head-p.phl:], p.phl); err != nil {
			st.DropMalformed.Add(1)
			continue
		}
		frame := buf[p.head : p.head-p.phl+p.sizes[i]]
		if vnethdr.ValidatePeer(frame, &p.hdr) != nil {
			st.DropMalformed.Add(1)
			continue
		}
		if p.hdr.IsGSO() && b.tapWriteOK(&p.hdr, len(frame)) {
			st.GSOPassthrough.Add(1)
		}
		coal.Add(buf[p.head-tl:p.head-p.phl+p.sizes[i]], &p.hdr, now)
	}
}

// tapWriteOK reports whether the TAP takes a frame with this (validated) header whole.
func (b *bridge) tapWriteOK(h *vnethdr.Hdr, frameLen int) bool {
	if !h.IsGSO() {
		return true // partial checksums: always (virtio_net_hdr_to_skb ignores TUNSETOFFLOAD)
	}
	if !b.tapWrite().AcceptsFrame(h) || h.Flags&vnethdr.FlagNeedsCsum == 0 {
		// GSO without NEEDS_CSUM breaks the virtio rule (virtio spec "Packet
		// Transmission": GSO requires VIRTIO_NET_HDR_F_NEEDS_CSUM); Split copes.
		return false
	}
	if h.GSOType&^vnethdr.GSOECN == vnethdr.GSOUDPL4 {
		// Older kernels refuse more than UDP_MAX_SEGMENTS = 64 segments
		// (include/linux/udp.h; net/ipv4/udp_offload.c __udp_gso_segment).
		payload := frameLen - int(h.CsumStart) - 8
		if (payload+int(h.GSOSize)-1)/int(h.GSOSize) > 64 {
			return false
		}
	}
	return true
}

// refused decodes pkt's TAP header into w.hdr and reports whether it is a GSO packet
// the TAP does not take whole.
func (w *tapWriter) refused(pkt []byte) bool {
	hl := w.b.cfg.vnetHdrLen
	if w.hdr.Decode(pkt, hl) != nil || !w.hdr.IsGSO() {
		return false
	}
	return !w.b.tapWriteOK(&w.hdr, len(pkt)-hl)
}

// offloadOf names the offloads a GSO header uses.
func offloadOf(h *vnethdr.Hdr) vnethdr.Offloads {
	var o vnethdr.Offloads
	switch h.GSOType &^ vnethdr.GSOECN {
	case vnethdr.GSOTCPv4:
		o = vnethdr.OffloadTSO4
	case vnethdr.GSOTCPv6:
		o = vnethdr.OffloadTSO6
	case vnethdr.GSOUDPL4:
		o = vnethdr.OffloadUSO
	}
	if o != 0 && h.GSOType&vnethdr.GSOECN != 0 {
		o |= vnethdr.OffloadTSOECN
	}
	return o
}
