package tapdev

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// OpenQueues opens n queues of the TAP cfg.Name: one plain Open when n is 1 (a
// single-queue device, as cfg.MultiQueue says), else n Opens with IFF_MULTI_QUEUE, each
// of which attaches one more queue to the same device (drivers/net/tun.c tun_set_iff →
// tun_attach). The header length and the read offloads are device-wide (tun_struct's
// vnet_hdr_sz, and set_offload on tun->dev), and every Open resets the offloads to none,
// so set them after OpenQueues returns, through any queue. On failure the queues opened
// so far are closed.
func OpenQueues(cfg Config, n int) ([]*Device, error) {
	if n < 1 || n > maxQueues {
		return nil, fmt.Errorf("tapdev: %d queues, want 1..%d", n, maxQueues)
	}
	if n > 1 {
		cfg.MultiQueue = true
	}
	qs := make([]*Device, 0, n)
	for range n {
		d, err := Open(cfg)
		if err != nil {
			for _, q := range qs {
				q.Close()
			}
			return nil, err
		}
		qs = append(qs, d)
	}
	return qs, nil
}

// maxQueues is MAX_TAP_QUEUES (drivers/net/tun.c).
const maxQueues = 256

// SetQueueEnabled attaches (true) or detaches (false) this queue of a multiqueue TAP
// with TUNSETQUEUE IFF_ATTACH_QUEUE / IFF_DETACH_QUEUE, as QEMU's own TAP back-end does
// when the guest changes its number of queue pairs (QEMU net/tap-linux.c tap_fd_enable,
// tap_fd_disable). A detached queue leaves the device's tfiles[] (drivers/net/tun.c
// __tun_detach with clean false → tun_disable_queue), so the kernel steers no frame to
// it (tun_select_queue picks among the attached queues) and the frames it held are
// purged (tun_queue_purge); the fd stays open and bound to the device (tfile->tun is
// kept), so ioctls and writes still work on it. Attaching an attached queue or
// detaching a detached one is EINVAL (tun_set_queue), and so is either on a
// single-queue device.
func (d *Device) SetQueueEnabled(on bool) error {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return err
	}
	flag, op := uint16(unix.IFF_DETACH_QUEUE), "detach"
	if on {
		flag, op = unix.IFF_ATTACH_QUEUE, "attach"
	}
	ifr.SetUint16(flag)
	var ierr error
	if err := d.rc.Control(func(fd uintptr) { ierr = unix.IoctlIfreq(int(fd), unix.TUNSETQUEUE, ifr) }); err != nil {
		return d.ioErr(err, "TUNSETQUEUE "+op)
	}
	if ierr != nil {
		return fmt.Errorf("tapdev: TUNSETQUEUE %s on %s: %w", op, d.name, ierr)
	}
	return nil
}
