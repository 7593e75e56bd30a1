//go:build linux

// Package vhostrelay is the built-in stand-in for a guest on tapgro's vhost-user socket,
// used by `tapgro demo` (as the hidden subcommand `tapgro __vhostrelay`), by the
// benchmark and by the tests (as the program integration/vhostrelay): it is the front-end (QEMU's side of the socket, played by
// vhostuser/vhostusertest over its own memfd "guest RAM") and the guest driver (the
// driver side of the split rings), and instead of a guest kernel it has a second TAP,
// opened with IFF_VNET_HDR, a 12-byte header and CSUM|TSO4|TSO6 read offloads, so that
// GSO frames cross whole both ways:
//
//	ns HOST: 198.18.0.1 ─ tg0 ─ tapgro ══ vhost-user (rings in vhostrelay's memfd) ══ vhostrelay ─ TAP ─ 198.18.0.2 :ns GUEST
//
// Like the two-thread TAP-to-TAP relay (integration/gsorelay -split) it is two threads
// of work and two TAP copies per frame (tapgro's readv or writev on tg0, ours on the
// other TAP), so that relay is its ceiling; what the row adds is tapgro's vhost-user
// datapath in between. It is a traffic harness, not part of the daemon.
//
// One goroutine per direction, each allocation-free once running:
//
//   - guest RX (tapgro → us): reap used RX chains, follow num_buffers (MRG_RXBUF,
//     virtio spec "Processing of Incoming Packets"), writev the chains' bytes (header
//     and frame, the TAP's header being the guest's 12 bytes) to the TAP, repost the
//     chains as they were, kick only if tapgro asked (EVENT_IDX avail_event).
//   - guest TX (us → tapgro): readv a TAP frame straight into a free TX slot, make it a
//     one-descriptor chain (VERSION_1 implies ANY_LAYOUT: the header need not have a
//     descriptor of its own, virtio spec "Message Framing"), publish it, kick only if
//     tapgro asked; reap used chains back onto the free list.
//
// Interrupts (tapgro's calls) are suppressed the way Linux's virtio_ring.c does with
// EVENT_IDX: used_event is written only before sleeping (virtqueue_enable_cb_prepare),
// so while a loop keeps up, tapgro never calls.
//
// With -tso=false our TAP's read offloads are CSUM only, so the kernel hands us MTU
// frames and the TX ring carries MTU segments, as from a Linux guest after
// `ethtool -K eth0 tso off`: such a guest keeps its acked HOST_TSO4/6 (TSO is a netdev
// feature the core applies, and virtio_net's ndo_set_features, virtnet_set_features in
// drivers/net/virtio_net.c, acts only on the guest-side offloads and RXHASH; the acked
// virtio features change only at a device reset), so we keep them too, and tapgro's
// GRO toward its TAP is what can make GSO packets of them again.
//
// With -queues N we ack VIRTIO_NET_F_MQ, set up N queue pairs and open our TAP with N
// queues (IFF_MULTI_QUEUE): pair i relays with TAP queue i, one goroutine per direction
// per pair, as a Linux guest runs one NAPI and one TX queue per pair; the kernel picks
// a TAP queue per flow (drivers/net/tun.c tun_select_queue), and tapgro's worker of the
// pair does the same on its side.
//
// Usage: vhostrelay -connect SOCK -tap NAME -addr CIDR[,CIDR] [-mtu N] [-num 256] [-rx-buf 4096] [-tso=false] [-queues N]
package vhostrelay

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/tapdev"
	"tapgro/vhostnet"
	"tapgro/vhostuser/vhostusertest"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// hdrLen is the virtio-net header with VERSION_1 (virtio_net_hdr_mrg_rxbuf, 12 bytes),
// on the rings and on our TAP alike.
const hdrLen = vnethdr.LenMrgRxbuf

// slotSize holds the largest frame a TAP reads, header included (drivers/net/tun.c
// tun_put_user: 14 + 4 + 40 + 65535), rounded up to a page: one TX chain per frame.
const slotSize = (hdrLen + vhostnet.MaxFrame + 4095) &^ 4095

// ackWanted is what a Linux guest with GSO acks of what tapgro offers, minus the bits
// the relay does not use (INDIRECT_DESC: our chains are one descriptor; ECN: our TAP's
// offloads are CSUM|TSO4|TSO6).
const ackWanted = 1<<virtio.Version1 | 1<<virtio.NetMrgRxbuf | 1<<virtio.RingEventIdx |
	1<<virtio.NetCsum | 1<<virtio.NetGuestCsum | 1<<virtio.NetHostTSO4 | 1<<virtio.NetHostTSO6 |
	1<<virtio.NetGuestTSO4 | 1<<virtio.NetGuestTSO6

