//go:build linux

package vhostnet

import (
	"errors"
	"runtime/debug"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/gsowrite"
	"tapgro/pcapio"
	"tapgro/tapdev"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// txBudget bounds the chains one TX batch handles, so the control plane never waits
// long for End.
const txBudget = 64

// The TX hold (--tx-hold, Config.TXHold). A worker that sleeps on the kick as soon as
// its ring is empty takes one wake-up, and the guest one notification (a VM exit), per
// kick: under bulk from a guest that posts a frame at a time, one per frame. After a
// batch that emptied the ring and moved txHoldBytes or more, the worker instead sleeps
// for the hold with kicks left off (hold.go), then takes what the guest posted
// meanwhile in one batch; a batch that moved less (a request, an ACK, the end of a
// burst) waits for the next kick as before, so request/response traffic is never held,
// and one that ended on its budget goes on at once. A hold is a sleep between batches,
// so it never makes the worker busier than waiting for kicks would, whatever the guest
// posts; tapgro bounds it to 1 ms (--tx-hold), the longest a guest's frame waits. This
// is QEMU's timer transmit mode (hw/net/virtio-net.c virtio_net_handle_tx_timer,
// -device virtio-net-pci,tx=timer, 150 µs by default), applied only while the load
// lasts.
const txHoldBytes = 16 << 10

// validatePrefix is how much of a split frame is gathered to validate its headers: far
// more than Ethernet + VLAN + IPv6 + TCP with options (134 bytes). ValidatePeer reads
// nothing past the header length it re-derives, so when that is within the prefix, the
// rest of the frame never needs copying.
const validatePrefix = 512

type txState struct {
	iov  [][]byte // Pop's view of the chain
	out  [][]byte // writev: our header copy, our copy of the frame's headers, then its other segments
	hdr  [vnethdr.LenMrgRxbuf]byte
	lin  []byte // our copy of the frame's first bytes (tx) and, rarely, all of it
	nPop int

	tap    TAP           // the pair's TAP queue
	tapCap *pcapio.Point // the Net's TAP-side capture (fallback.go's segments)
	q      *QueueStats   // the pair's counters
	pair   *queuePair

	// The EINVAL fallback (fallback.go), allocated on first use.
	prober    gsowrite.Prober
	splitter  gsowrite.Splitter
	emitSeg   func(seg []byte) // st.writeSegment, made once
	segFailed bool
	one       [1][]byte   // tapWrite's iovec
	gro       *txGRO      // nil: GRO never on for this worker (gro.go)
	groOn     bool        // this batch runs gro (groBatch)
	gh        vnethdr.Hdr // the header handed to the engine (kept off the stack)

	faulted bool // guest memory faulted: the worker is ending (vhostuser.Vring.Guard)
}

func (n *Net) txLoop(w *worker) {
	defer close(w.done)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true)) // guest memory may fault: Guard
	v := w.v
	st := &txState{
		tap: w.q.tap,
		q:   w.q.stats,
		// A chain has at most Num descriptors, each at most two regions' worth.
		iov:  make([][]byte, 0, 2*v.Num()+2),
		out:  make([][]byte, 0, tapdev.MaxIov),
		lin:  make([]byte, MaxFrame),
		pair: w.q,
	}
	st.emitSeg, st.tapCap = st.writeSegment, &n.tapCap
	if n.GROActive() {
		st.gro = n.newTXGRO(st)
	}
	defer st.finish()
	defer v.Guard(&st.faulted)
	var ht *holdTimer
	if n.txHold > 0 {
		var err error
		if ht, err = newHoldTimer(n.txHold); err != nil {
			n.log.Warn("vhostnet: TX hold without a timerfd: holds last at least 1 ms", "error", err)
		} else {
			defer ht.close()
		}
	}
	hold := false
	for !w.stop.Load() {
		if hold {
			// Kicks are still off since the last batch: the guest goes on posting
			// without notifying, and the next batch takes what came meanwhile.
			n.stats.TXHolds.Add(1)
			if ht != nil {
				ht.sleep()
			} else {
				time.Sleep(n.txHold)
			}
		} else if err := v.Wait(); err != nil {
			return
		}
		moved, drained, blocked, err := n.txBatch(v, st)
		if err != nil {
			return
		}
		if rx := w.q.rx.Load(); rx != nil {
			// The answers to what went out (TCP's ACKs) are moderated as load too.
			rx.q.NoteLoad(moved)
		}
		// A batch that emptied the ring after txHoldBytes or more is bulk: hold,
		// rather than sleep on the next kick. Less is a request or the end of a
		// burst: wait for the kick. One that ended on its budget goes on at once.
		hold = n.txHold > 0 && moved >= txHoldBytes && drained
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

// txBatch moves up to txBudget chains to the TAP under the read lock (a fault in guest
// memory unwinds through it, releasing the lock, to the worker's Guard) and reports the
// frames' bytes and whether it found the ring empty. blocked says the TAP could not
// take a frame: the worker waits for it before the next batch.
func (n *Net) txBatch(v vhostuser.Queue, st *txState) (moved int, drained, blocked bool, err error) {
	ringHL := v.HdrLen()
	sent := st.q.TXBytes.Load()
	n.mu.RLock()
	defer n.mu.RUnlock()
	if err := v.Begin(); err != nil {
		return 0, false, false, err
	}
	st.groOn = n.groBatch(st)
	empty := false
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
	if st.groOn {
		// Before End: the aggregates are written before the guest sees its chains
		// used, as if each segment had been (endBatch says when).
		st.gro.endBatch(empty || blocked)
	}
	v.End()
	return int(st.q.TXBytes.Load() - sent), empty, blocked, nil
}

// finish runs as the worker ends: what timer mode holds goes out, unless guest memory
// faulted, which may have cut a copy into an aggregate short.
func (st *txState) finish() {
	if !st.faulted {
		st.gro.flushAll()
	}
}

// tx writes one guest TX chain to the TAP. The header is gathered by byte offset (the
// driver may split it over descriptors and start the frame inside the header's
// descriptor: virtio spec "Message Framing") and decoded once from our copy. The
// frame's first validatePrefix bytes are copied once too, into st.lin, and everything
// that decides from the frame's headers reads that copy: vnethdr.ValidatePeer, the GRO
// engine's classification, and the kernel itself, since the prefix goes to the TAP
// from st.lin and only the bytes after it from guest memory. A guest that rewrites its
// headers after the check therefore changes nothing the kernel parses (DPDK's vhost
// library fixed the same race for CVE-2024-11614 by copying headers first). The
// virtio-net header is re-encoded into our own buffer, the first writev segment: the
// TAP's header length equals the guest's, so the payload goes to the kernel straight
// from guest memory in the same writev (cloud-hypervisor process_tx does the same). It
// returns tapdev.ErrWouldBlock if the TAP could not take it now.
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
	k := min(frameLen, validatePrefix)
	vhostuser.CopyFrom(st.lin[:k], c.Iov, ringHL)
	copied := k // st.lin[:copied] is ours
	if h.GSOType != vnethdr.GSONone || h.Flags&^vnethdr.FlagDataValid != 0 {
		need, ok := h.Needs()
		if !ok || need&^n.txAllow != 0 {
			n.stats.Drops[DropTXNotNegotiated].Add(1)
			return nil
		}
		var err error
		if copied, err = n.validate(st, c, ringHL, frameLen, k, &h); err != nil {
			n.stats.Drops[DropTXBadHeader].Add(1)
			return nil
		}
	} else {
		// Neither GSO nor a partial checksum: tun reads nothing of the header but
		// hdr_len, and refuses values 1..13 or past the frame with EINVAL
		// (drivers/net/tun.c tun_vnet_hdr_get): the guest's hint goes, not the frame.
		h.HdrLen = 0
	}
	if st.groOn {
		// The engine decides from st.lin and copies what it may merge; anything else
		// is written below, its flow's held aggregate already written (gro.go).
		st.gh = h
		if st.gro.offer(st, c, ringHL, frameLen, copied, &st.gh) {
			return nil
		}
	}
	if n.killedKind(&h) {
		// A kind the kernel refuses on write (fallback.go): cut it first.
		n.stats.TXSplit.Add(1)
		n.splitToTAP(st, n.linearize(st, c, ringHL, frameLen, copied), &h, true)
		return nil
	}
	h.NumBuffers = 0 // the TAP skips it (drivers/net/tun.c tun_vnet_hdr_get); the driver sets 0
	h.Encode(st.hdr[:], tapHL)
	out := append(st.out[:0], st.hdr[:tapHL], st.lin[:copied])
	skip := ringHL + copied
	for _, s := range c.Iov {
		if skip >= len(s) {
			skip -= len(s)
			continue
		}
		if len(out) == cap(out) {
			// More segments than one writev takes (UIO_MAXIOV): copy the rest too.
			vhostuser.CopyFrom(st.lin[copied:frameLen], c.Iov, ringHL+copied)
			out = append(out[:1], st.lin[:frameLen])
			n.stats.Linearized.Add(1)
			break
		}
		out = append(out, s[skip:])
		skip = 0
	}
	st.out = out
	_, err := st.tap.TryWritev(out)
	if err == nil {
		// What the TAP took, headers from our copy: the guest may rewrite the payload
		// after the writev, so under a hostile guest only that can differ. Both sides
		// saw the same frame.
		if cw := n.capture.Writer(); cw != nil {
			cw.WriteFrameV(time.Now(), out[1:], 0, frameLen)
		}
		if cw := n.tapCap.Writer(); cw != nil {
			cw.WriteFrameV(time.Now(), out[1:], 0, frameLen)
		}
	}
	clear(out) // do not keep guest memory referenced past End
	switch {
	case err == nil:
	case errors.Is(err, tapdev.ErrWouldBlock):
		return err
	case errors.Is(err, unix.EINVAL) && h.IsGSO():
		n.refusedGSO(st, c, ringHL, frameLen, copied, &h, err)
		return nil
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

// validate runs vnethdr.ValidatePeer over tapgro's copy of a frame: st.lin holds its
// first k bytes, and is presented as the frame at its full length. ValidatePeer reads
// only the headers it re-derives h.HdrLen from (and len(frame)), so a result whose
// HdrLen lies within the prefix is the result for the real frame. Anything else
// (headers longer than the prefix, or a refusal that might be due to bytes past it) is
// decided again on a full copy. It returns how many bytes of st.lin are the frame's
// (k, or frameLen after a full copy); h is updated only on success.
func (n *Net) validate(st *txState, c vhostuser.Chain, ringHL, frameLen, k int, h *vnethdr.Hdr) (int, error) {
	orig := *h
	err := vnethdr.ValidatePeer(st.lin[:frameLen], h)
	if k == frameLen || (err == nil && int(h.HdrLen) <= k) {
		return k, err
	}
	*h = orig
	vhostuser.CopyFrom(st.lin[k:frameLen], c.Iov, ringHL+k)
	return frameLen, vnethdr.ValidatePeer(st.lin[:frameLen], h)
}
