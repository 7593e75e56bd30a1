//go:build linux

package vhostnet

import (
	"errors"
	"time"

	"tapgro/tapdev"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// txBudget bounds the chains one TX batch handles, so the control plane never waits
// long for End.
const txBudget = 64

// validatePrefix is how much of a split frame is gathered to validate its headers: far
// more than Ethernet + VLAN + IPv6 + TCP with options (134 bytes). ValidatePeer reads
// nothing past the header length it re-derives, so when that is within the prefix, the
// rest of the frame never needs copying.
const validatePrefix = 512

type txState struct {
	iov  [][]byte // Pop's view of the chain
	out  [][]byte // writev: our header copy, then the frame's segments
	hdr  [vnethdr.LenMrgRxbuf]byte
	lin  []byte // validation scratch and, rarely, a linearized frame
	nPop int

	tap *tapdev.Device // the pair's TAP queue
	q   *QueueStats    // the pair's counters
	gro *txGRO         // nil: GRO off (gro.go)
	gh  vnethdr.Hdr    // the header handed to the engine (kept off the stack)
}

func (n *Net) txLoop(w *worker) {
	defer close(w.done)
	v := w.v
	st := &txState{
		tap: w.q.tap,
		q:   w.q.stats,
		// A chain has at most Num descriptors, each at most two regions' worth.
		iov: make([][]byte, 0, 2*v.Num()+2),
		out: make([][]byte, 0, tapdev.MaxIov),
		lin: make([]byte, MaxFrame),
		gro: n.newTXGRO(w.q),
	}
	defer st.gro.flushAll() // what timer mode holds goes out before the worker ends
	for !w.stop.Load() {
		if err := v.Wait(); err != nil {
			return
		}
		ringHL := v.HdrLen()
		n.mu.RLock()
		if err := v.Begin(); err != nil {
			n.mu.RUnlock()
			return
		}
		blocked, empty := false, false
		for range txBudget {
			c, err := v.Pop(st.iov)
			if err != nil {
				empty = true // ErrEmpty; a broken ring makes the next Wait fail
				break
			}
			if !v.Enabled() {
				n.stats.Drops[DropTXDisabled].Add(1)
				v.Push(c.Head, 0)
				continue
			}
			if errors.Is(n.tx(st, c, ringHL), tapdev.ErrWouldBlock) {
				v.Rewind(1)
				blocked = true
				break
			}
			// virtio spec "Packet Transmission": used.len is 0 for TX, nothing written.
			v.Push(c.Head, 0)
			if n.perFrame {
				// What GRO holds is a copy: the chain is free for the guest.
				v.Publish()
			}
		}
		if st.gro != nil {
			// Before End: the aggregates are written before the guest sees its chains
			// used, as if each segment had been (endBatch says when).
			st.gro.endBatch(empty || blocked)
		}
		v.End()
		n.mu.RUnlock()
		if blocked {
			n.stats.TXBlocked.Add(1)
			n.setWaiting(w.q, false, true)
			err := st.tap.WaitWritable()
			n.setWaiting(w.q, false, false)
			if err != nil && w.stop.Load() {
				return
			}
		}
	}
}

// tx writes one guest TX chain to the TAP. The header is gathered by byte offset (the
// driver may split it over descriptors and start the frame inside the header's
// descriptor: virtio spec "Message Framing"), decoded once from our copy (the guest
// can change its memory meanwhile), checked with vnethdr.ValidatePeer when the kernel
// would act on it, and re-encoded into our own buffer, which is the first writev
// segment: the TAP's header length equals the guest's, so the frame itself goes to
// the kernel straight from guest memory in one writev (cloud-hypervisor process_tx
// does the same). It returns tapdev.ErrWouldBlock if the TAP could not take it now.
func (n *Net) tx(st *txState, c vhostuser.Chain, ringHL int) error {
	tapHL := n.tapHdr
	frameLen := c.Len - ringHL
	switch {
	case frameLen < 14:
		n.stats.Drops[DropTXRunt].Add(1)
		return nil
	case frameLen > MaxFrame:
		n.stats.Drops[DropTXTooLong].Add(1)
		return nil
	}
	var h vnethdr.Hdr
	vhostuser.CopyFrom(st.hdr[:ringHL], c.Iov, 0)
	h.Decode(st.hdr[:], ringHL)
	out := append(st.out[:0], st.hdr[:tapHL])
	skip := ringHL
	for _, s := range c.Iov {
		if skip >= len(s) {
			skip -= len(s)
			continue
		}
		out = append(out, s[skip:])
		skip = 0
		if len(out) == cap(out) {
			break
		}
	}
	frame := out[1:]
	if h.GSOType != vnethdr.GSONone || h.Flags&^vnethdr.FlagDataValid != 0 {
		need, ok := h.Needs()
		if !ok || need&^n.txAllow != 0 {
			n.stats.Drops[DropTXNotNegotiated].Add(1)
			return nil
		}
		if err := n.validate(st, frame, frameLen, &h); err != nil {
			n.stats.Drops[DropTXBadHeader].Add(1)
			return nil
		}
	}
	if st.gro != nil {
		// The engine copies what it may merge; anything else is written below, its
		// flow's held aggregate already written (gro.go).
		st.gh = h
		if st.gro.offer(st, c, ringHL, frameLen, &st.gh) {
			clear(out)
			return nil
		}
	}
	h.NumBuffers = 0 // the TAP skips it (drivers/net/tun.c tun_vnet_hdr_get); the driver sets 0
	h.Encode(st.hdr[:], tapHL)
	if len(out) == cap(out) && segLen(frame) < frameLen {
		// More segments than one writev takes (UIO_MAXIOV): copy.
		vhostuser.CopyFrom(st.lin[:frameLen], c.Iov, ringHL)
		out = append(out[:1], st.lin[:frameLen])
		n.stats.Linearized.Add(1)
	}
	st.out = out
	_, err := st.tap.TryWritev(out)
	if err == nil {
		if cw := n.capture.Writer(); cw != nil {
			// What the TAP took: the guest may rewrite its memory after the writev,
			// so under a hostile guest the record can differ from what was sent.
			cw.WriteFrameV(time.Now(), out[1:], 0, frameLen)
		}
	}
	clear(out) // do not keep guest memory referenced past End
	switch {
	case err == nil:
	case errors.Is(err, tapdev.ErrWouldBlock):
		return err
	default:
		n.stats.Drops[DropTXTAP].Add(1)
		return nil
	}
	n.stats.TXFrames.Add(1)
	n.stats.TXBytes.Add(uint64(frameLen))
	st.q.TXFrames.Add(1)
	st.q.TXBytes.Add(uint64(frameLen))
	if h.IsGSO() {
		n.stats.TXGSO.Add(1)
	}
	return nil
}

func segLen(segs [][]byte) int {
	t := 0
	for _, s := range segs {
		t += len(s)
	}
	return t
}

// validate runs vnethdr.ValidatePeer over a frame held in segments. A frame in one
// segment is validated in place. Otherwise the first validatePrefix bytes are gathered
// into st.lin, which is then presented as the frame at its full length: ValidatePeer
// reads only the headers it re-derives h.HdrLen from (and len(frame)), so a result
// whose HdrLen lies within the prefix is the result for the real frame. Anything else
// (headers longer than the prefix, or a refusal that might be due to bytes past it) is
// decided again on a full copy. h is updated only on success.
func (n *Net) validate(st *txState, frame [][]byte, frameLen int, h *vnethdr.Hdr) error {
	if len(frame) == 1 {
		return vnethdr.ValidatePeer(frame[0][:frameLen], h)
	}
	k := min(frameLen, validatePrefix)
	vhostuser.CopyFrom(st.lin[:k], frame, 0)
	orig := *h
	err := vnethdr.ValidatePeer(st.lin[:frameLen], h)
	if k == frameLen || (err == nil && int(h.HdrLen) <= k) {
		return err
	}
	*h = orig
	vhostuser.CopyFrom(st.lin[k:frameLen], frame, k)
	return vnethdr.ValidatePeer(st.lin[:frameLen], h)
}
