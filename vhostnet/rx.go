//go:build linux

package vhostnet

import (
	"errors"
	"runtime/debug"
	"time"

	"tapgro/tapdev"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// rxBudget bounds the frames one RX batch takes from the TAP.
const rxBudget = 64

const (
	rxGo    = iota // budget spent: go on
	rxIdle         // the TAP has nothing: wait for it
	rxGuest        // a frame waits for guest buffers (held here, or in rsc.go): wait for the guest
	rxRetry        // the session's header length is changing: look again shortly
	rxStop
)

// rxState is one RX worker's own memory.
type rxState struct {
	tap *tapdev.Device
	q   *queuePair
	// iov is the reservation's segments, which also go to readv, which takes MaxIov-1 of
	// them (Readv keeps one for its truncation sink). A chain set needing more breaks
	// the ring (RejectIovFull): only a guest posting tiny buffers could do that.
	iov  [][]byte
	resv *rxReservation // the chains a frame goes into (reserve.go)
	hdr  [vnethdr.LenMrgRxbuf]byte
	rsc  *rxRSC // created when the guest first needs it (rsc.go)

	// bounce holds one frame read from the TAP while the guest's posted buffers
	// cannot cover the largest frame the TAP may hand over (need): the frame is read
	// here, and only its real length is reserved. held is its length with the header
	// (0: none); it goes to the guest before anything else is read.
	bounce []byte
	rd     [][]byte // TryReadv's one segment, bounce
	held   int

	faulted bool // guest memory faulted: the worker is ending (vhostuser.Vring.Guard)
}

func (n *Net) rxLoop(w *worker) {
	defer close(w.done)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true)) // guest memory may fault: Guard
	v := w.v
	st := &rxState{tap: w.q.tap, q: w.q, iov: make([][]byte, 0, tapdev.MaxIov-1), rd: make([][]byte, 1),
		resv: newReservation(v.Num())}
	defer v.Guard(&st.faulted)
	for !w.stop.Load() {
		if !v.Enabled() {
			// Started but disabled: no RX (vhost-user.rst "Ring states"). Enabling comes
			// with no kick, so look again shortly.
			time.Sleep(time.Millisecond)
			continue
		}
		state := n.rxBatch(v, st)
		switch state {
		case rxGuest:
			n.stats.RXStalls.Add(1)
			n.setWaiting(w.q, true, true)
			err := v.WaitMore()
			n.setWaiting(w.q, true, false)
			if err != nil {
				return
			}
		case rxIdle:
			if err := st.tap.WaitReadable(); err != nil {
				if w.stop.Load() || isClosed(err) {
					return
				}
				time.Sleep(time.Millisecond)
			}
		case rxRetry:
			time.Sleep(100 * time.Microsecond)
		case rxStop:
			return
		}
	}
}

// rxBatch moves up to rxBudget frames from the TAP into the ring, under the read lock
// (a fault in guest memory unwinds through it, releasing the lock, to the worker's
// Guard), and says what the worker should wait for next.
func (n *Net) rxBatch(v vhostuser.Queue, st *rxState) int {
	ringHL := v.HdrLen()
	n.mu.RLock()
	defer n.mu.RUnlock()
	if ringHL != n.tapHdr {
		return rxRetry // SET_FEATURES is between updating the ring and telling us
	}
	if err := v.Begin(); err != nil {
		return rxStop
	}
	// Not deferred: after a fault End must not run (Guard takes the ring over).
	state := n.rxFrames(v, st, ringHL)
	clear(st.iov[:cap(st.iov)]) // do not keep guest memory referenced past End
	v.End()
	st.resv.forget() // End handed back what was not committed
	return state
}

