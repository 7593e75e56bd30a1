package datapath

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/gsowrite"
	"tapgro/tapdev"
	"tapgro/vnethdr"
)

// Port→TAP, writing: the GRO engine's output goes to the TAP, one write (or one
// writev for an aggregate that still references the port's buffers) per packet. A GSO
// kind the TAP does not take is split first; a GSO write the kernel refuses decides,
// with a probe frame of the same kind, whether that offload is turned off for good.

// tapWriter writes the coalescer's output to the TAP. It belongs to the port→TAP
// goroutine of whichever connection is live (one at a time), so it needs no lock.
type tapWriter struct {
	b   *bridge
	hdr vnethdr.Hdr
	vec vectorTap // the TAP's vectored write, nil if it has none

	// flat is where writev copies an aggregate together for the paths that need it in
	// one piece (capture, a refused or unsupported vectored write); allocated on first use.
	flat []byte

	// hdrPort is set while the live connection's port carries vnet headers: its GSO
	// frames reach write() whole and may be of a kind the TAP does not take.
	hdrPort bool

	// The EINVAL fallback (package gsowrite): probe frames and segments, allocated on
	// first use.
	prober   gsowrite.Prober
	splitter gsowrite.Splitter
	emitSeg  func(seg []byte) // w.writeSegment, made once
}

// tapWrite is what frames written to the TAP may carry: what the kernel accepts on
// write, minus the offloads it has refused since.
func (b *bridge) tapWrite() vnethdr.Offloads {
	return b.cfg.tapAccepts &^ vnethdr.Offloads(b.tapKilled.Load())
}

// write is the coalescer's output: one write() per packet, which is the point of GRO.
func (w *tapWriter) write(pkt []byte) {
	st := &w.b.p2t
	if w.hdrPort && w.refused(pkt) {
		// A GSO kind from the port that the TAP does not take (or no longer takes).
		st.GSOSegmented.Add(1)
		w.split(pkt)
		return
	}
	_, err := w.b.tap.Write(pkt)
	if err == nil {
		if c := w.b.capture.tap.Writer(); c != nil {
			c.WriteFrame(time.Now(), pkt[w.b.cfg.vnetHdrLen:])
		}
		st.Frames.Add(1)
		st.Bytes.Add(uint64(len(pkt) - w.b.cfg.vnetHdrLen))
		return
	}
	switch {
	case errors.Is(err, unix.EINVAL) && w.isGSO(pkt):
		w.refusedGSO(pkt, err)
	case errors.Is(err, unix.EIO):
		st.Drops[DropTapEIO].Add(1)
	default:
		st.Drops[DropTapError].Add(1)
	}
}

// writev is the coalescer's vectored output (coalescer.SetEmitV): an aggregate whose
// payloads are still in the port's read buffers, iov[0] its vnet header and rewritten
// headers, the rest its payloads, written with one writev(2) and so copied only by the
// kernel. The rare paths that need the packet in one piece (capture, a vnet-hdr port's
// GSO kind the TAP does not take, a write refused with EINVAL, a TAP without vectored
// writes) get a flat copy and go through write.
func (w *tapWriter) writev(iov [][]byte) {
	if w.vec == nil || w.hdrPort || w.b.capture.tap.Writer() != nil {
		w.write(w.flatten(iov))
		return
	}
	st := &w.b.p2t
	n, err := w.vec.Writev(iov)
	if err == nil {
		st.Frames.Add(1)
		st.Bytes.Add(uint64(n - w.b.cfg.vnetHdrLen))
		return
	}
	switch {
	case errors.Is(err, tapdev.ErrUnsupported):
		w.vec = nil
		w.write(w.flatten(iov))
	case errors.Is(err, unix.EINVAL) && w.isGSO(iov[0]):
		w.refusedGSO(w.flatten(iov), err)
	case errors.Is(err, unix.EIO):
		st.Drops[DropTapEIO].Add(1)
	default:
		st.Drops[DropTapError].Add(1)
	}
}

