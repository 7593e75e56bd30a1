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
// one used entry per chain filled and hands the others back to the ring: passt's
// vu_collect / vu_set_vnethdr / vu_flush with vu_queue_rewind (vu_common.c), DPDK's
// reserve_avail_buf_split (lib/vhost/virtio_net.c). Only the ring layer's Pop, Push
// and Rewind are used, so the chains are handed back exactly as popped, newest first.

// reservedChain is one chain of a reservation.
type reservedChain struct {
	head       uint16
	segs, sege int // its segments in rxReservation.iov
	cap        int
}

// rxReservation is one RX worker's reservation; it lives inside a batch (End hands
// back whatever was not committed, so forget must follow every End).
type rxReservation struct {
	chains []reservedChain // at most the ring size
	n      int
	iov    [][]byte // the reserved chains' segments, in order
}

func newReservation(ringSize int) *rxReservation {
	return &rxReservation{chains: make([]reservedChain, max(ringSize, 1))}
}

// reserve pops chains until their capacity covers need bytes (header included) and
// returns their segments, in order, from iov, and their capacity. Without mrg it takes
// exactly one chain, whatever its size (the caller checks the capacity it got); with
// mrg it is all or nothing: if the ring runs out first, everything is handed back and
// vhostuser.ErrEmpty returned. An uncommitted earlier reservation goes back first.
func (r *rxReservation) reserve(v vhostuser.Queue, need int, iov [][]byte, mrg bool) ([][]byte, int, error) {
	r.release(v)
	k, capTotal := 0, 0
	for {
		c, err := v.Pop(iov[k:k:cap(iov)])
		if err != nil {
			if err == vhostuser.ErrEmpty {
				r.release(v)
			}
			r.n = 0 // a broken ring keeps nothing
			return nil, 0, err
		}
		r.chains[r.n] = reservedChain{c.Head, k, k + len(c.Iov), c.Len}
		r.n++
		k += len(c.Iov)
		capTotal += c.Len
		if capTotal >= need || !mrg || r.n == len(r.chains) {
			break
		}
	}
	r.iov = iov[:k]
	return r.iov, capTotal, nil
}

// release hands every reserved chain back to the ring (they are popped again later).
func (r *rxReservation) release(v vhostuser.Queue) {
	if r.n > 0 {
		v.Rewind(r.n)
		r.n = 0
	}
}

// releaseWritten is release for chains that n bytes were already written into (a TAP
// read, a cleared flag): guest memory changed although the chains go back unused, so
// the dirty log hears of those bytes (vhostuser.Queue.Wrote; a migration copies the
// pages again). Cheap when not logging: one atomic load.
func (r *rxReservation) releaseWritten(v vhostuser.Queue, n int) {
	if n > 0 && r.n > 0 && v.Logging() {
		for i := 0; i < r.n && n > 0; i++ {
			w := min(n, r.chains[i].cap)
			v.Wrote(r.chains[i].head, w)
			n -= w
		}
	}
	r.release(v)
}

// forget drops the reservation without touching the ring: End has handed it back.
func (r *rxReservation) forget() { r.n = 0 }

// commit completes the reservation after n bytes (header + frame) were written into
// its segments from the start: chains fill in order, num_buffers (offset 10 of a
// 12-byte header) gets the number used, one used entry per chain is pushed and the
// chains not needed are handed back. It returns the number of chains used; End
// publishes them with one used->idx store, so the guest never sees num_buffers before
// the chains it counts.
func (r *rxReservation) commit(v vhostuser.Queue, n, hdrLen int) int {
	if r.n == 0 {
		return 0
	}
	if n < hdrLen || n == 0 {
		r.release(v)
		return 0
	}
	used := 0
	for rem := n; rem > 0 && used < r.n; used++ {
		rem -= r.chains[used].cap
	}
	if hdrLen >= 12 {
		// Written always: 1 without MRG_RXBUF, and a TAP leaves bytes 10-11 undefined.
		c := r.chains[0]
		var nb [2]byte
		binary.LittleEndian.PutUint16(nb[:], uint16(used))
		putAt(r.iov[c.segs:c.sege], 10, nb[:])
	}
	// Pushes take the oldest pending chains; the unused reservations are the newest
	// pops, which is what Rewind hands back.
	rem := n
	for i := 0; i < used; i++ {
		w := min(rem, r.chains[i].cap)
		v.Push(r.chains[i].head, uint32(w))
		rem -= w
	}
	v.Rewind(r.n - used)
	r.n = 0
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
