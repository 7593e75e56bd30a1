//go:build linux

package vhostnet

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// Live migration, the device's part. The guest's memory moves with QEMU, and vhostuser
// marks every page this back-end writes while QEMU copies it (vhostuser/log.go); what is
// left to the device is what lives outside guest memory:
//
//   - Frames held for a receive ring — a frame read into the worker's own buffer while
//     the guest had too few buffers, the segments of a cut GSO frame, RSC's aggregates
//     and stash — are handed to the guest when QEMU stops the ring (GET_VRING_BASE:
//     Handler.RingStopping), as far as the ring has room: QEMU copies guest memory once
//     more after the stop, and whatever was not in it by then would be lost. Frames
//     still queued in the TAP stay there, like frames on a wire; TCP sends them again.
//     What the transmit workers' GRO engines hold is guest data already taken: it goes
//     to the TAP when the worker ends, as always.
//   - The host's switches must learn that the guest's MAC is now behind the
//     destination's TAP. QEMU asks the back-end to say so with SEND_RARP (with
//     PROTOCOL_F_RARP, when the guest did not ack GUEST_ANNOUNCE), and sendRARP puts the
//     frame QEMU's own net clients send (net/announce.c announce_self_create: a RARP
//     request from the MAC, 60 bytes) into the TAP. A guest that acked GUEST_ANNOUNCE
//     announces itself instead (gratuitous ARP and IPv6 neighbour advertisements,
//     linux drivers/net/virtio_net.c virtnet_config_changed_work → netdev_notify_peers),
//     through its transmit ring like any frame.

// drainWait bounds how long GET_VRING_BASE waits for a receive worker to hand the guest
// what it holds. A worker that does not answer in time is blocked on the guest (no
// buffers: there is nothing it could deliver anyway); every millisecond here is
// downtime of a migrating guest.
const drainWait = 50 * time.Millisecond

// RingStopping asks ring v's receive worker to deliver everything it holds before the
// session stops the ring, and waits for it (bounded by drainWait).
func (n *Net) RingStopping(v vhostuser.Queue) {
	if !isRX(v.Index()) {
		return
	}
	n.wmu.Lock()
	w := n.workers[v]
	n.wmu.Unlock()
	if w == nil || w.q.stats.RXWaiting.Load() {
		return // no worker, or one waiting for guest buffers: nothing can go in
	}
	done := make(chan struct{})
	w.drain.Store(&done)
	tap := w.q.tap
	tap.SetReadDeadline(time.Unix(1, 0)) // wake a worker parked on the TAP
	select {
	case <-done:
		n.stats.Drains.Add(1)
	case <-time.After(drainWait):
		w.drain.CompareAndSwap(&done, nil)
	}
	tap.SetReadDeadline(time.Time{})
}

// drainRequested is the worker's side of RingStopping: deliver what is held, then say so.
func (n *Net) drainRequested(w *worker, st *rxState) {
	d := w.drain.Swap(nil)
	if d == nil {
		return
	}
	n.rxDrain(w.v, st)
	close(*d)
}

// rxDrain is a receive batch that reads nothing from the TAP: the held frame, what is
// pending of a cut frame, then RSC's stash and aggregates, each as far as the ring has
// room (under the read lock, as every batch).
func (n *Net) rxDrain(v vhostuser.Queue, st *rxState) {
	ringHL := v.HdrLen()
	n.mu.RLock()
	defer n.mu.RUnlock()
	if ringHL != n.tapHdr || v.Begin() != nil {
		return
	}
	if st.held > 0 {
		n.rxHeld(v, st, ringHL)
	}
	if n.rxSplitRest(v, st, ringHL) == rxGo && st.rsc != nil {
		st.rsc.flushAll(ringHL)
	}
	clear(st.iov[:cap(st.iov)])
	v.End()
	st.resv.forget()
}

// drainSlot is a worker's pending RingStopping request.
type drainSlot = atomic.Pointer[chan struct{}]

// rarpFrame is the announcement QEMU's own net clients send after a migration
// (net/announce.c announce_self_create, DPDK lib/vhost/virtio_net.c make_rarp_packet):
// broadcast, from mac, ethertype RARP (0x8035), a RARP request (opcode 3) for mac with
// no addresses, padded to the 60-byte Ethernet minimum.
func rarpFrame(mac [6]byte) [60]byte {
	var f [60]byte
	copy(f[0:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	copy(f[6:12], mac[:])
	binary.BigEndian.PutUint16(f[12:], 0x8035)
	binary.BigEndian.PutUint16(f[14:], 1)      // hardware: Ethernet
	binary.BigEndian.PutUint16(f[16:], 0x0800) // protocol: IPv4
	f[18], f[19] = 6, 4
	binary.BigEndian.PutUint16(f[20:], 3) // RARP request
	copy(f[22:28], mac[:])
	copy(f[32:38], mac[:])
	return f
}

// sendRARP writes the announcement for mac into the TAP (queue 0), with a header that
// asks nothing of the kernel. It takes the lock exclusively, so no transmit batch writes
// the TAP meanwhile.
func (n *Net) sendRARP(mac [6]byte) error {
	f := rarpFrame(mac)
	n.mu.Lock()
	defer n.mu.Unlock()
	hdr := make([]byte, n.tapHdr)
	vnethdr.Zero(hdr, len(hdr))
	if _, err := n.pairs[0].tap.TryWritev([][]byte{hdr, f[:]}); err != nil {
		return fmt.Errorf("RARP for %x into the TAP: %w", mac, err)
	}
	n.stats.RARPs.Add(1)
	n.peerLine(&n.gates.rarp, string(mac[:]), n.log.Info, "vhostnet: announced the guest on the TAP (RARP) after a migration",
		"mac", net.HardwareAddr(mac[:]).String())
	return nil
}