// flatten copies iov together into w.flat.
func (w *tapWriter) flatten(iov [][]byte) []byte {
	if w.flat == nil {
		w.flat = make([]byte, 0, w.b.frameCap())
	}
	f := w.flat[:0]
	for _, b := range iov {
		f = append(f, b...)
	}
	w.flat = f[:0]
	return f
}

func (w *tapWriter) isGSO(pkt []byte) bool {
	return w.hdr.Decode(pkt, w.b.cfg.vnetHdrLen) == nil && w.hdr.IsGSO()
}

// refusedGSO handles a GSO packet the kernel refused with EINVAL (w.hdr holds its
// header, set by isGSO), by package gsowrite's policy: re-sent as plain segments, and
// the offload turned off for good — GRO with it for TCP, since a kernel with a GSO bug
// rejects every valid frame of that kind — only if a probe frame of the same kind is
// refused too. The packet must pass vnethdr.ValidatePeer, the kernel's own write-side
// rules (drivers/net/tun.c tun_get_user, include/linux/virtio_net.h
// virtio_net_hdr_to_skb); everything that gets here was either built by the GRO engine
// or admitted by that same check in addWithHeaders, so this only re-states the
// condition, and a packet failing it is dropped as malformed and proves nothing.
func (w *tapWriter) refusedGSO(pkt []byte, cause error) {
	b := w.b
	st := &b.p2t
	hl := b.cfg.vnetHdrLen
	if vnethdr.ValidatePeer(pkt[hl:], &w.hdr) != nil {
		st.Drops[DropMalformed].Add(1)
		return
	}
	st.GSOFallback.Add(1)
	if w.prober.KindRefused(w.tapWrite, hl, pkt[hl:], &w.hdr) {
		w.kill(gsowrite.Offload(&w.hdr), cause)
	}
	w.split(pkt)
}

// tapWrite is the TAP's write, as gsowrite's Prober calls it.
func (w *tapWriter) tapWrite(pkt []byte) error {
	_, err := w.b.tap.Write(pkt)
	return err
}

// kill turns the offloads off for good (sticky until restart): frames of that kind
// are split before the write from now on, and for TCP the GRO engine stops building them.
func (w *tapWriter) kill(off vnethdr.Offloads, cause error) {
	b := w.b
	if off&^vnethdr.OffloadUSO != 0 || off == 0 {
		// TCP GSO refused: the GRO engine's TCP output is the same kind.
		if !b.groKilled.Swap(true) && b.onGROKill != nil {
			b.onGROKill(cause)
		}
	}
	if off != 0 {
		if old := vnethdr.Offloads(b.tapKilled.Or(uint32(off))); old&off != off {
			b.reconf.Add(1) // the engine's UDP/ECN settings follow tapWrite
			if b.onOffloadKill != nil {
				b.onOffloadKill(off&^old, cause)
			}
		}
	}
}

// split writes the GSO packet pkt (its header decoded into w.hdr) to the TAP as plain
// segments.
func (w *tapWriter) split(pkt []byte) {
	hl := w.b.cfg.vnetHdrLen
	if w.emitSeg == nil {
		w.emitSeg = w.writeSegment
	}
	if w.splitter.Split(pkt[hl:], &w.hdr, hl, w.emitSeg) != nil {
		w.b.p2t.Drops[DropMalformed].Add(1)
	}
}

// writeSegment writes one segment of a split packet.
func (w *tapWriter) writeSegment(out []byte) {
	b := w.b
	st := &b.p2t
	hl := b.cfg.vnetHdrLen
	if _, err := b.tap.Write(out); err != nil {
		st.Drops[DropTapError].Add(1)
		return
	}
	if c := b.capture.tap.Writer(); c != nil {
		c.WriteFrame(time.Now(), out[hl:])
	}
	st.Frames.Add(1)
	st.Bytes.Add(uint64(len(out) - hl))
}
