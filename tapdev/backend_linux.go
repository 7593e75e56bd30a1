package tapdev

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// SetVnetHdrLen switches the header length with TUNSETVNETHDRSZ (drivers/net/tun_vnet.h
// tun_vnet_ioctl). It is for set-up only: frames already queued, and a datapath sized for
// the old length, would be read wrongly, so call it before the first ReadBatch or Write.
func (d *Device) SetVnetHdrLen(n int) error {
	if !d.HasVnetHdrLen(n) {
		return fmt.Errorf("tapdev: vnet header length %d not supported on %s (want 10 or 12)", n, d.name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var ierr error
	err := d.rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetPointerInt(int(fd), unix.TUNSETVNETHDRSZ, n)
	})
	if err == nil {
		err = ierr
	}
	if err != nil {
		return fmt.Errorf("tapdev: TUNSETVNETHDRSZ %d on %s: %w", n, d.name, err)
	}
	d.vnetHdrLen = n
	return nil
}
