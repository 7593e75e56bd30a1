//go:build linux

package vhostnet

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/integration/netnstest"
	"tapgro/kvlog"
	"tapgro/tapdev"
	"tapgro/tapdev/taptest"
	"tapgro/vhostuser"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

const (
	tapName   = "tgvn0"
	etherTest = 0x88b5 // IEEE 802 local experimental: nothing else in the namespace uses it
)

var (
	tapPfx  = netip.MustParsePrefix("198.18.0.1/24")
	farIP   = netip.MustParseAddr("198.18.0.77") // not local, forwarding off: dropped after the packet socket
	guestIP = netip.MustParseAddr("198.18.0.2")
	gMAC    = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
)

// env is a Net on one TAP queue and a front-end double session. By default the TAP is
// tapdev/taptest's in-memory one: no root, no namespace, frames the test injects and
// reads back whole. newKernelEnv puts a real TAP in a fresh namespace instead, with a
// packet socket bound to it, for what only the kernel does: its stack's traffic,
// TUNSETOFFLOAD's effect on what it hands over, segmentation of what it is handed,
// several queues.
type env struct {
	t    testing.TB
	ns   *netnstest.NS // kernel mode only
	tap  envTAP
	fake *taptest.TAP // in-memory mode: the same TAP, its test side
	seen int          // in-memory mode: the packets recvTAP has looked at
	mac  net.HardwareAddr
	n    *Net
	s    *vhostusertest.Session
	ps   int // kernel mode: AF_PACKET, ETH_P_ALL, bound to the TAP
	ifx  int
}

// envTAP is what the tests read of either TAP besides the Net's contract.
type envTAP interface {
	TAP
	Offloads() vnethdr.Offloads
	Close() error
}

var _ envTAP = (*taptest.TAP)(nil)

func newEnv(t testing.TB, o vhostusertest.Options) *env {
	t.Helper()
	return newEnvCfg(t, o, Config{})
}

// newEnvCfg is newEnv with Net configured by cfg (its TAP and Log filled in); setup, if
// given, configures the in-memory TAP before anything uses it.
func newEnvCfg(t testing.TB, o vhostusertest.Options, cfg Config, setup ...func(*taptest.TAP)) *env {
	t.Helper()
	tap := taptest.New(true)
	for _, f := range setup {
		f(tap)
	}
	mac, _, _ := tap.LinkInfo()
	e := &env{t: t, tap: tap, fake: tap, mac: mac, ps: -1}
	t.Cleanup(func() { tap.Close() })
	return e.start(o, cfg)
}