// Main runs the relay with the command line args (without the program name) until
// tapgro ends the session or SIGINT/SIGTERM, and returns the exit status.
func Main(args []string) int {
	fs := flag.NewFlagSet("vhostrelay", flag.ContinueOnError)
	sock := fs.String("connect", "", "tapgro's vhost-user socket")
	tapName := fs.String("tap", "vr0", "the relay's own TAP")
	addr := fs.String("addr", "", "address/prefix for the TAP (comma-separated for several)")
	mtu := fs.Int("mtu", 1500, "MTU of the TAP")
	num := fs.Int("num", 256, "ring size (QEMU's default rx/tx_queue_size is 256)")
	rxBuf := fs.Int("rx-buf", 4096, "bytes per RX buffer (one descriptor per chain); Linux's mergeable buffers are at most a page")
	wait := fs.Duration("wait", 10*time.Second, "how long to wait for the socket to appear")
	tso := fs.Bool("tso", true, "TSO4/6 in our TAP's read offloads; false: CSUM only, MTU segments on the TX ring (a guest with tso off), HOST_TSO4/6 still acked")
	queues := fs.Int("queues", 1, "queue pairs (acks MQ when > 1; tapgro needs queues=N or more) and TAP queues")
	migLog := fs.Bool("log", false, "turn on dirty logging as QEMU does while it migrates (SET_LOG_BASE, LOG_ALL, VHOST_VRING_F_LOG), and collect the log every 100 ms as its passes do: what logging costs tapgro")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := run(*sock, *tapName, *addr, *mtu, *num, *rxBuf, *wait, *tso, *queues, *migLog); err != nil {
		fmt.Fprintln(os.Stderr, "vhostrelay:", err)
		return 1
	}
	return 0
}

// progTB is vhostusertest.TB for a program: a failure ends the process, and the
// process's exit is the cleanup (the kernel closes the socket, which ends tapgro's
// session, and the memfd, the eventfds and the TAP). Running the double's cleanups
// instead would unmap guest RAM under the goroutine of the other direction.
type progTB struct{}

func (progTB) Helper()                        {}
func (progTB) Cleanup(func())                 {}
func (progTB) Error(args ...any)              { fmt.Fprintln(os.Stderr, append([]any{"vhostrelay:"}, args...)...) }
func (t progTB) Fatal(args ...any)            { t.Error(args...); os.Exit(1) }
func (t progTB) Fatalf(f string, args ...any) { t.Fatal(fmt.Sprintf(f, args...)) }

// counters are what the relay reports at exit, to tell a row's shortfall that is ours
// from one that is tapgro's.
type counters struct {
	rxFrames, rxBytes, rxMulti, rxTAPErr atomic.Uint64 // guest RX → our TAP
	txFrames, txBytes, txTrunc           atomic.Uint64 // our TAP → guest TX
	kicksRX, kicksTX, sleepsRX, sleepsTX atomic.Uint64
	txRingFull                           atomic.Uint64
}

func (c *counters) String() string {
	return fmt.Sprintf("to TAP: %d frames %d bytes (%d over several buffers, %d refused by the TAP); from TAP: %d frames %d bytes (%d truncated); "+
		"kicks rx %d tx %d; sleeps on calls rx %d tx %d; TX ring full %d",
		c.rxFrames.Load(), c.rxBytes.Load(), c.rxMulti.Load(), c.rxTAPErr.Load(),
		c.txFrames.Load(), c.txBytes.Load(), c.txTrunc.Load(),
		c.kicksRX.Load(), c.kicksTX.Load(), c.sleepsRX.Load(), c.sleepsTX.Load(), c.txRingFull.Load())
}

