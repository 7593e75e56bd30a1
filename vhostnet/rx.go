//go:build linux

package vhostnet

import (
	"errors"
	"time"

	"tapgro/tapdev"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// rxBudget bounds the frames one RX batch takes from the TAP.
const rxBudget = 64

const (
	rxGo      = iota // budget spent: go on
	rxIdle           // the TAP has nothing: wait for it
	rxStalled        // the ring has too few buffers: wait for the guest if a frame waits
	rxGuest          // packets wait for guest buffers (rsc.go): wait for the guest
	rxStop
)

func (n *Net) rxLoop(w *worker) {
	defer close(w.done)
	v, tap := w.v, w.q.tap
	// ReserveRX's segments also go to readv, which takes MaxIov-1 of them (Readv keeps
	// one for its truncation sink). A chain set needing more breaks the ring
	// (RejectIovFull): only a guest posting tiny buffers could do that.
	iov := make([][]byte, 0, tapdev.MaxIov-1)
	var hdr [vnethdr.LenMrgRxbuf]byte
	var rsc *rxRSC // created when the guest first needs it (rsc.go)
	for !w.stop.Load() {
		if !v.Enabled() {
			// Started but disabled: no RX (vhost-user.rst "Ring states"). Enabling comes
			// with no kick, so look again shortly.
			time.Sleep(time.Millisecond)
			continue
		}
		ringHL := v.HdrLen()
		n.mu.RLock()
		if ringHL != n.tapHdr {
			// SET_FEATURES is between updating the ring and telling us.
			n.mu.RUnlock()
			time.Sleep(100 * time.Microsecond)
			continue
		}
		need := ringHL + MaxFrame // a mergeable reservation covers any frame
		state := rxGo
		if err := v.Begin(); err != nil {
			n.mu.RUnlock()
			return
		}
		if n.rscMode || (rsc != nil && rsc.pending()) {
			// Coalescing toward the guest; also while packets from it are pending
			// after the mode ended, so that nothing is overtaken.
			if rsc == nil {
				rsc = n.newRXRSC(v, iov, w.q)
			}
			state = rsc.batch(ringHL)
		}
		for i := 0; i < rxBudget && state == rxGo && (rsc == nil || !n.rscMode && !rsc.pending()); i++ {
			segs, _, err := v.ReserveRX(need, iov)
			if err != nil {
				state = rxStalled
				if !errors.Is(err, vhostuser.ErrEmpty) {
					state = rxStop
				}
				break
			}
			k, err := tap.TryReadv(segs)
			if err != nil {
				v.CommitRX(0) // hands the chains back
				if errors.Is(err, tapdev.ErrWouldBlock) {
					state = rxIdle
					break
				}
				if errors.Is(err, tapdev.ErrTruncated) {
					n.stats.Drops[DropRXTruncated].Add(1)
					continue
				}
				n.stats.Drops[DropRXTAP].Add(1)
				state = rxIdle
				break
			}
			gso, ok := n.rxCheck(segs, hdr[:], ringHL)
			if !ok {
				v.CommitRX(0)
				n.stats.Drops[DropRXOffload].Add(1)
				continue
			}
			if cw := n.capture.Writer(); cw != nil {
				cw.WriteFrameV(time.Now(), segs, ringHL, k-ringHL)
			}
			used := v.CommitRX(k)
			if n.perFrame {
				v.Publish()
			}
			n.stats.RXFrames.Add(1)
			n.stats.RXBytes.Add(uint64(k - ringHL))
			w.q.stats.RXFrames.Add(1)
			w.q.stats.RXBytes.Add(uint64(k - ringHL))
			n.stats.RXChains.Add(uint64(used))
			if gso {
				n.stats.RXGSO.Add(1)
			}
		}
		clear(iov[:cap(iov)]) // do not keep guest memory referenced past End
		v.End()
		n.mu.RUnlock()
		if state == rxGuest {
			n.stats.RXStalls.Add(1)
			n.setWaiting(w.q, true, true)
			err := v.WaitMore()
			n.setWaiting(w.q, true, false)
			if err != nil {
				return
			}
			continue
		}
		if state == rxStalled {
			// Too few buffers for a frame. If a frame is waiting, that is a stall:
			// leave it in the TAP's queue (the kernel holds up to txqueuelen, then
			// drops) until the guest posts more buffers and kicks. If not, wait for
			// the TAP first.
			ready, err := tap.Readable()
			if err != nil && isClosed(err) {
				return
			}
			state = rxIdle
			if ready {
				n.stats.RXStalls.Add(1)
				n.setWaiting(w.q, true, true)
				err := v.WaitMore()
				n.setWaiting(w.q, true, false)
				if err != nil {
					return
				}
				continue
			}
		}
		switch state {
		case rxIdle:
			if err := tap.WaitReadable(); err != nil {
				if w.stop.Load() {
					return
				}
				if isClosed(err) {
					return
				}
				time.Sleep(time.Millisecond)
			}
		case rxStop:
			return
		}
	}
}

// rxCheck looks at the header the TAP wrote into the chain. A frame kind outside the
// guest's acks cannot come from a TAP whose TUNSETOFFLOAD ⊆ acks, except for frames
// queued before a SET_FEATURES narrowed it: those are refused (ok false) rather than
// handed over. DATA_VALID, which the TAP sets whatever TUNSETOFFLOAD says
// (virtio_net_hdr_from_skb with has_data_valid), is cleared for a guest without
// GUEST_CSUM: the driver must see flags 0 then (virtio spec "Processing of Incoming
// Packets").
func (n *Net) rxCheck(segs [][]byte, hdr []byte, hl int) (gso, ok bool) {
	vhostuser.CopyFrom(hdr[:vnethdr.Len], segs, 0)
	var h vnethdr.Hdr
	h.Decode(hdr, vnethdr.Len)
	need, known := h.Needs()
	if !known || need&^n.rxAllow != 0 {
		return false, false
	}
	if h.Flags&vnethdr.FlagDataValid != 0 && !n.guestCsm {
		segs[0][0] &^= vnethdr.FlagDataValid // header byte 0 is flags; segs[0] is never empty
	}
	return h.IsGSO(), true
}
