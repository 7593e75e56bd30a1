package tapdev

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// MTU limits of a tun/tap netdev (ip -d link: minmtu 68 maxmtu 65521).
const (
	MinMTU = 68
	MaxMTU = 65521
	// minIPv6MTU: the kernel disables IPv6 on a link whose MTU is below 1280.
	minIPv6MTU = 1280
)

// dumpRetries bounds retries of netlink requests that the kernel may answer with
// NLM_F_DUMP_INTR (netlink.ErrDumpInterrupted since v1.2.1): the result was racing a
// change, so it is simply asked for again (vishvananda/netlink#1018).
const dumpRetries = 10

func retryDump(fn func() error) error {
	var err error
	for range dumpRetries {
		if err = fn(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return err
		}
	}
	return err
}

// ConfigureLink applies lc to the TAP's netdev over rtnetlink, in the network namespace
// the device was opened in (from any goroutine): MTU, then txqueuelen, then addresses,
// then up. Adding an address that is already there is not an error (RTM_NEWADDR with
// NLM_F_REPLACE); IPv6 addresses skip duplicate address detection so they are usable at
// once.
func (d *Device) ConfigureLink(lc LinkConfig) error {
	if lc.MTU != 0 && (lc.MTU < MinMTU || lc.MTU > MaxMTU) {
		return fmt.Errorf("tapdev: MTU %d for %s out of range %d..%d", lc.MTU, d.name, MinMTU, MaxMTU)
	}
	if lc.TxQueueLen < 0 {
		return fmt.Errorf("tapdev: txqueuelen %d for %s is negative", lc.TxQueueLen, d.name)
	}
	addrs := make([]*netlink.Addr, 0, len(lc.Addrs))
	for _, p := range lc.Addrs {
		a, err := nlAddr(p)
		if err != nil {
			return fmt.Errorf("tapdev: address for %s: %w", d.name, err)
		}
		if p.Addr().Is6() && lc.MTU != 0 && lc.MTU < minIPv6MTU {
			return fmt.Errorf("tapdev: IPv6 address %s needs an MTU of at least %d, not %d", p, minIPv6MTU, lc.MTU)
		}
		addrs = append(addrs, a)
	}

	h, err := handleIn(d.ns)
	if err != nil {
		return fmt.Errorf("tapdev: netlink in %s's namespace: %w", d.name, err)
	}
	defer h.Close()
	var link netlink.Link
	if err := retryDump(func() (err error) { link, err = h.LinkByName(d.name); return err }); err != nil {
		return fmt.Errorf("tapdev: find link %s: %w", d.name, err)
	}
	if lc.MTU != 0 {
		if err := h.LinkSetMTU(link, lc.MTU); err != nil {
			return fmt.Errorf("tapdev: set MTU %d on %s: %w", lc.MTU, d.name, err)
		}
	}
	if lc.TxQueueLen != 0 {
		if err := h.LinkSetTxQLen(link, lc.TxQueueLen); err != nil {
			return fmt.Errorf("tapdev: set txqueuelen %d on %s: %w", lc.TxQueueLen, d.name, err)
		}
	}
	for i, a := range addrs {
		if err := h.AddrReplace(link, a); err != nil {
			return fmt.Errorf("tapdev: add address %s to %s: %w", lc.Addrs[i], d.name, err)
		}
	}
	if lc.Up {
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("tapdev: set %s up: %w", d.name, err)
		}
	}
	return nil
}

func nlAddr(p netip.Prefix) (*netlink.Addr, error) {
	if !p.IsValid() {
		return nil, fmt.Errorf("invalid prefix %v", p)
	}
	ip := p.Addr()
	if ip.Is4In6() {
		return nil, fmt.Errorf("%s: write IPv4 addresses as a.b.c.d/n, not IPv4-mapped IPv6", p)
	}
	if ip.Zone() != "" {
		return nil, fmt.Errorf("%s: an address with a zone cannot be assigned", p)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(p.Bits(), ip.BitLen())}}
	if ip.Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a, nil
}

// linkAddrs lists the addresses on the device's link (used by tests and diagnostics).
func (d *Device) linkAddrs() ([]netip.Prefix, error) {
	_, addrs, err := d.LinkInfo()
	return addrs, err
}

// LinkInfo reports the device's MAC address and the addresses now on its link, whoever
// assigned them. tapgro announces them to each new peer (see main's announce.go). It
// asks over the netlink socket opened with the device, so it works in a confined
// process (package sandbox).
func (d *Device) LinkInfo() (net.HardwareAddr, []netip.Prefix, error) {
	d.nlMu.Lock()
	defer d.nlMu.Unlock()
	h := d.nl
	if h == nil {
		return nil, nil, fmt.Errorf("tapdev: %s is closed", d.name)
	}
	var link netlink.Link
	if err := retryDump(func() (err error) { link, err = h.LinkByName(d.name); return err }); err != nil {
		return nil, nil, err
	}
	var list []netlink.Addr
	if err := retryDump(func() (err error) { list, err = h.AddrList(link, netlink.FAMILY_ALL); return err }); err != nil {
		return nil, nil, err
	}
	out := make([]netip.Prefix, 0, len(list))
	for _, a := range list {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return link.Attrs().HardwareAddr, out, nil
}
