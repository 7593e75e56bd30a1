//go:build linux

package vhostnet

import (
	"encoding/binary"

	"tapgro/vhostuser"
	"tapgro/virtio"
)

// Receive chains. A frame from the TAP goes into one chain the guest posted or, with
// VIRTIO_NET_F_MRG_RXBUF, into as many as it needs, the first one's header saying how
// many in num_buffers (virtio spec "Processing of Incoming Packets", "Setting Up
// Receive Buffers"). rxReservation pops chains until their capacity covers the
// frame, the frame is written into their segments from the start, and commit pushes
// one used entry per chain filled and keeps the others for the next frame (End hands
// back what no frame took): passt's
// vu_collect / vu_set_vnethdr / vu_flush with vu_queue_rewind (vu_common.c), DPDK's
// reserve_avail_buf_split (lib/vhost/virtio_net.c). Only the ring layer's Pop, Push
// and Rewind are used, so the chains are handed back exactly as popped, newest first.

// reservedChain is one chain of a reservation.
type reservedChain struct {
	head       uint16
	segs, sege int // its segments in rxReservation.iov
	cap        int
}

// rxReservation is one RX worker's reservation: chains[start:n], popped in that order
// and not yet pushed. It lives inside a batch (End hands back whatever was not
// committed, so forget must follow every End), but within one it outlives a frame: the
// worker reserves for the largest frame the TAP may hand over before it knows the
// frame's size, and most frames are much smaller (an ACK takes one of the 17 chains a
// guest's 4 KiB buffers need for 64 KiB), so the chains a commit leaves are kept for
// the next frame instead of being handed back and popped (walked, translated) again.
// The guest sees the same chains used in the same order either way: pushes take the
// oldest reserved chains, and the rest are the newest pops, which is what Rewind and
// End hand back.
type rxReservation struct {
	chains   []reservedChain // at most the ring size
	start, n int
	capTotal int      // the capacity of chains[start:n]
	iov      [][]byte // the base whose segments chains index
}

func newReservation(ringSize int) *rxReservation {
	return &rxReservation{chains: make([]reservedChain, max(ringSize, 1))}
}

// reserve makes the reservation cover need bytes (header included), popping chains
// after those it holds, and returns their segments, in order, and their capacity.
// Without mrg a frame takes exactly one chain, whatever its size (the caller checks
// the capacity it got). With mrg, if the ring runs out first, vhostuser.ErrEmpty is
// returned and the chains stay reserved for a smaller need (End hands them back if
// none comes). iov must be the same slice for every call within a batch.
func (r *rxReservation) reserve(v vhostuser.Queue, need int, iov [][]byte, mrg bool) ([][]byte, int, error) {
	r.compact(iov)
	if !mrg && r.n > r.start {
		c := r.chains[r.start]
		return r.iov[c.segs:c.sege], c.cap, nil
	}
	k := 0
	if r.n > 0 {
		k = r.chains[r.n-1].sege
	}
	for r.capTotal < need || r.n == r.start {
		if r.n == len(r.chains) {
			break // a whole ring's worth: all there can be
		}
		c, err := v.Pop(iov[k:k:cap(iov)])
		if err != nil {
			if err != vhostuser.ErrEmpty {
				r.start, r.n, r.capTotal = 0, 0, 0 // a broken ring keeps nothing
			}
			return nil, 0, err
		}
		r.chains[r.n] = reservedChain{c.Head, k, k + len(c.Iov), c.Len}
		r.n++
		k += len(c.Iov)
		r.capTotal += c.Len
		if !mrg {
			break
		}
	}
	r.iov = iov[:k]
	return r.iov, r.capTotal, nil // compact left start at 0
}

