//go:build linux

package vhostnet

import (
	"time"

	"tapgro/gsowrite"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// A guest GSO frame the TAP refused with EINVAL, under the policy every tapgro datapath
// follows (package gsowrite): the frame goes to the TAP as plain segments cut from
// tapgro's copy, and the kind is turned off for good — every later frame of it cut
// before the write, and GRO toward the TAP stopped if it is TCP — only if tapgro's own
// probe frame of that kind is refused too. A guest's crafted header costs that one
// frame; nothing it sends turns an offload off. The guest keeps its acked features
// (they change only at a device reset), so what it sends of a killed kind keeps coming
// and is cut here.

// refusedGSO handles frame frameLen bytes long in chain c (its validated header h, the
// first copied bytes already in st.lin) that the TAP refused with cause.
func (n *Net) refusedGSO(st *txState, c vhostuser.Chain, ringHL, frameLen, copied int, h *vnethdr.Hdr, cause error) {
	n.refused(st, n.linearize(st, c, ringHL, frameLen, copied), h, cause, true)
}

// refused is refusedGSO for a frame already whole in tapgro's memory (a guest frame in
// st.lin, or a GRO packet, whose frames were counted when the engine took them: guest
// false).
func (n *Net) refused(st *txState, frame []byte, h *vnethdr.Hdr, cause error, guest bool) {
	n.stats.GSOFallback.Add(1)
	if st.prober.KindRefused(st.tapWrite, n.tapHdr, frame, h) {
		n.killOffload(gsowrite.Offload(h), cause)
	}
	n.splitToTAP(st, frame, h, guest)
}

// splitToTAP writes frame (its header h) to the TAP as plain segments. A guest's frame
// counts once (guest); a segment the TAP does not take is a TAP drop.
func (n *Net) splitToTAP(st *txState, frame []byte, h *vnethdr.Hdr, guest bool) {
	if cw := n.capture.Writer(); cw != nil && guest {
		cw.WriteFrame(time.Now(), frame) // as the guest sent it
	}
	st.segFailed = false
	if err := st.splitter.Split(frame, h, n.tapHdr, st.emitSeg); err != nil {
		n.stats.Drops[DropTXBadHeader].Add(1)
		return
	}
	if st.segFailed {
		n.stats.Drops[DropTXTAP].Add(1)
		return
	}
	if !guest {
		return
	}
	n.stats.TXFrames.Add(1)
	n.stats.TXBytes.Add(uint64(len(frame)))
	st.q.TXFrames.Add(1)
	st.q.TXBytes.Add(uint64(len(frame)))
}

// linearize completes tapgro's copy of the frame in st.lin: the headers already there
// are the ones validated, whatever the guest has written since.
func (n *Net) linearize(st *txState, c vhostuser.Chain, ringHL, frameLen, copied int) []byte {
	if copied < frameLen {
		vhostuser.CopyFrom(st.lin[copied:frameLen], c.Iov, ringHL+copied)
	}
	return st.lin[:frameLen]
}

// tapWrite writes one packet to the worker's TAP queue (the probe, a segment). A full
// TAP (which tun's INT_MAX sndbuf makes practically impossible) counts as a failure.
func (st *txState) tapWrite(pkt []byte) error {
	st.one[0] = pkt
	_, err := st.tap.TryWritev(st.one[:])
	st.one[0] = nil
	return err
}

// writeSegment is Splitter's emit: one segment to the TAP.
func (st *txState) writeSegment(seg []byte) {
	if err := st.tapWrite(seg); err != nil {
		st.segFailed = true
		return
	}
	if cw := st.tapCap.Writer(); cw != nil {
		cw.WriteFrame(time.Now(), seg[st.tap.VnetHdrLen():])
	}
}

// killOffload turns the GSO kinds off toward the TAP for good (until restart), and GRO
// with them for TCP, since the engine's output is TCP GSO.
func (n *Net) killOffload(off vnethdr.Offloads, cause error) {
	if off == 0 {
		return
	}
	old := vnethdr.Offloads(n.tapKilled.Or(uint32(off)))
	if old&off == off {
		return
	}
	if off&^vnethdr.OffloadUSO != 0 {
		n.groKilled.Store(true)
	}
	n.log.Warn("vhostnet: the kernel refused a valid GSO write and tapgro's probe of the same kind: guest frames of that kind go to the TAP as plain segments from now on",
		"offloads", off.String(), "error", cause, "gro_killed", n.groKilled.Load())
}

// TapKilled is the GSO kinds the kernel refused on write (after the probe): they are
// cut before the write.
func (n *Net) TapKilled() vnethdr.Offloads { return vnethdr.Offloads(n.tapKilled.Load()) }

// killedKind reports whether h is a GSO kind turned off toward the TAP.
func (n *Net) killedKind(h *vnethdr.Hdr) bool {
	k := n.tapKilled.Load()
	return k != 0 && h.IsGSO() && vnethdr.Offloads(k)&gsowrite.Offload(h) != 0
}
