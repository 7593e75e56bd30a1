//go:build linux

package vhostuser

// WaitMore blocks until the driver makes a chain available beyond those the last Pop
// saw (returning at once if it already has):
// for a receive worker whose ReserveRX found chains, but too few to hold a frame. Wait
// would return at once then (the ring is not empty), and with EVENT_IDX the driver
// would not kick again, since End asked for a kick at last_avail_idx, already passed.
// So WaitMore asks for a kick at that avail->idx (with EVENT_IDX, avail_event =
// avail->idx; without it NO_NOTIFY cleared), issues the full barrier, re-reads
// avail->idx and sleeps on the kick only if it has not moved (the protocol of Wait,
// QEMU virtio_queue_split_set_notification). Call it outside a batch. It returns
// ErrStopped or ErrBroken when the worker should stop.
func (v *Vring) WaitMore() error {
	if err := v.lockForWait(); err != nil {
		return err
	}
	// The avail idx the last Pop saw: after a ReserveRX that ran out, every chain up to
	// it was looked at. Chains the driver added since count as "more" already.
	target := v.availCache
	v.unlockForWait()
	for {
		if err := v.lockForWait(); err != nil {
			return err
		}
		if v.eventIdx {
			store16(v.used, v.availEv, target)
		} else {
			v.usedFlags = 0
		}
		store32(v.used, 0, uint32(v.pubIdx)<<16|uint32(v.usedFlags))
		if uint16(load32(v.avail, 0)>>16) != target {
			v.unlockForWait()
			v.pollWait, v.idleKicks = 0, 0
			return nil
		}
		f, poll := v.kick, v.kickNoFd
		v.unlockForWait()
		if err := v.sleep(f, poll); err != nil {
			return err
		}
	}
}