func run(sock, tapName, addr string, mtu, num, rxBuf int, wait time.Duration, tso bool, queues int, migLog bool) error {
	if sock == "" || addr == "" {
		return errors.New("-connect and -addr are required")
	}
	var pfxs []netip.Prefix
	for _, a := range strings.Split(addr, ",") {
		pfx, err := netip.ParsePrefix(a)
		if err != nil {
			return err
		}
		pfxs = append(pfxs, pfx)
	}
	if rxBuf < hdrLen+14 || rxBuf > slotSize {
		return fmt.Errorf("-rx-buf %d: want %d..%d", rxBuf, hdrLen+14, slotSize)
	}
	if num < 2 || num > 32768 || num&(num-1) != 0 {
		return fmt.Errorf("-num %d: want a power of two up to 32768 (virtio spec \"Virtqueues\")", num)
	}
	if queues < 1 || queues > 0x8000 {
		return fmt.Errorf("-queues %d: want 1..32768 (virtio spec \"Device configuration layout\", max_virtqueue_pairs)", queues)
	}
	// One TAP queue per pair; the header length and offloads are device-wide, set once
	// below through the first queue (tapdev.OpenQueues).
	taps, err := tapdev.OpenQueues(tapdev.Config{Name: tapName, VnetHdrLen: hdrLen}, queues)
	if err != nil {
		return err
	}
	tap := taps[0]
	if err := tap.ConfigureLink(tapdev.LinkConfig{MTU: mtu, Addrs: pfxs, Up: true}); err != nil {
		return err
	}
	// tapgro binds its socket once its TAP is up; the benchmark may start us first.
	for deadline := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no socket at %s after %v", sock, wait)
		}
	}
	// Guest RAM: both rings' slots (slotSize each) plus the rings and the layout's
	// first 1 MiB, with room to spare.
	mem := uint64(2*queues*num*slotSize) + 16<<20
	ack := uint64(ackWanted)
	if queues > 1 {
		// A multiqueue guest acks MQ (virtio spec "Automatic receive steering in
		// multiqueue mode"); with vhost-user the front-end enables the pairs with
		// SET_VRING_ENABLE, which the double sends for every ring.
		ack |= 1 << virtio.NetMQ
	}
	s := vhostusertest.Dial(progTB{}, sock, vhostusertest.Options{Ack: ack, Pairs: queues, Num: num, MemSize: mem, TXSlot: slotSize, RXSlot: slotSize,
		ConnectWait: 5 * time.Second}) // the socket file appears at bind, before listen
	for _, b := range []uint{virtio.Version1, virtio.RingEventIdx} {
		if !s.Has(b) {
			return fmt.Errorf("tapgro did not offer virtio feature %d (offered %#x); the relay needs VERSION_1 and EVENT_IDX", b, s.Offered)
		}
	}
	// What we hand tapgro it must accept from a guest: NEEDS_CSUM with CSUM, TCP GSO with
	// HOST_TSO4/6 (virtio spec "Packet Transmission"). Our TAP produces only those.
	var want vnethdr.Offloads
	if s.Has(virtio.NetCsum) {
		want |= vnethdr.OffloadCSUM
		if tso && s.Has(virtio.NetHostTSO4) {
			want |= vnethdr.OffloadTSO4
		}
		if tso && s.Has(virtio.NetHostTSO6) {
			want |= vnethdr.OffloadTSO6
		}
	}
	eff, err := tap.SetOffloads(want)
	if err != nil {
		return err
	}
	if queues > 1 && !s.Has(virtio.NetMQ) {
		return fmt.Errorf("-queues %d: tapgro did not offer MQ (offered %#x)", queues, s.Offered)
	}
	fmt.Fprintf(os.Stderr, "vhostrelay: %s on %s: acked %#x of %#x, TAP offloads %s, %d queue pair(s), ring %d, RX buffers %d B\n",
		tap.Name(), sock, s.Acked, s.Offered, eff, queues, num, rxBuf)

	// Logging is turned on before the relays start: StartLog talks to tapgro on the
	// socket, which watch reads from then on.
	var pages atomic.Uint64
	if migLog {
		l := s.StartLog()
		go func() {
			for range time.Tick(100 * time.Millisecond) {
				pages.Add(uint64(len(l.Collect())))
			}
		}()
		defer func() { fmt.Fprintf(os.Stderr, "vhostrelay: dirty log: %d pages collected\n", pages.Load()) }()
	}

	// Counters per pair, so that goroutines of different pairs share no cache lines.
	rs := make([]*relay, queues)
	errc := make(chan error, 2*queues+1)
	for p := range rs {
		r := &relay{s: s, tap: taps[p], pair: p, mrg: s.Has(virtio.NetMrgRxbuf)}
		rs[p] = r
		go func() { errc <- r.guestRX(rxBuf) }()
		go func() { errc <- r.guestTX() }()
	}
	go func() { errc <- watch(s.FE.FD) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err = <-errc:
	case <-sig:
	}
	// One pair keeps the line TestVhostRelay parses; more name their pair.
	for _, r := range rs {
		if len(rs) == 1 {
			fmt.Fprintf(os.Stderr, "vhostrelay: %v\n", &r.c)
		} else {
			fmt.Fprintf(os.Stderr, "vhostrelay: pair %d: %v\n", r.pair, &r.c)
		}
	}
	return err
}

