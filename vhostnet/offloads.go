//go:build linux

package vhostnet

import (
	"fmt"

	"tapgro/quietlog"

	"tapgro/vhostuser"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// Offer is the virtio feature set offered for a TAP whose read offloads probed as
// probed: split rings with VERSION_1, MRG_RXBUF, EVENT_IDX and INDIRECT_DESC; MTU, so
// that QEMU tells us the guest's MTU (NET_SET_MTU, with -device …,host_mtu=N); guest TX
// offloads the TAP accepts on write — CSUM and HOST_TSO4/6/ECN always (drivers/net/tun.c
// tun_get_user validates them whatever TUNSETOFFLOAD says), HOST_USO where the TAP took
// TUN_F_USO4/6 in the probe (the kernels that know those bits, 6.2 and later, are the
// ones whose virtio_net_hdr_to_skb takes VIRTIO_NET_HDR_GSO_UDP_L4: both came with the
// same series); guest RX offloads only as far as the TAP can be told to produce them
// (GUEST_CSUM, GUEST_TSO4/6/ECN, GUEST_USO4/6). No UFO either way (the TAP never
// produces it and ValidatePeer refuses it). GUEST_ANNOUNCE lets QEMU ask a migrated
// guest to announce itself (migrate.go); it asks nothing of the back-end.
func Offer(probed vnethdr.Offloads) uint64 {
	f := uint64(1)<<virtio.Version1 | 1<<virtio.NetMrgRxbuf |
		1<<virtio.RingEventIdx | 1<<virtio.RingIndirectDesc | 1<<virtio.NetMTU | 1<<virtio.NetGuestAnnounce |
		1<<virtio.NetCsum | 1<<virtio.NetHostTSO4 | 1<<virtio.NetHostTSO6 | 1<<virtio.NetHostECN
	uso := probed&vnethdr.OffloadUSO == vnethdr.OffloadUSO
	if uso {
		f |= 1 << virtio.NetHostUSO
	}
	if probed&vnethdr.OffloadCSUM != 0 {
		f |= 1 << virtio.NetGuestCsum
		for _, b := range rxBits[1:] {
			if probed&b.o != 0 {
				f |= 1 << b.bit
			}
		}
	}
	return f
}

// offer is what this Net offers: Offer for its TAP, and MQ with more than one queue pair.
func (n *Net) offer() uint64 {
	f := Offer(n.probed)
	if len(n.pairs) > 1 {
		f |= 1 << virtio.NetMQ
	}
	return f
}

// rxBits and txBits pair each offload with the feature that lets it cross the ring:
// toward the guest the GUEST_* bit the driver acked it can receive, toward the TAP the
// HOST_* bit it may send (virtio spec "Processing of Incoming Packets" and "Packet
// Transmission"). CSUM comes first in each: every other offload needs it. HOST_USO is
// one bit for both IP versions; GUEST_USO4 and GUEST_USO6 are two.
type featOffload struct {
	bit uint
	o   vnethdr.Offloads
}

var (
	rxBits = [...]featOffload{{virtio.NetGuestCsum, vnethdr.OffloadCSUM}, {virtio.NetGuestTSO4, vnethdr.OffloadTSO4},
		{virtio.NetGuestTSO6, vnethdr.OffloadTSO6}, {virtio.NetGuestECN, vnethdr.OffloadTSOECN},
		{virtio.NetGuestUSO4, vnethdr.OffloadUSO4}, {virtio.NetGuestUSO6, vnethdr.OffloadUSO6}}
	txBits = [...]featOffload{{virtio.NetCsum, vnethdr.OffloadCSUM}, {virtio.NetHostTSO4, vnethdr.OffloadTSO4},
		{virtio.NetHostTSO6, vnethdr.OffloadTSO6}, {virtio.NetHostECN, vnethdr.OffloadTSOECN},
		{virtio.NetHostUSO, vnethdr.OffloadUSO}}
)

// RXOffloads is what a guest that acked f can receive unchanged: NEEDS_CSUM only with
// GUEST_CSUM, TSO4/TSO6/TSO_ECN only with GUEST_TSO4/TSO6/ECN, USO4/USO6 only with
// GUEST_USO4/USO6 (the device must not hand the driver NEEDS_CSUM or a GSO type it did
// not negotiate), and nothing without CSUM (drivers/net/tun.c set_offload: every GSO
// bit needs it). USO4 and USO6 may come singly here; TUNSETOFFLOAD takes them only as
// a pair (applyOffloads).
func RXOffloads(f vhostuser.Features) vnethdr.Offloads {
	if !f.Has(virtio.NetGuestCsum) {
		return 0
	}
	var o vnethdr.Offloads
	for _, b := range rxBits {
		if f.Has(b.bit) {
			o |= b.o
		}
	}
	return o
}

// TXOffloads is what a guest that acked f may send: NEEDS_CSUM with CSUM, GSO kinds with
// HOST_TSO4/TSO6/ECN/USO.
func TXOffloads(f vhostuser.Features) vnethdr.Offloads {
	var o vnethdr.Offloads
	for _, b := range txBits {
		if f.Has(b.bit) {
			o |= b.o
		}
	}
	return o
}

// TapOffloads is the TUNSETOFFLOAD mask for a guest that takes rx (RXOffloads) whole,
// given what the TAP probed and the cap (--offload, `tapgro ctl offload`): rx itself,
// plus the USO pair whenever the guest takes partial checksums, so that UDP GSO from
// the host crosses the TAP whole and is cut here for a guest that did not ack it
// (split.go says why that is cheaper than the kernel cutting it), all within what the
// TAP probed and the cap allow, and normalized (TUNSETOFFLOAD refuses USO4 without
// USO6, and everything without CSUM).
func TapOffloads(rx, probed, capped vnethdr.Offloads) vnethdr.Offloads {
	want := rx
	if rx&vnethdr.OffloadCSUM != 0 {
		want |= vnethdr.OffloadUSO
	}
	return (want & probed & capped).Normalize()
}

// FeaturesAcked applies SET_FEATURES to the TAP between batches: TUNSETVNETHDRSZ = the
// guest's header length, so the TAP's header is byte for byte the guest's (TX chains
// are written and RX chains read with no header translation), and TUNSETOFFLOAD =
// TapOffloads.
func (n *Net) FeaturesAcked(f vhostuser.Features) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stats.FeatureChanges.Add(1)
	if f.HdrLen != n.tapHdr {
		// One TUNSETVNETHDRSZ sets the device's length (tun->vnet_hdr_sz, shared by
		// every queue); it is issued on every queue so that each tapdev.Device, which
		// sizes its reads by it, records the length too.
		ok := true
		for _, q := range n.pairs {
			if err := q.tap.SetVnetHdrLen(f.HdrLen); err != nil {
				n.peerLine(&n.gates.tapErr, quietlog.Key(err.Error()), n.log.Warn,
					"vhostnet: the TAP refused the guest's header length", "header_bytes", f.HdrLen, "error", err)
				ok = false
			}
		}
		if ok {
			n.tapHdr = f.HdrLen
		}
	}
	n.features = f
	n.rxAllow = RXOffloads(f)
	n.txAllow = TXOffloads(f)
	n.guestCsm = f.Has(virtio.NetGuestCsum)
	n.mrg = f.Has(virtio.NetMrgRxbuf)
	n.acked.Store(f.Bits)
	n.ackedOK.Store(true)
	eff := n.applyOffloadsLocked()
	hex := fmt.Sprintf("%#x", f.Bits)
	kv := []any{"features", hex, "names", virtio.String(f.Bits), "header_bytes", n.tapHdr, "tap_offloads", eff.String()}
	if n.rscMode {
		kv = append(kv, "rsc", "on") // coalescing toward the guest
	}
	if cut := n.rxAllow & vnethdr.OffloadUSO; eff&vnethdr.OffloadUSO != 0 && cut != vnethdr.OffloadUSO {
		kv = append(kv, "uso_cut", "on") // cutting UDP GSO for the guest
	}
	// Logged when it changes: QEMU repeats SET_FEATURES at every migration's start and
	// end, and a front-end can send it as often as it likes.
	key := fmt.Sprint(hex, n.tapHdr, eff, n.rscMode)
	n.peerLine(&n.gates.features, key, n.log.Info, "vhostnet: guest features acked", kv...)
}

