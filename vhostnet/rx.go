//go:build linux

package vhostnet

import (
	"errors"
	"os"
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
	tap TAP
	q   *queuePair
	// iov is the reservation's segments, which also go to readv, which takes MaxIov-1 of
	// them (Readv keeps one for its truncation sink). A chain set needing more breaks
	// the ring (RejectIovFull): only a guest posting tiny buffers could do that.
	iov   [][]byte
	resv  *rxReservation // the chains a frame goes into (reserve.go)
	hdr   [vnethdr.LenMrgRxbuf]byte
	eth   [18]byte // a frame's Ethernet header and one 802.1Q tag, when rxJudge needs them
	rsc   *rxRSC   // created when the guest first needs it (rsc.go)
	split rxSplit  // GSO frames the guest cannot take whole are cut here (split.go)

	// bounce holds one frame read from the TAP while the guest's posted buffers
	// cannot cover the largest frame the TAP may hand over (need): the frame is read
	// here, and only its real length is reserved. held is its length with the header
	// (0: none); it goes to the guest before anything else is read.
	bounce []byte
	rd     [][]byte // TryReadv's one segment, bounce
	held   int
	h      vnethdr.Hdr // the header of the frame being judged (kept off the stack)

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
		n.drainRequested(w, st) // GET_VRING_BASE is coming (migrate.go)
		if !v.Enabled() {
			// Started but disabled: no RX (vhost-user.rst "Ring states"). Enabling comes
			// with no kick, so look again shortly.
			time.Sleep(time.Millisecond)
			continue
		}
		var sent uint64
		if n.pollWindow > 0 {
			sent = w.q.stats.RXFrames.Load()
		}
		state := n.rxBatch(v, st)
		if n.pollWindow > 0 && w.q.stats.RXFrames.Load() != sent {
			// The guest has frames to answer: its TX worker watches for the answer
			// (vhostuser.Vring.Poke).
			if tx := w.q.tx.Load(); tx != nil {
				tx.q.Poke()
			}
		}
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
				if w.drain.Load() == nil {
					time.Sleep(time.Millisecond)
				}
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
	if state := n.rxSplitRest(v, st, ringHL); state != rxGo {
		return state
	}
	if rsc := st.rsc; n.rscMode || (rsc != nil && rsc.pending()) {
		// Coalescing toward the guest; also while packets from it are pending after
		// the mode ended, so that nothing is overtaken.
		if rsc == nil {
			st.rsc = n.newRXRSC(v, st)
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
			if state := n.rxSplitRest(v, st, ringHL); state != rxGo {
				return state
			}
			continue
		}
		segs, capTot, err := st.resv.reserve(v, need, st.iov, n.mrg)
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
			if cw := n.tapCap.Writer(); cw != nil {
				cw.WriteFrame(time.Now(), st.bounce[ringHL:k])
			}
			st.held = k
			continue
		}
		k, err := st.tap.TryReadv(segs)
		if err != nil {
			if errors.Is(err, tapdev.ErrWouldBlock) {
				st.resv.release(v)
			} else {
				// A truncated frame filled every reserved byte; after any other
				// failure what the kernel wrote is unknown: all of it, for the log.
				st.resv.markWritten(v, capTot)
			}
			if state := n.rxReadFailed(err); state != rxGo {
				return state
			}
			continue
		}
		if cw := n.tapCap.Writer(); cw != nil {
			cw.WriteFrameV(time.Now(), segs, ringHL, k-ringHL) // as the TAP handed it
		}
		if state := n.rxDeliver(v, st, segs, k, ringHL); state != rxGo {
			return state
		}
	}
	return rxGo
}

// noRead reports a TAP read that failed before reading anything, so no frame was lost:
// the past read deadline RingStopping and RingStopped set to wake the worker (the
// poller answers it before it reads), or the TAP closed at shutdown.
func noRead(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, os.ErrClosed)
}

