//go:build linux

package vhostnet

import (
	"errors"
	"time"

	"tapgro/coalescer"
	"tapgro/tapdev"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// RSC toward the guest (TAP → guest). The TAP hands MTU frames when its read offloads
// lack TSO — the host forwards from a NIC without GRO, the TAP probed no TSO, or
// --offload caps TUNSETOFFLOAD — and a guest that acked GUEST_TSO4/6 (with GUEST_CSUM,
// which the spec requires for them: virtio spec "Feature bit requirements") would
// still take one buffer and one interrupt's worth of work per 1448 bytes. In that case
// the RX worker reads the TAP into private memory and runs the frames through package
// coalescer, whose GSO packets (NEEDS_CSUM, gso_type TCPV4/TCPV6, |ECN only with
// GUEST_ECN) are copied into the guest's chains: a receive-side coalescing like QEMU's
// own virtio-net RSC (hw/net/virtio-net.c virtio_net_rsc_receive), flushed at the end
// of each TAP read batch, or in timer mode held across batches while the TAP keeps
// delivering, for at most --rsc-interval (QEMU's rsc_timer, 300 µs by default). A frame of an IP version whose GUEST_TSO bit the guest did
// not ack never enters the engine (it could only come out merged as a GSO type the
// guest cannot take: virtio spec "Processing of Incoming Packets"); it belongs to no
// aggregate, so it overtakes nothing of its own flow. When the TAP already hands 64 KB
// frames the worker reads straight into the guest's chains as before (rx.go).
//
// The ring may fill while the engine emits (one Add emits at most two packets: its
// flow's aggregate and the frame itself, or an evicted aggregate and the frame). A
// packet that finds no room is kept in a small stash, and so is every packet after it;
// the worker then stops reading the TAP and waits for the guest's buffers (as rx.go's
// stall), delivers the stash first, and flushes held aggregates one at a time
// (FlushOne), so nothing is lost or reordered and the stash never holds more than
// one Add's output.

// rscStash is how many packets the stash holds: one Add's output with room to spare.
const rscStash = 3

// rxRSC is one RX worker's engine and buffers.
type rxRSC struct {
	n    *Net
	q    *queuePair // the worker's pair: its TAP queue and counters
	v    vhostuser.Queue
	c    *coalescer.Coalescer
	buf  []byte         // [12 headroom][frame]: the TAP reads into buf[12-hl:]
	rd   [][]byte       // TryReadv's one segment
	st   *rxState       // the worker's: the reservation, its segments, the segmenter (rx.go)
	iov  [][]byte       // st.iov
	resv *rxReservation // st.resv

	stash     [rscStash][]byte // a FIFO of packets in the engine's 12-byte-header form
	stashHead int
	stashN    int
	ecn       bool        // the engine's Config.ECN (GUEST_ECN acked)
	ringHL    int         // the session's header length, for this batch
	v4, v6    bool        // GUEST_TSO4 / GUEST_TSO6 acked: which IP versions may be merged
	broken    bool        // the ring broke during this batch
	h, ph     vnethdr.Hdr // a frame read, a packet put (kept off the stack)

	timer    bool  // --gro-flush timer: hold aggregates across batches while the TAP has more
	interval int64 // --rsc-interval, ns
}

func (n *Net) newRXRSC(v vhostuser.Queue, st *rxState) *rxRSC {
	r := &rxRSC{n: n, q: st.q, v: v, buf: make([]byte, groHdrLen+MaxFrame+vnethdr.LenMrgRxbuf), rd: make([][]byte, 1),
		st: st, iov: st.iov, resv: st.resv}
	for i := range r.stash {
		r.stash[i] = make([]byte, 0, groHdrLen+MaxFrame)
	}
	r.ecn = n.rscECN
	r.timer, r.interval = n.timerFlush, n.rscInterval.Nanoseconds()
	r.c = coalescer.New(r.config(), r.emit)
	return r
}

func (r *rxRSC) config() coalescer.Config {
	// UDP is never coalesced toward the guest: neither QEMU 7.2 nor 10.0 passes the
	// GUEST_USO bits to a vhost-user back-end (offloads.go), so no real guest could
	// take the result.
	return coalescer.Config{MaxFlows: r.n.maxFlows, VnetHdrLen: groHdrLen, ECN: r.ecn, Stats: &r.n.stats.RSC}
}

// batch is one RX batch in RSC mode (under the read lock, between Begin and End). It
// returns the worker's next state as rx.go's loop does.
func (r *rxRSC) batch(ringHL int) int {
	n := r.n
	r.ringHL, r.broken = ringHL, false
	r.v4, r.v6 = n.rxAllow&vnethdr.OffloadTSO4 != 0, n.rxAllow&vnethdr.OffloadTSO6 != 0
	state := rxGo
	if !r.drain() {
		return r.stalled()
	}
	if !n.rscMode {
		// The mode ended (SET_FEATURES) with packets pending: deliver them, read no
		// more; rx.go's zero-copy path takes over once nothing is pending.
		for r.stashN == 0 && !r.broken && r.c.FlushOne() {
		}
		if r.stashN > 0 || r.broken {
			return r.stalled()
		}
		return rxGo
	}
	if n.rscECN != r.ecn {
		// GUEST_ECN changed (SET_FEATURES). What is held was merged under the old rule:
		// deliver it one packet at a time (the ring may fill), then reconfigure.
		for r.stashN == 0 && !r.broken && r.c.FlushOne() {
		}
		if r.stashN > 0 || r.broken {
			return r.stalled()
		}
		r.ecn = n.rscECN
		r.c.SetConfig(r.config())
	}
	now := time.Now().UnixNano()
	for range rxBudget {
		r.rd[0] = r.buf[groHdrLen-ringHL:]
		k, err := r.q.tap.TryReadv(r.rd)
		if err != nil {
			if errors.Is(err, tapdev.ErrWouldBlock) || noRead(err) {
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
		if k < ringHL+14 {
			continue // tun never hands a frame shorter than its header and Ethernet's
		}
		if cw := n.tapCap.Writer(); cw != nil {
			cw.WriteFrame(time.Now(), r.rd[0][ringHL:k])
		}
		h := &r.h // kept off the stack: Add takes a pointer
		*h = vnethdr.Hdr{}
		h.Decode(r.rd[0], ringHL)
		pkt := r.buf[:groHdrLen+k-ringHL]
		switch n.rxJudge(h, pkt[groHdrLen:]) {
		case rxRefuse:
			n.stats.Drops[DropRXOffload].Add(1)
			continue
		case rxWhole:
			if h.IsGSO() {
				n.stats.RXGSO.Add(1) // passed whole (the engine never merges GSO input)
			}
		}
		// A GSO frame passes through the engine whole (it never merges GSO input, and
		// writes the flow's held aggregate first); put then hands it over or cuts it.
		if r.mergeable(pkt[groHdrLen:]) {
			r.c.Add(pkt, h, now)
		} else {
			h.NumBuffers = 0
			h.Encode(pkt, groHdrLen)
			r.deliver(pkt)
		}
		if r.stashN > 0 || r.broken || r.st.split.pending() {
			return r.stalled()
		}
	}
	// End of the read batch: flush, one packet at a time, while the ring has room.
	// In timer mode (--gro-flush timer) a batch that ended with frames still waiting
	// in the TAP is followed at once by the next, so an aggregate younger than
	// --rsc-interval may wait for it to grow; a batch that found the TAP empty
	// flushes everything, because the worker is about to sleep for an unbounded time
	// (vhostnet's TX GRO follows the same rule, gro.go endBatch).
	if r.timer && state == rxGo {
		end := time.Now().UnixNano()
		for r.stashN == 0 && !r.broken && r.c.FlushOneExpired(end, r.interval) {
		}
	} else {
		for r.stashN == 0 && !r.broken && r.c.FlushOne() {
		}
	}
	if r.stashN > 0 || r.broken {
		return r.stalled()
	}
	return state
}

// flushAll delivers the stash and every held aggregate, as far as the ring has room
// (a ring about to stop: migrate.go).
func (r *rxRSC) flushAll(ringHL int) {
	r.ringHL, r.broken = ringHL, false
	if !r.drain() {
		return
	}
	for r.stashN == 0 && !r.broken && r.c.FlushOne() {
	}
}

// stalled is the state after the ring ran out of buffers (or broke) with packets
// pending: wait for the guest, not the TAP.
func (r *rxRSC) stalled() int {
	if r.broken {
		return rxStop
	}
	return rxGuest
}

// pending reports whether packets wait for guest buffers.
func (r *rxRSC) pending() bool { return r.stashN > 0 || r.c.Held() > 0 }

// mergeable reports whether frame is of an IP version the guest takes GSO packets of
// (IPv4 with GUEST_TSO4, IPv6 with GUEST_TSO6; one 802.1Q tag looked through, as the
// engine does), or not IP at all (the engine passes it through untouched).
func (r *rxRSC) mergeable(frame []byte) bool {
	et := uint16(frame[12])<<8 | uint16(frame[13])
	if et == 0x8100 && len(frame) >= 18 {
		et = uint16(frame[16])<<8 | uint16(frame[17])
	}
	switch et {
	case 0x0800:
		return r.v4
	case 0x86dd:
		return r.v6
	}
	return true
}

// emit is the engine's output.
func (r *rxRSC) emit(pkt []byte) { r.deliver(pkt) }

// deliver hands one packet ([12-byte header][frame]) to the guest, or stashes a copy
// if the ring has no room for it or packets are stashed already (order).
func (r *rxRSC) deliver(pkt []byte) {
	if r.stashN > 0 || !r.put(pkt) {
		if r.stashN == rscStash {
			// Cannot happen (one Add emits at most two); count rather than overrun.
			r.n.stats.Drops[DropRXTruncated].Add(1)
			return
		}
		i := (r.stashHead + r.stashN) % rscStash
		r.stash[i] = append(r.stash[i][:0], pkt...)
		r.stashN++
	}
}

// drain delivers the stash, oldest first; it reports whether it is empty now.
func (r *rxRSC) drain() bool {
	for r.stashN > 0 && r.put(r.stash[r.stashHead]) {
		r.stashHead = (r.stashHead + 1) % rscStash
		r.stashN--
	}
	return r.stashN == 0 && !r.broken
}

// put copies one packet into reserved guest chains. It returns false, changing
// nothing, if the ring has too few buffers now (or the segmenter still holds the rest
// of an earlier packet). A GSO packet the guest cannot take whole is cut (split.go): it
// is taken (true) as soon as the segmenter has it, its segments delivered now or, if
// the ring runs out, before anything else (rx.go rxSplitRest). A packet the guest may
// not take at all, or that its one chain cannot hold, is dropped and counted, and put
// returns true.
func (r *rxRSC) put(pkt []byte) bool {
	n, v, hl := r.n, r.v, r.ringHL
	if r.st.split.pending() {
		return false
	}
	h := &r.ph
	*h = vnethdr.Hdr{}
	h.Decode(pkt, groHdrLen)
	switch n.rxJudge(h, pkt[groHdrLen:]) {
	case rxRefuse:
		n.stats.Drops[DropRXOffload].Add(1)
		return true
	case rxCut:
		if !r.st.split.loadFlat(pkt[groHdrLen:], h, n.guestCsm) {
			n.stats.Drops[DropRXOffload].Add(1)
			return true
		}
		if _, broken := n.drainSplit(v, r.st, hl); broken {
			r.broken = true
		}
		return true
	}
	if h.Flags&vnethdr.FlagDataValid != 0 && !n.guestCsm {
		h.Flags &^= vnethdr.FlagDataValid
	}
	h.NumBuffers = 0
	out := pkt[groHdrLen-hl:]
	h.Encode(out, hl)
	segs, capTotal, err := r.resv.reserve(v, len(out), r.iov, n.mrg)
	if err != nil {
		if !errors.Is(err, vhostuser.ErrEmpty) {
			r.broken = true
		}
		return false
	}
	if capTotal < len(out) {
		r.resv.release(v)
		n.stats.Drops[DropRXTruncated].Add(1)
		return true
	}
	vhostuser.CopyTo(segs, out)
	if cw := n.capture.Writer(); cw != nil {
		cw.WriteFrame(time.Now(), pkt[groHdrLen:])
	}
	used := r.resv.commit(v, len(out), hl)
	if n.perFrame {
		v.Publish()
	}
	n.countRX(r.q, len(pkt)-groHdrLen, used, false)
	return true
}