// watch returns when tapgro ends the session (end of file on the socket; it sends
// nothing unasked once the rings run), so that a relay whose back-end is gone exits
// and its benchmark row fails instead of idling.
func watch(fd int) error {
	var b [64]byte
	for {
		n, err := unix.Read(fd, b[:])
		switch {
		case err == unix.EINTR || err == unix.EAGAIN: // EAGAIN: the double's SO_RCVTIMEO
			continue
		case err != nil:
			return fmt.Errorf("vhost-user socket: %w", err)
		case n == 0:
			return errors.New("tapgro closed the vhost-user session")
		default:
			return fmt.Errorf("unexpected %d-byte message from tapgro", n)
		}
	}
}

type relay struct {
	s    *vhostusertest.Session
	tap  *tapdev.Device // this pair's TAP queue
	pair int
	mrg  bool
	c    counters
}

// fenceWord is touched by fence only.
var fenceWord atomic.Uint32

// fence is a full barrier between a plain store (used_event, which the double writes
// as two bytes) and the following load of used->idx: a read-modify-write atomic is a
// locked instruction on amd64, which orders the store before the load. Without it the
// driver can miss the device's update and the device the new used_event, and both
// sleep (virtio spec "Driver Requirements: Virtqueue Notification Suppression"; Linux
// virtqueue_enable_cb_prepare_split + virtqueue_poll, with virtio_mb between).
func fence() { fenceWord.Add(1) }

// caller sleeps on a ring's call eventfd through the runtime poller: a parked
// goroutine, not a thread stuck in poll(2).
type caller struct {
	f   *os.File
	buf [8]byte
}

func newCaller(ring *vhostusertest.Ring) (*caller, error) {
	fd, err := unix.Dup(ring.Call)
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(fd)
	return &caller{f: os.NewFile(uintptr(fd), "call")}, nil // EFD_NONBLOCK: poller-driven
}

// sleepUntilUsed waits until ring's used->idx moves past seen, asking tapgro for a call
// there first (used_event = seen: notify when an entry past seen is published).
func (c *caller) sleepUntilUsed(ring *vhostusertest.Ring, seen uint16) error {
	ring.SetUsedEvent(seen)
	fence()
	if ring.UsedIdx() != seen {
		return nil
	}
	_, err := c.f.Read(c.buf[:])
	return err
}

// guestRX moves what tapgro put in the RX ring to our TAP and reposts the buffers.
func (r *relay) guestRX(bufLen int) error {
	ring := r.s.RX(r.pair)
	call, err := newCaller(ring)
	if err != nil {
		return err
	}
	// Every chain one descriptor of bufLen bytes in its head's slot, posted once and
	// then reposted as it is.
	heads := ring.PostRX(ring.Num, bufLen, 1)
	bufs := make([][]byte, ring.Num)
	for _, h := range heads {
		bufs[h] = r.s.G.At(ring.Slot(h), bufLen)
	}
	kickOld := uint16(0)
	r.kick(ring, &kickOld, &r.c.kicksRX)
	repost := make([]uint16, 0, ring.Num)
	iov := make([][]byte, 0, ring.Num)
	var seen uint16
	for {
		idx := ring.UsedIdx()
		if idx == seen {
			if len(repost) > 0 {
				ring.Republish(repost)
				repost = repost[:0]
				r.kick(ring, &kickOld, &r.c.kicksRX)
			}
			r.c.sleepsRX.Add(1)
			if err := call.sleepUntilUsed(ring, seen); err != nil {
				return err
			}
			continue
		}
		for seen != idx {
			u := ring.UsedAt(seen)
			if int(u.ID) >= ring.Num || bufs[u.ID] == nil || int(u.Len) > bufLen || u.Len < hdrLen {
				return fmt.Errorf("RX used entry %d: id %d len %d is not a chain we posted", seen, u.ID, u.Len)
			}
			nb := 1
			if r.mrg {
				nb = int(binary.LittleEndian.Uint16(bufs[u.ID][10:]))
				if nb < 1 || nb > ring.Num {
					return fmt.Errorf("RX used entry %d: num_buffers %d", seen, nb)
				}
			}
			if uint16(nb) > idx-seen {
				// tapgro publishes a frame's chains with one used->idx store, so this
				// is a device bug or a torn read; look again.
				if idx = ring.UsedIdx(); uint16(nb) > idx-seen {
					return fmt.Errorf("RX: frame of %d buffers with %d published", nb, idx-seen)
				}
			}
			iov = iov[:0]
			n := 0
			for k := range uint16(nb) {
				u := ring.UsedAt(seen + k)
				if int(u.ID) >= ring.Num || bufs[u.ID] == nil || int(u.Len) > bufLen {
					return fmt.Errorf("RX used entry %d: id %d len %d is not a chain we posted", seen+k, u.ID, u.Len)
				}
				iov = append(iov, bufs[u.ID][:u.Len])
				repost = append(repost, u.ID)
				n += int(u.Len)
			}
			seen += uint16(nb)
			if nb > 1 {
				r.c.rxMulti.Add(1)
			}
			// The header goes as it is: our TAP's is the guest's 12 bytes, and the kernel
			// skips num_buffers (drivers/net/tun_vnet.h tun_vnet_hdr_get).
			if _, err := r.tap.Writev(iov); err != nil {
				if errors.Is(err, os.ErrClosed) {
					return err
				}
				r.c.rxTAPErr.Add(1) // EINVAL (header refused) or EIO (link down): dropped
				continue
			}
			r.c.rxFrames.Add(1)
			r.c.rxBytes.Add(uint64(n - hdrLen))
		}
		clear(iov[:cap(iov)])
		// Repost per batch rather than per frame, but before looking for more, so that
		// tapgro never runs short while we work (it stalls with too few buffers).
		ring.Republish(repost)
		repost = repost[:0]
		r.kick(ring, &kickOld, &r.c.kicksRX)
	}
}

