package tapdev

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
)

// openRaw opens a TAP queue the way a manager would (QEMU's net/tap-linux.c tap_open),
// with the given TUNSETIFF flags, and returns the bare descriptor.
func openRaw(t *testing.T, ns *netnstest.NS, name string, flags uint16) int {
	t.Helper()
	fd := -1
	if err := ns.Do(func() error {
		var err error
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
		ifr, _ := unix.NewIfreq(name)
		ifr.SetUint16(flags)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}); err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	return fd
}

// TestAdopt: a queue opened elsewhere with IFF_VNET_HDR is taken over (its name from
// the device, its header length set, its offloads reset, frames readable), the
// addresses are read over the device's own netlink socket; one without IFF_VNET_HDR
// is refused with a reason and left open.
func TestAdopt(t *testing.T) {
	netnstest.RequirePriv(t)
	ns := netnstest.New(t, "adopt")
	fd := openRaw(t, ns, "tgad0", unix.IFF_TAP|unix.IFF_NO_PI|unix.IFF_VNET_HDR)
	if name, err := NameOf(fd); err != nil || name != "tgad0" {
		t.Fatalf("NameOf: %q, %v", name, err)
	}
	d, err := Adopt(fd, 12)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.Name() != "tgad0" || vnetHdrSz(t, d) != 12 {
		t.Fatalf("adopted %q with header %d, want tgad0 and 12", d.Name(), vnetHdrSz(t, d))
	}
	ns.MustRun(t, "ip", "addr", "add", "198.18.7.1/24", "dev", "tgad0")
	_, addrs, err := d.LinkInfo()
	if err != nil || len(addrs) == 0 || addrs[0].String() != "198.18.7.1/24" {
		t.Fatalf("LinkInfo: %v, %v", addrs, err)
	}

	plain := openRaw(t, ns, "tgad1", unix.IFF_TAP|unix.IFF_NO_PI)
	defer unix.Close(plain)
	if _, err := Adopt(plain, 12); err == nil || !strings.Contains(err.Error(), "IFF_VNET_HDR") {
		t.Fatalf("Adopt of a queue without IFF_VNET_HDR: %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(plain), unix.F_GETFD, 0); err != nil {
		t.Fatalf("a refused fd must stay open: %v", err)
	}
}
