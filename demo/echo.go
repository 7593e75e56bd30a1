package demo

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"

	"github.com/vishvananda/netns"

	"tapgro/vnethdr"
)

// demoEcho is the built-in ICMP echo the demo uses when ping is not installed: a raw
// ICMP socket opened inside namespace A, so one request and its reply take the same
// path through both tapgro processes as the system ping's would. It is a raw socket
// (not an unprivileged ICMP datagram one) because the demo runs as root and a fresh
// namespace's net.ipv4.ping_group_range allows no group.
type demoEcho struct {
	c   net.PacketConn
	v6  bool
	dst net.IP
	id  uint16
	seq uint16
}

// newDemoEcho opens the raw ICMP (or ICMPv6) socket for dst inside the named namespace.
// The socket stays bound to that namespace after the thread switches back.
func newDemoEcho(nsName string, dst net.IP) (*demoEcho, error) {
	network := "ip4:icmp"
	v6 := dst.To4() == nil
	if v6 {
		network = "ip6:ipv6-icmp"
	}
	type result struct {
		c   net.PacketConn
		err error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{nil, err}
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(nsName)
		if err != nil {
			runtime.UnlockOSThread()
			res <- result{nil, fmt.Errorf("open namespace %s: %w", nsName, err)}
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			res <- result{nil, fmt.Errorf("enter namespace %s: %w", nsName, err)}
			return
		}
		c, err := net.ListenPacket(network, "")
		if serr := netns.Set(orig); serr != nil {
			// The thread stays locked, so the runtime ends it with this goroutine
			// rather than running other code in the wrong namespace.
			if c != nil {
				c.Close()
			}
			res <- result{nil, fmt.Errorf("leave namespace %s: %w", nsName, serr)}
			return
		}
		runtime.UnlockOSThread()
		res <- result{c, err}
	}()
	r := <-res
	if r.err != nil {
		return nil, r.err
	}
	return &demoEcho{c: r.c, v6: v6, dst: dst, id: uint16(os.Getpid())}, nil
}

func (e *demoEcho) close() { e.c.Close() }

// ping sends one echo request and waits up to timeout for its reply.
func (e *demoEcho) ping(timeout time.Duration) (time.Duration, error) {
	e.seq++
	reqType, replyType := byte(8), byte(0) // ICMP echo request / reply
	if e.v6 {
		reqType, replyType = 128, 129
	}
	msg := make([]byte, 8, 8+16)
	msg[0] = reqType
	binary.BigEndian.PutUint16(msg[4:], e.id)
	binary.BigEndian.PutUint16(msg[6:], e.seq)
	msg = append(msg, "tapgro demo echo"...)
	if !e.v6 {
		// Linux fills in the ICMPv6 checksum of a raw socket itself (it needs the
		// pseudo-header), but not ICMPv4's.
		binary.BigEndian.PutUint16(msg[2:], vnethdr.Checksum(msg, 0))
	}
	start := time.Now()
	if err := e.c.SetReadDeadline(start.Add(timeout)); err != nil {
		return 0, err
	}
	if _, err := e.c.WriteTo(msg, &net.IPAddr{IP: e.dst}); err != nil {
		return 0, err
	}
	buf := make([]byte, 1500)
	for {
		// The socket sees every ICMP message of the namespace (neighbour discovery,
		// other echoes); only our reply counts. Go strips the IPv4 header.
		n, from, err := e.c.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, fmt.Errorf("no echo reply from %s within %v", e.dst, timeout)
			}
			return 0, err
		}
		if n >= 8 && buf[0] == replyType && buf[1] == 0 &&
			binary.BigEndian.Uint16(buf[4:]) == e.id && binary.BigEndian.Uint16(buf[6:]) == e.seq {
			if a, ok := from.(*net.IPAddr); ok && a.IP.Equal(e.dst) {
				return time.Since(start), nil
			}
		}
	}
}