// guestTX reads our TAP into TX chains for tapgro.
func (r *relay) guestTX() error {
	ring := r.s.TX(r.pair)
	call, err := newCaller(ring)
	if err != nil {
		return err
	}
	// Head h is descriptor h with slot h; tapgro's used entries give them back.
	iovs := make([][][]byte, ring.Num)
	free := make([]uint16, 0, ring.Num)
	for h := ring.Num - 1; h >= 0; h-- {
		iovs[h] = [][]byte{r.s.G.At(ring.Slot(uint16(h)), slotSize)}
		free = append(free, uint16(h))
	}
	var one [1]uint16
	kickOld := ring.AvailIdx()
	var seen uint16
	for {
		for idx := ring.UsedIdx(); seen != idx; seen++ {
			u := ring.UsedAt(seen)
			if int(u.ID) >= ring.Num || len(free) == ring.Num {
				return fmt.Errorf("TX used entry %d: id %d is not an outstanding chain", seen, u.ID)
			}
			free = append(free, u.ID)
		}
		if len(free) == 0 {
			r.kick(ring, &kickOld, &r.c.kicksTX)
			r.c.txRingFull.Add(1)
			r.c.sleepsTX.Add(1)
			if err := call.sleepUntilUsed(ring, seen); err != nil {
				return err
			}
			continue
		}
		h := free[len(free)-1]
		n, err := r.tap.TryReadv(iovs[h])
		switch {
		case err == nil:
		case errors.Is(err, tapdev.ErrWouldBlock):
			// Everything read so far is published; make sure tapgro knows, then wait.
			r.kick(ring, &kickOld, &r.c.kicksTX)
			if err := r.tap.WaitReadable(); err != nil {
				return err
			}
			continue
		case errors.Is(err, tapdev.ErrTruncated):
			r.c.txTrunc.Add(1) // cannot happen with slotSize slots
			continue
		default:
			return err
		}
		free = free[:len(free)-1]
		vhostusertest.PutDesc(ring.Desc[16*int(h):], ring.Slot(h), uint32(n), 0, 0)
		one[0] = h
		ring.Republish(one[:])
		r.c.txFrames.Add(1)
		r.c.txBytes.Add(uint64(n - hdrLen))
		// Publish every frame at once (a busy tapgro picks it up without a kick), but
		// kick only when tapgro asked: Linux virtqueue_kick_prepare_split.
		r.kick(ring, &kickOld, &r.c.kicksTX)
	}
}

// kick notifies tapgro if the avail idx moved past the avail_event it last wrote since
// the previous decision at *old (EVENT_IDX; Linux virtqueue_kick_prepare_split). The
// double's Republish stores avail->idx with an atomic exchange, the full barrier needed
// before reading avail_event.
func (r *relay) kick(ring *vhostusertest.Ring, old *uint16, n *atomic.Uint64) {
	nw := ring.AvailIdx()
	if nw == *old {
		return
	}
	if vhostusertest.NeedEvent(ring.AvailEvent(), nw, *old) {
		ring.KickNow()
		n.Add(1)
	}
	*old = nw
}