// rxReadFailed counts a TAP read that brought no frame and says what to do next.
func (n *Net) rxReadFailed(err error) int {
	switch {
	case errors.Is(err, tapdev.ErrWouldBlock), noRead(err):
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
	// Judged in our own copy, before the guest can see (or change) it.
	st.rd[0] = st.bounce[:st.held]
	verdict := n.rxCheck(st.rd, st, ringHL)
	st.rd[0] = nil
	switch verdict {
	case rxRefuse:
		n.stats.Drops[DropRXOffload].Add(1)
		st.held = 0
		return true
	case rxCut:
		// Cut from our copy; the caller delivers the segments (rxSplitRest).
		if !st.split.loadFlat(st.bounce[ringHL:st.held], &st.h, n.guestCsm) {
			n.stats.Drops[DropRXOffload].Add(1)
		}
		st.held = 0
		return true
	}
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
	vhostuser.CopyTo(segs, st.bounce[:st.held])
	n.rxCommit(v, st, segs, st.held, ringHL, true)
	st.held = 0
	return true
}

// rxDeliver completes a frame of k bytes (header included) the TAP wrote into segs, or
// cuts it (split.go) if the guest cannot take it whole.
func (n *Net) rxDeliver(v vhostuser.Queue, st *rxState, segs [][]byte, k, ringHL int) int {
	verdict := n.rxCheck(segs, st, ringHL)
	if verdict != rxCut {
		n.rxCommit(v, st, segs, k, ringHL, verdict == rxWhole)
		return rxGo
	}
	ok := st.split.load(segs, ringHL, k-ringHL, &st.h, n.guestCsm)
	st.resv.markWritten(v, k) // copied out: the segments reuse these chains, one reservation each
	if !ok {
		n.stats.Drops[DropRXOffload].Add(1)
		return rxGo
	}
	return n.rxSplitRest(v, st, ringHL)
}

// rxSplitRest delivers what is pending of a cut frame, before anything read after it,
// and says what the worker does next: go on, or wait for the guest's buffers (the ring
// ran out) or stop (it broke).
func (n *Net) rxSplitRest(v vhostuser.Queue, st *rxState, ringHL int) int {
	if !st.split.pending() {
		return rxGo
	}
	switch ok, broken := n.drainSplit(v, st, ringHL); {
	case broken:
		return rxStop
	case !ok:
		return rxGuest
	}
	return rxGo
}

// rxCommit commits a checked frame, or counts it if the check refused it (its chains
// stay reserved, for the next frame to write over).
func (n *Net) rxCommit(v vhostuser.Queue, st *rxState, segs [][]byte, k, ringHL int, ok bool) {
	if !ok {
		st.resv.markWritten(v, k) // the TAP wrote the frame there
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
	n.countRX(st.q, k-ringHL, used, st.h.IsGSO())
}

// countRX counts one frame of size Ethernet bytes delivered to the guest in used chains.
func (n *Net) countRX(q *queuePair, size, used int, gso bool) {
	n.stats.RXFrames.Add(1)
	n.stats.RXBytes.Add(uint64(size))
	q.stats.RXFrames.Add(1)
	q.stats.RXBytes.Add(uint64(size))
	n.stats.RXChains.Add(uint64(used))
	if gso {
		n.stats.RXGSO.Add(1)
	}
}

// rxVerdict is what becomes of a frame from the TAP (rxJudge).
type rxVerdict int

const (
	rxRefuse rxVerdict = iota // counted as an offload violation and dropped
	rxWhole                   // handed to the guest as it is
	rxCut                     // a GSO frame the guest cannot take whole: cut (split.go)
)

// rxCheck decodes the header the TAP wrote at the start of segs (hl bytes) into st.h and
// judges the frame (rxJudge). DATA_VALID, which the TAP sets whatever TUNSETOFFLOAD says
// (virtio_net_hdr_from_skb with has_data_valid), is cleared for a guest without
// GUEST_CSUM: the driver must see flags 0 then (virtio spec "Processing of Incoming
// Packets").
func (n *Net) rxCheck(segs [][]byte, st *rxState, hl int) rxVerdict {
	vhostuser.CopyFrom(st.hdr[:vnethdr.Len], segs, 0)
	h := &st.h
	*h = vnethdr.Hdr{}
	h.Decode(st.hdr[:], vnethdr.Len)
	var eth []byte
	if h.GSOType == vnethdr.GSOUDPL4 {
		eth = st.eth[:vhostuser.CopyFrom(st.eth[:], segs, hl)]
	}
	verdict := n.rxJudge(h, eth)
	if verdict == rxWhole && h.Flags&vnethdr.FlagDataValid != 0 && !n.guestCsm {
		segs[0][0] &^= vnethdr.FlagDataValid // header byte 0 is flags; segs[0] is never empty
	}
	return verdict
}

// rxJudge decides what becomes of a frame with header h for this guest (under the read
// lock). A frame kind inside the guest's receive acks passes whole: with TUNSETOFFLOAD ⊆
// acks that is every frame, but for USO (applyOffloads sets it for a guest that acked
// none or one of GUEST_USO4/6: split.go says why) and for frames the TAP queued before a
// SET_FEATURES narrowed TUNSETOFFLOAD. A GSO frame outside the acks is cut; anything
// else outside them (NEEDS_CSUM for a guest without GUEST_CSUM, an unknown gso_type) is
// refused. For UDP_L4, whose two offload bits the kernel sets as a pair, the frame's IP
// version decides which GUEST_USO bit it needs; eth is the frame's first bytes (only
// needed for UDP_L4).
func (n *Net) rxJudge(h *vnethdr.Hdr, eth []byte) rxVerdict {
	need, known := h.Needs()
	if !known {
		return rxRefuse
	}
	if h.GSOType == vnethdr.GSOUDPL4 {
		need &^= vnethdr.OffloadUSO
		if isIPv6(eth) {
			need |= vnethdr.OffloadUSO6
		} else {
			need |= vnethdr.OffloadUSO4
		}
	}
	switch {
	case need&^n.rxAllow == 0:
		return rxWhole
	case h.IsGSO():
		return rxCut
	}
	return rxRefuse
}

// isIPv6 reports whether an Ethernet frame starting with eth carries IPv6, looking
// through one 802.1Q tag.
func isIPv6(eth []byte) bool {
	if len(eth) < 14 {
		return false
	}
	et := uint16(eth[12])<<8 | uint16(eth[13])
	if et == 0x8100 && len(eth) >= 18 {
		et = uint16(eth[16])<<8 | uint16(eth[17])
	}
	return et == 0x86dd
}