// applyOffloadsLocked sets TUNSETOFFLOAD from the acked features and the cap (n.mu held
// exclusively, so it lands between batches) and chooses RSC mode; it returns what the
// TAP took.
func (n *Net) applyOffloadsLocked() vnethdr.Offloads {
	// TUNSETOFFLOAD is device-wide (drivers/net/tun.c set_offload → tun->dev features),
	// so queue 0 sets it for all; a detached queue's fd takes it just the same.
	tap := n.pairs[0].tap
	eff, err := tap.SetOffloads(TapOffloads(n.rxAllow, n.probed, n.offloadCap))
	if err != nil {
		n.peerLine(&n.gates.tapErr, quietlog.Key(err.Error()), n.log.Warn,
			"vhostnet: the TAP refused its offloads; it hands MTU frames", "error", err)
		// Whatever was set before may exceed the new acks: fall back to none.
		eff, _ = tap.SetOffloads(0)
	}
	n.tapOffl.Store(uint64(eff))
	want := n.rxAllow
	// RSC (rsc.go) when the guest takes a TSO kind the TAP will not produce.
	n.rscMode = n.groOn.Load() && ((want&vnethdr.OffloadTSO4 != 0 && eff&vnethdr.OffloadTSO4 == 0) ||
		(want&vnethdr.OffloadTSO6 != 0 && eff&vnethdr.OffloadTSO6 == 0))
	n.rscECN = want&vnethdr.OffloadTSOECN != 0
	return eff
}

