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
			st.Drops[DropMalformed].Add(1)
			continue
		}
		buf := p.cur[i]
		if err := p.hdr.Decode(buf[p.head-p.phl:], p.phl); err != nil {
			st.Drops[DropMalformed].Add(1)
			continue
		}
		frame := buf[p.head : p.head-p.phl+p.sizes[i]]
		if vnethdr.ValidatePeer(frame, &p.hdr) != nil {
			st.Drops[DropMalformed].Add(1)
			continue
		}
		if p.hdr.IsGSO() && b.tapWriteOK(&p.hdr, len(frame)) {
			st.GSOPassthrough.Add(1)
		}
		coal.Add(buf[p.head-tl:p.head-p.phl+p.sizes[i]], &p.hdr, now)
	}
}

// tapWriteOK reports whether the TAP takes a frame with this (validated) header whole.
// The offload rule is tapTakes(b.tapWrite()).AcceptsFrame, the same that negotiate plans
// the port→TAP steps with; the two further rules are about one frame, not its kind.
func (b *bridge) tapWriteOK(h *vnethdr.Hdr, frameLen int) bool {
	if !tapTakes(b.tapWrite()).AcceptsFrame(h) {
		return false
	}
	if !h.IsGSO() {
		return true
	}
	if h.Flags&vnethdr.FlagNeedsCsum == 0 {
		// GSO without NEEDS_CSUM breaks the virtio rule (virtio spec "Packet
		// Transmission": GSO requires VIRTIO_NET_HDR_F_NEEDS_CSUM); Split copes.
		return false
	}
	if h.GSOType&^vnethdr.GSOECN == vnethdr.GSOUDPL4 {
		// Older kernels refuse more than UDP_MAX_SEGMENTS = 64 segments
		// (include/linux/udp.h; net/ipv4/udp_offload.c __udp_gso_segment).
		payload := frameLen - int(h.CsumStart) - 8
		if vnethdr.Segments(payload, int(h.GSOSize)) > vnethdr.MaxUSOSegmentsOld {
			return false
		}
	}
	return true
}

// tapTakes is what the TAP takes on write given write, its GSO write offloads: partial
// checksums always, whatever TUNSETOFFLOAD says (include/linux/virtio_net.h
// virtio_net_hdr_to_skb does not consult it).
func tapTakes(write vnethdr.Offloads) vnethdr.Offloads { return write | vnethdr.OffloadCSUM }

// portAccepts is what a port with hdrLen-byte vnet headers may be handed whole: nothing
// without a header, whatever it says.
func portAccepts(hdrLen int, accepts vnethdr.Offloads) vnethdr.Offloads {
	if hdrLen == 0 {
		return 0
	}
	return accepts
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