// newKernelEnv is newEnvCfg on a real TAP (it needs root).
func newKernelEnv(t testing.TB, o vhostusertest.Options, cfg Config) *env {
	t.Helper()
	ns := netnstest.New(t, "vhostnet")
	ns.MustRun(t, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
	e := &env{t: t, ns: ns, ps: -1}
	var dev *tapdev.Device
	if err := ns.Do(func() (err error) {
		dev, err = tapdev.Open(tapdev.Config{Name: tapName})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e.tap = dev
	t.Cleanup(func() { dev.Close() })
	e.attach(tapName)
	return e.start(o, cfg)
}

func (e *env) start(o vhostusertest.Options, cfg Config) *env {
	e.t.Helper()
	cfg.TAP, cfg.Log = e.tap, kvlog.Printf(e.t.Logf)
	n, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.n = n
	e.s = vhostusertest.Start(e.t, n.ServeConn, o) // its cleanup ends the session first
	return e
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// testFrame is an Ethernet frame of n bytes with our ethertype, seq in the first
// payload bytes and a pattern from seed.
func testFrame(dst, src net.HardwareAddr, n int, seq uint32, seed uint64) []byte {
	f := make([]byte, n)
	copy(f, dst)
	copy(f[6:], src)
	binary.BigEndian.PutUint16(f[12:], etherTest)
	binary.BigEndian.PutUint32(f[14:], seq)
	x := seed*0x9e3779b97f4a7c15 + uint64(seq)
	for i := 18; i < n; i++ {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		f[i] = byte(x)
	}
	return f
}

// recvTAP returns the next frame the TAP received from the guest (not the kernel's own
// output), of our ethertype or IPv4 to farIP, without its vnet header.
func (e *env) recvTAP(buf []byte) ([]byte, error) {
	for {
		var f []byte
		if e.fake != nil {
			p := e.fake.NextWritten(e.seen, 5*time.Second)
			if p == nil {
				return nil, unix.EAGAIN // as the packet socket's SO_RCVTIMEO
			}
			e.seen++
			f = buf[:copy(buf, p[min(e.fake.VnetHdrLen(), len(p)):])]
		} else {
			n, from, err := unix.Recvfrom(e.ps, buf, 0)
			if err == unix.EINTR {
				continue // the runtime's preemption signals interrupt a blocking recvfrom
			}
			if err != nil {
				return nil, err
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			f = buf[:n]
		}
		if len(f) >= 14 && binary.BigEndian.Uint16(f[12:]) == etherTest {
			return f, nil
		}
		if len(f) >= 34 && binary.BigEndian.Uint16(f[12:]) == 0x0800 && netip.AddrFrom4([4]byte(f[30:34])) == farIP {
			return f, nil
		}
	}
}

// injectTAP hands frame to the TAP's reader, Net's RX, as the kernel would: with a
// zero vnet header in front (nothing to offload; what a packet socket's frame gets).
func (e *env) injectTAP(frame []byte) error {
	if e.fake != nil {
		p := make([]byte, e.fake.VnetHdrLen()+len(frame))
		copy(p[e.fake.VnetHdrLen():], frame)
		if !e.fake.Inject(p) {
			return net.ErrClosed
		}
		return nil
	}
	for {
		// The socket is bound to the TAP, so a plain write sends there (net/packet/af_packet.c
		// packet_snd takes the bound ifindex when no address is given), and allocates
		// nothing, unlike Sendto's sockaddr conversion.
		_, err := unix.Write(e.ps, frame)
		if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		return err
	}
}

// send makes the guest transmit hdr+frame split as given and kicks.
func (e *env) send(h vnethdr.Hdr, frame []byte, split []int, indirect bool) {
	hl := e.s.HdrLen()
	data := make([]byte, hl+len(frame))
	h.Encode(data, hl)
	copy(data[hl:], frame)
	tx := e.s.TX(0)
	for tx.Free() < len(split)+2 {
		e.reapTX(time.Second)
	}
	tx.SendFrame(data, split, indirect)
	tx.KickNow()
}

func (e *env) reapTX(d time.Duration) int {
	tx := e.s.TX(0)
	tx.WaitCall(d)
	return tx.ReapFunc(nil)
}

// waitTXDone waits until every TX chain has been used.
func (e *env) waitTXDone() {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.s.TX(0).Outstanding() > 0 {
		if time.Now().After(deadline) {
			e.t.Fatalf("%d TX chains never used", e.s.TX(0).Outstanding())
		}
		e.reapTX(10 * time.Millisecond)
	}
}

// recvGuest collects frames of our ethertype from the RX ring until want have come,
// reposting each chain it reaps.
func (e *env) recvGuest(want int, bufLen, pieces int, timeout time.Duration) [][]byte {
	e.t.Helper()
	rx := e.s.RX(0)
	mrg := e.s.Has(virtio.NetMrgRxbuf)
	var out [][]byte
	var other []string
	deadline := time.Now().Add(timeout)
	for len(out) < want {
		if time.Now().After(deadline) {
			e.t.Fatalf("guest received %d of %d frames (stats %+v, other frames %v, used idx %d, outstanding %d, free %d, drops %v)",
				len(out), want, e.stats(), other, rx.UsedIdx(), rx.Outstanding(), rx.Free(), e.n.BackendStats().Rejected[vhostuser.RejectIovFull].Load())
		}
		rx.WaitCall(10 * time.Millisecond)
		fr := rx.ReapRX(e.s.HdrLen(), mrg)
		for _, f := range fr {
			if len(f.Frame) >= 14 && binary.BigEndian.Uint16(f.Frame[12:]) == etherTest {
				out = append(out, f.Frame)
			} else if len(f.Frame) >= 14 {
				other = append(other, fmt.Sprintf("%#x/%d", binary.BigEndian.Uint16(f.Frame[12:]), len(f.Frame)))
			}
		}
		if n := len(fr); n > 0 || rx.Free() >= pieces {
			k := rx.Free() / pieces
			if k > 0 {
				rx.PostRX(k, bufLen, pieces)
				rx.KickNow()
			}
		}
	}
	return out
}

func (e *env) stats() map[string]uint64 {
	st := e.n.Stats()
	m := map[string]uint64{"tx": st.TXFrames.Load(), "rx": st.RXFrames.Load(), "txgso": st.TXGSO.Load(),
		"rxgso": st.RXGSO.Load(), "stalls": st.RXStalls.Load()}
	for i := range NumDrops {
		if v := st.Drops[i].Load(); v != 0 {
			m[i.String()] = v
		}
	}
	return m
}

// attach brings e.tap (named name) up with the test address, waits for its real qdisc,
// and binds e.ps, a packet socket, to it.
func (e *env) attach(name string) {
	t := e.t
	t.Helper()
	if err := e.tap.(*tapdev.Device).ConfigureLink(tapdev.LinkConfig{MTU: tapdev.MaxMTU, TxQueueLen: 1000,
		Addrs: []netip.Prefix{tapPfx}, Up: true}); err != nil {
		t.Fatal(err)
	}
	// Until linkwatch attaches the real qdisc (asynchronously, after carrier), frames
	// sent through the TAP go to noop_qdisc and are dropped: wait for it.
	for deadline := time.Now().Add(5 * time.Second); ; {
		out := e.ns.MustRun(t, "ip", "link", "show", "dev", name)
		if !bytes.Contains(out, []byte("qdisc noop")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s keeps noop qdisc: %s", name, out)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := e.ns.Do(func() error {
		ifc, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		e.mac, e.ifx = ifc.HardwareAddr, ifc.Index
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		e.ps = fd
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 16<<20)
		tv := unix.Timeval{Sec: 5}
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: e.ifx})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if e.ps >= 0 {
			unix.Close(e.ps)
		}
	})
}

// serve runs e.n.Serve on a fresh listener at path; cancel ends it, and done then
// carries what Serve returned.
func (e *env) serve() (path string, cancel context.CancelFunc, done chan error) {
	path = e.t.TempDir() + "/vhost.sock"
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan error, 1)
	go func() { done <- e.n.Serve(ctx, ln) }()
	return path, cancel, done
}