// compact moves the chains still reserved, and their segments, to the front, so that
// every chain popped next has all of iov's room after them.
func (r *rxReservation) compact(iov [][]byte) {
	if r.start == 0 {
		r.iov = iov[:len(r.iov)]
		return
	}
	if r.start == r.n {
		r.start, r.n, r.iov = 0, 0, iov[:0]
		return
	}
	off := r.chains[r.start].segs
	end := r.chains[r.n-1].sege
	clear(iov[copy(iov[:cap(iov)], iov[off:end]):end]) // no stale views of guest memory
	k := copy(r.chains, r.chains[r.start:r.n])
	for i := range k {
		r.chains[i].segs -= off
		r.chains[i].sege -= off
	}
	r.start, r.n, r.iov = 0, k, iov[:end-off]
}

// release hands every reserved chain back to the ring (they are popped again later).
func (r *rxReservation) release(v vhostuser.Queue) {
	if r.n > r.start {
		v.Rewind(r.n - r.start)
	}
	r.start, r.n, r.capTotal = 0, 0, 0
}

// markWritten is for reserved chains that n bytes were already written into (a TAP
// read, a cleared flag) and that the frame will not use: guest memory changed although the
// chains may go back unused, so the dirty log hears of those bytes now
// (vhostuser.Queue.Wrote; a migration copies the pages again). The chains stay
// reserved, for the next frame to write over. Cheap when not logging: one atomic load.
func (r *rxReservation) markWritten(v vhostuser.Queue, n int) {
	if n > 0 && v.Logging() {
		for i := r.start; i < r.n && n > 0; i++ {
			w := min(n, r.chains[i].cap)
			v.Wrote(r.chains[i].head, w)
			n -= w
		}
	}
}

// forget drops the reservation without touching the ring: End has handed it back.
func (r *rxReservation) forget() { r.start, r.n, r.capTotal, r.iov = 0, 0, 0, r.iov[:0] }

// commit completes the frame of n bytes (header + frame) written into the reserved
// segments from the start: chains fill in order, num_buffers (offset 10 of a 12-byte
// header) gets the number used, and one used entry per chain is pushed; the chains
// not needed stay reserved. It returns the number of chains used; End publishes them
// with one used->idx store, so the guest never sees num_buffers before the chains it
// counts.
func (r *rxReservation) commit(v vhostuser.Queue, n, hdrLen int) int {
	if r.n == r.start || n < hdrLen || n == 0 {
		return 0
	}
	used := 0
	for rem := n; rem > 0 && r.start+used < r.n; used++ {
		rem -= r.chains[r.start+used].cap
	}
	if hdrLen >= 12 {
		// Written always: 1 without MRG_RXBUF, and a TAP leaves bytes 10-11 undefined.
		c := r.chains[r.start]
		var nb [2]byte
		binary.LittleEndian.PutUint16(nb[:], uint16(used))
		putAt(r.iov[c.segs:c.sege], 10, nb[:])
	}
	// Pushes take the oldest pending chains: these, popped first.
	rem := n
	for i := r.start; i < r.start+used; i++ {
		w := min(rem, r.chains[i].cap)
		v.Push(r.chains[i].head, uint32(w))
		rem -= w
		r.capTotal -= r.chains[i].cap
	}
	r.start += used
	return used
}

// putAt copies b into the concatenation of segs at byte offset off.
func putAt(segs [][]byte, off int, b []byte) {
	for _, s := range segs {
		if len(b) == 0 {
			return
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		c := copy(s[off:], b)
		b = b[c:]
		off = 0
	}
}

// hdrLenFor is the virtio-net header length for acked features: 12 bytes with
// VERSION_1 or MRG_RXBUF, else the legacy 10 (virtio spec "Device Operation": the
// header is virtio_net_hdr_v1 with VERSION_1; QEMU hw/net/virtio-net.c
// virtio_net_set_mrg_rx_bufs, DPDK vhost_user_set_features vhost_hlen). HASH_REPORT
// (20 bytes) is never offered.
func hdrLenFor(acked uint64) int {
	if acked&(1<<virtio.Version1|1<<virtio.NetMrgRxbuf) != 0 {
		return 12
	}
	return 10
}

// isRX reports whether ring index i is a receive queue: ring 2·p is queue pair p's RX,
// 2·p+1 its TX (virtio spec "Network Device / Virtqueues"). The device writes RX
// chains and reads TX ones.
func isRX(i int) bool { return i%2 == 0 }
