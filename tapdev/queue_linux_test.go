package tapdev

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
)

// TestQueueDetachAttach checks what vhostnet relies on for SET_VRING_ENABLE: a detached
// queue gets no frames (its echo replies all come back on the attached queue), but its
// fd still writes and still takes the device-wide ioctls; attach restores it.
func TestQueueDetachAttach(t *testing.T) {
	ns := netnstest.New(t, "mqdetach")
	ns.MustRun(t, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	var qs []*Device
	if err := ns.Do(func() (err error) { qs, err = OpenQueues(Config{Name: "tgmqd"}, 2); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, q := range qs {
			q.Close()
		}
	})
	q0, q1 := qs[0], qs[1]
	if err := q0.ConfigureLink(LinkConfig{MTU: 1500, Addrs: []netip.Prefix{tapPfx}, Up: true}); err != nil {
		t.Fatal(err)
	}
	ns.MustRun(t, "ip", "neigh", "replace", peerIP.String(), "lladdr", peerMAC.String(), "dev", "tgmqd", "nud", "permanent")
	queues := func() (attached, disabled int) {
		var link netlink.Link
		if err := ns.Do(func() (err error) { link, err = netlink.LinkByName("tgmqd"); return err }); err != nil {
			t.Fatal(err)
		}
		tt := link.(*netlink.Tuntap)
		return tt.Queues, tt.DisabledQueues
	}
	if a, d := queues(); a != 2 || d != 0 {
		t.Fatalf("queues %d attached %d disabled, want 2, 0", a, d)
	}
	if err := q1.SetQueueEnabled(false); err != nil {
		t.Fatal(err)
	}
	if a, d := queues(); a != 1 || d != 1 {
		t.Fatalf("after detach: %d attached %d disabled, want 1, 1", a, d)
	}
	if err := q1.SetQueueEnabled(false); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("second detach: %v, want EINVAL", err)
	}
	// The header length is the device's: set through the detached fd, read on the other.
	if err := q1.SetVnetHdrLen(12); err != nil {
		t.Fatalf("TUNSETVNETHDRSZ on a detached queue: %v", err)
	}
	if got := vnetHdrSz(t, q0); got != 12 {
		t.Fatalf("TUNGETVNETHDRSZ on q0 = %d after setting 12 on q1", got)
	}
	q0.SetVnetHdrLen(12)
	if _, err := q1.SetOffloads(0); err != nil {
		t.Fatalf("TUNSETOFFLOAD on a detached queue: %v", err)
	}
	// Echo requests written on the detached queue are answered on q0, whatever the flow.
	payload := []byte("detached queue")
	bufs, sizes := newBufs(8)
	for id := uint16(1); id <= 16; id++ {
		req := echoRequest(12, q0MAC(t, ns), id, 1, payload)
		if _, err := q1.Writev([][]byte{req}); err != nil {
			t.Fatalf("write on a detached queue: %v", err)
		}
		q0.SetReadDeadline(time.Now().Add(hangGuard))
		for got := false; !got; {
			n, err := q0.ReadBatch(bufs, sizes, 0)
			if err != nil {
				t.Fatalf("reply %d: %v", id, err)
			}
			for i := range n {
				got = got || isEchoReply(bufs[i][12:sizes[i]], id, 1, payload)
			}
		}
	}
	if ready, err := q1.Readable(); err != nil || ready {
		t.Fatalf("detached queue readable %v, %v: the kernel steered frames to it", ready, err)
	}
	if err := q1.SetQueueEnabled(true); err != nil {
		t.Fatal(err)
	}
	if a, d := queues(); a != 2 || d != 0 {
		t.Fatalf("after attach: %d attached %d disabled, want 2, 0", a, d)
	}
	if err := q1.SetQueueEnabled(true); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("second attach: %v, want EINVAL", err)
	}
}

func q0MAC(t *testing.T, ns *netnstest.NS) []byte {
	t.Helper()
	var mac []byte
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName("tgmqd")
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}