// SetOffloads changes the cap on the TAP's read offloads at run time (`tapgro ctl
// offload`, as --offload at start): Auto follows what the guest acked, otherwise the
// TAP never produces more than c.Set. A session that has acked its features gets the
// new TUNSETOFFLOAD at once, between batches; frames the TAP queued under the old mask
// are cut or refused as rxJudge says. It returns the TAP's offloads now (0 while no
// guest has acked).
func (n *Net) SetOffloads(c vnethdr.Choice) vnethdr.Offloads {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.offload = c
	n.offloadCap = ^vnethdr.Offloads(0)
	if !c.Auto {
		n.offloadCap = c.Set
	}
	if !n.ackedOK.Load() {
		return vnethdr.Offloads(n.tapOffl.Load())
	}
	eff := n.applyOffloadsLocked()
	n.log.Info("vhostnet: offloads changed", "offload", c.String(), "tap_offloads", eff.String())
	return eff
}

// OffloadChoice is the cap in effect (--offload, or the last SetOffloads).
func (n *Net) OffloadChoice() vnethdr.Choice {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.offload
}

// SetGRO switches coalescing on or off at run time (--gro, `tapgro ctl gro=`): toward
// the TAP the TX workers take it up at their next batch, writing what they hold first
// when it goes off; toward the guest RSC mode is chosen again at once (between batches,
// under the write lock), and an RX worker in it delivers what it holds before it leaves
// it. It returns whether coalescing runs now.
func (n *Net) SetGRO(on bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.groOn.Swap(on) == on {
		return on
	}
	if n.ackedOK.Load() {
		n.applyOffloadsLocked()
	}
	n.log.Info("vhostnet: gro switched", "gro", on)
	return on
}

// GROActive reports whether coalescing toward the TAP runs: on (--gro, SetGRO), and
// not stopped because the kernel refuses TCP GSO writes (fallback.go).
func (n *Net) GROActive() bool { return n.groOn.Load() && !n.groKilled.Load() }

// SetUDPGRO switches UDP coalescing toward the TAP (--udp-gro, `tapgro ctl udp-gro`);
// the TX workers take it up at their next batch. It returns whether UDP is coalesced
// now: only with GRO on and a TAP that takes UDP GSO frames on write (it probed
// TUN_F_USO4/6; see Offer).
func (n *Net) SetUDPGRO(on bool) bool {
	n.udpGRO.Store(on)
	return n.UDPGROActive()
}

// UDPGROActive reports whether UDP datagrams are coalesced toward the TAP.
func (n *Net) UDPGROActive() bool {
	return n.groOn.Load() && n.udpGRO.Load() && n.probed&vnethdr.OffloadUSO == vnethdr.OffloadUSO
}