func (n *Net) rxFrames(v vhostuser.Queue, st *rxState, ringHL int) int {
	if rsc := st.rsc; n.rscMode || (rsc != nil && rsc.pending()) {
		// Coalescing toward the guest; also while packets from it are pending after
		// the mode ended, so that nothing is overtaken.
		if rsc == nil {
			st.rsc = n.newRXRSC(v, st.iov, st.resv, st.q)
		}
		if state := st.rsc.batch(ringHL); state != rxGo || n.rscMode || st.rsc.pending() {
			return state
		}
	}
	need := ringHL + MaxFrame // a mergeable reservation covers any frame
	for range rxBudget {
		if st.held > 0 {
			if !n.rxHeld(v, st, ringHL) {
				return rxGuest
			}
			continue
		}
		segs, _, err := st.resv.reserve(v, need, st.iov, n.mrg)
		if err != nil {
			if !errors.Is(err, vhostuser.ErrEmpty) {
				return rxStop
			}
			// Too few buffers for the largest frame: read the next one here and
			// reserve only what it needs (QEMU reads into its own buffer first too,
			// hw/net/virtio-net.c virtio_net_receive_rcu → virtio_net_has_buffers).
			if st.bounce == nil {
				st.bounce = make([]byte, vnethdr.LenMrgRxbuf+MaxFrame)
			}
			st.rd[0] = st.bounce[:ringHL+MaxFrame]
			k, err := st.tap.TryReadv(st.rd)
			if err != nil {
				return n.rxReadFailed(err)
			}
			st.held = k
			continue
		}
		k, err := st.tap.TryReadv(segs)
		if err != nil {
			st.resv.release(v)
			if state := n.rxReadFailed(err); state != rxGo {
				return state
			}
			continue
		}
		n.rxDeliver(v, st, segs, k, ringHL)
	}
	return rxGo
}

// rxReadFailed counts a TAP read that brought no frame and says what to do next.
func (n *Net) rxReadFailed(err error) int {
	switch {
	case errors.Is(err, tapdev.ErrWouldBlock):
		return rxIdle
	case errors.Is(err, tapdev.ErrTruncated):
		n.stats.Drops[DropRXTruncated].Add(1)
		return rxGo
	}
	n.stats.Drops[DropRXTAP].Add(1)
	return rxIdle
}

// rxHeld moves the frame held in st.bounce into the ring, reserving exactly its length;
// false if the ring has too few buffers still (the frame stays held).
func (n *Net) rxHeld(v vhostuser.Queue, st *rxState, ringHL int) bool {
	segs, capTot, err := st.resv.reserve(v, st.held, st.iov, n.mrg)
	if err != nil {
		return false
	}
	if capTot < st.held {
		// Without MRG_RXBUF a frame takes one chain, and this one is too short.
		st.resv.release(v)
		n.stats.Drops[DropRXTruncated].Add(1)
		st.held = 0
		return true
	}
	// Checked in our own copy, before the guest can see (or change) it.
	st.rd[0] = st.bounce[:st.held]
	gso, ok := n.rxCheck(st.rd, st.hdr[:], ringHL)
	st.rd[0] = nil
	if ok {
		vhostuser.CopyTo(segs, st.bounce[:st.held])
	}
	n.rxCommit(v, st, segs, st.held, ringHL, gso, ok)
	st.held = 0
	return true
}

// rxDeliver completes a frame of k bytes (header included) the TAP wrote into segs.
func (n *Net) rxDeliver(v vhostuser.Queue, st *rxState, segs [][]byte, k, ringHL int) {
	gso, ok := n.rxCheck(segs, st.hdr[:], ringHL)
	n.rxCommit(v, st, segs, k, ringHL, gso, ok)
}

// rxCommit commits a checked frame, or hands its chains back and counts it if the
// check refused it.
func (n *Net) rxCommit(v vhostuser.Queue, st *rxState, segs [][]byte, k, ringHL int, gso, ok bool) {
	if !ok {
		st.resv.release(v)
		n.stats.Drops[DropRXOffload].Add(1)
		return
	}
	if cw := n.capture.Writer(); cw != nil {
		cw.WriteFrameV(time.Now(), segs, ringHL, k-ringHL)
	}
	used := st.resv.commit(v, k, ringHL)
	if n.perFrame {
		v.Publish()
	}
	n.stats.RXFrames.Add(1)
	n.stats.RXBytes.Add(uint64(k - ringHL))
	st.q.stats.RXFrames.Add(1)
	st.q.stats.RXBytes.Add(uint64(k - ringHL))
	n.stats.RXChains.Add(uint64(used))
	if gso {
		n.stats.RXGSO.Add(1)
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
