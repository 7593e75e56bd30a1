//go:build linux

package vhostusertest

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

// One connection: QEMU 7.2's message sequence up to running rings, and its end.

// Options shape a Session. Zero values are QEMU 7.2's defaults.
type Options struct {
	Ack      uint64              // guest-acked virtio bits; 0 = everything offered (minus bit 30)
	AckMask  uint64              // bits removed from Ack (applied after the default)
	Pairs    int                 // queue pairs, 1
	Num      int                 // ring size, 256
	MemSize  uint64              // guest RAM, 64 MiB
	Layout   []vuproto.MemRegion // nil: MeasuredLayout(MemSize)
	Guest    *Guest              // reuse guest RAM (a reconnect)
	TXSlot   int                 // bytes per TX chain slot, 64 KiB + 4 KiB; -1: none (the test lays out buffers)
	RXSlot   int                 // bytes per RX chain slot, 64 KiB + 4 KiB; -1: none
	MTU      uint64              // NET_SET_MTU if the backend offers it and F_MTU is acked; 1500
	NoEnable bool                // no SET_VRING_ENABLE
	SkipKick bool                // stop before SET_VRING_KICK
	// ConnectWait is how long Dial retries a socket that is not listening yet: a
	// back-end's socket file exists from bind(2) on, and a connect before its listen(2)
	// is refused. 0: one attempt.
	ConnectWait time.Duration
}

// Session is one connection from the front-end double.
type Session struct {
	tb      TB
	FE      *Frontend
	G       *Guest
	Rings   []*Ring
	Offered uint64 // GET_FEATURES
	Acked   uint64 // SET_FEATURES, bit 30 included
	done    chan error
	closed  bool
}

// Start connects a socketpair to serve (run in its own goroutine, typically a
// vhostuser.Backend's Serve) and runs QEMU 7.2's sequence up to running rings: connect,
// device reset, DRIVER_OK. It ends with a GET_FEATURES round trip (QEMU's own sync), so
// once it returns every Handler.RingStarted has returned.
func Start(tb TB, serve func(*net.UnixConn) error, o Options) *Session {
	tb.Helper()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	file := os.NewFile(uintptr(sp[1]), "backend")
	c, err := net.FileConn(file)
	file.Close()
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve(c.(*net.UnixConn)) }()
	return run(tb, sp[0], done, o)
}

// Dial connects to a back-end listening on the UNIX socket path (QEMU as the client,
// -chardev socket,path=…) and runs Start's sequence. Close then reports nil.
func Dial(tb TB, path string, o Options) *Session {
	tb.Helper()
	var fd int
	for deadline := time.Now().Add(o.ConnectWait); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if fd, err = unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			tb.Fatal(err)
		}
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: path})
		if err == nil {
			break
		}
		unix.Close(fd)
		if (err != unix.ECONNREFUSED && err != unix.ENOENT) || time.Now().After(deadline) {
			tb.Fatalf("connect %s: %v", path, err)
		}
	}
	done := make(chan error, 1)
	done <- nil
	return run(tb, fd, done, o)
}

// Over runs Start's sequence on fd, one end of a connection whose back-end is served
// elsewhere (another process, handed the other end): Session takes fd over.
func Over(tb TB, fd int, o Options) *Session {
	tb.Helper()
	done := make(chan error, 1)
	done <- nil
	return run(tb, fd, done, o)
}

func run(tb TB, fd int, done chan error, o Options) *Session {
	if o.Pairs == 0 {
		o.Pairs = 1
	}
	if o.Num == 0 {
		o.Num = 256
	}
	if o.MemSize == 0 {
		o.MemSize = 64 << 20
	}
	if o.TXSlot == 0 {
		o.TXSlot = 68 << 10
	}
	if o.RXSlot == 0 {
		o.RXSlot = 68 << 10
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	tv := unix.Timeval{Sec: 20}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	s := &Session{tb: tb, FE: &Frontend{tb, fd}, done: done}
	tb.Cleanup(func() {
		if !s.closed {
			s.Close()
		}
	})
	s.G = o.Guest
	if s.G == nil {
		s.G = NewGuest(tb, o.MemSize, o.Layout)
	}
	fe := s.FE
	nrings := 2 * o.Pairs
	for i := 0; i < nrings; i++ {
		slot := o.TXSlot
		if i%2 == 0 {
			slot = o.RXSlot
		}
		s.Rings = append(s.Rings, NewRing(s.G, i, o.Num, max(slot, 0)))
	}

	// Step 1, connect (vhost_user_backend_init, vhost_dev_init).
	offered := fe.Get(vuproto.ReqGetFeatures)
	s.Offered = offered
	if offered&(1<<virtio.VhostUserProtocolFeatures) == 0 {
		tb.Fatalf("GET_FEATURES %#x lacks bit 30", offered)
	}
	var proto uint64
	for pair := 0; pair < o.Pairs; pair++ {
		if pair > 0 {
			fe.Get(vuproto.ReqGetFeatures)
		}
		proto = fe.Get(vuproto.ReqGetProtocolFeatures)
		// QEMU 7.2 keeps offered ∩ bits 0–16, minus F_CONFIG for net.
		fe.Send(vuproto.ReqSetProtocolFeatures, vuproto.FlagVersion, U64(proto&0x1ffff&^(1<<9)))
		if pair == 0 {
			if proto&(1<<vuproto.ProtoMQ) != 0 {
				if q := fe.Get(vuproto.ReqGetQueueNum); q < uint64(o.Pairs) {
					tb.Fatalf("GET_QUEUE_NUM %d, want ≥ %d", q, o.Pairs)
				}
			}
			fe.Send(vuproto.ReqSetOwner, vuproto.FlagVersion, nil)
		}
		fe.Get(vuproto.ReqGetFeatures)
		for _, i := range []int{2 * pair, 2*pair + 1} {
			// QEMU's masked notifier, not the guest's: a throwaway eventfd.
			efd, _ := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
			fe.Send(vuproto.ReqSetVringCall, vuproto.FlagVersion, U64(uint64(i)), efd)
			unix.Close(efd)
			fe.Send(vuproto.ReqSetVringErr, vuproto.FlagVersion, U64(uint64(i)), s.Rings[i].Err)
		}
	}
	// Step 2, device reset and feature writes: enable, repeated.
	if !o.NoEnable {
		for rep := 0; rep < 2; rep++ {
			for i := 0; i < nrings; i++ {
				fe.Send(vuproto.ReqSetVringEnable, vuproto.FlagVersion, State(uint32(i), 1))
			}
		}
	}
	// Step 3, DRIVER_OK (vhost_net_start).
	ack := o.Ack
	if ack == 0 {
		// QEMU acks VHOST_F_LOG_ALL only while it migrates (StartLog).
		ack = offered &^ (1<<virtio.VhostUserProtocolFeatures | 1<<virtio.LogAll)
	}
	ack &= offered &^ o.AckMask
	if ack&(1<<virtio.NetMTU) != 0 && proto&(1<<vuproto.ProtoNetMTU) != 0 {
		if r := fe.Ack(vuproto.ReqNetSetMTU, U64(o.MTU)); r != 0 {
			tb.Fatalf("NET_SET_MTU ack %d", r)
		}
	}
	if !o.NoEnable {
		for i := 0; i < nrings; i++ {
			fe.Send(vuproto.ReqSetVringEnable, vuproto.FlagVersion, State(uint32(i), 1))
		}
	}
	s.Acked = ack | 1<<virtio.VhostUserProtocolFeatures
	fe.Send(vuproto.ReqSetFeatures, vuproto.FlagVersion, U64(s.Acked))
	// SET_MEM_TABLE: flags 0x9 always in 7.2, one fd per region (the same memfd).
	fds := make([]int, len(s.G.Regions))
	for i := range fds {
		fds[i] = s.G.FD
	}
	if r := fe.Ack(vuproto.ReqSetMemTable, MemTablePayload(s.G.Regions), fds...); r != 0 {
		tb.Fatalf("SET_MEM_TABLE ack %d", r)
	}
	for i, r := range s.Rings {
		fe.Send(vuproto.ReqSetVringNum, vuproto.FlagVersion, State(uint32(i), uint32(o.Num)))
		fe.Send(vuproto.ReqSetVringBase, vuproto.FlagVersion, State(uint32(i), 0))
		fe.Send(vuproto.ReqSetVringAddr, vuproto.FlagVersion, AddrPayload(r))
		if o.SkipKick {
			continue
		}
		fe.Send(vuproto.ReqSetVringKick, vuproto.FlagVersion, U64(uint64(i)), r.Kick)
		fe.Send(vuproto.ReqSetVringCall, vuproto.FlagVersion, U64(uint64(i)), r.Call)
	}
	fe.Get(vuproto.ReqGetFeatures)
	return s
}

// RX is the receive ring of pair p; TX its transmit ring.
func (s *Session) RX(p int) *Ring { return s.Rings[2*p] }

// TX is the transmit ring of pair p.
func (s *Session) TX(p int) *Ring { return s.Rings[2*p+1] }

// Has reports whether virtio bit b was acked.
func (s *Session) Has(b uint) bool { return s.Acked&(1<<b) != 0 }

// HdrLen is the virtio-net header length the acked features imply.
func (s *Session) HdrLen() int {
	if s.Has(virtio.Version1) || s.Has(virtio.NetMrgRxbuf) {
		return 12
	}
	return 10
}

// Stop is step 4: GET_VRING_BASE per ring; it returns the bases.
func (s *Session) Stop() []uint32 {
	var out []uint32
	for i := range s.Rings {
		s.FE.Send(vuproto.ReqGetVringBase, vuproto.FlagVersion, State(uint32(i), 0))
		p := s.FE.Reply(vuproto.ReqGetVringBase, 8)
		if binary.LittleEndian.Uint32(p) != uint32(i) {
			s.tb.Fatalf("GET_VRING_BASE reply index %d", binary.LittleEndian.Uint32(p))
		}
		out = append(out, binary.LittleEndian.Uint32(p[4:]))
	}
	return out
}

// Close ends the session from the front-end's side (QEMU exiting) and returns what the
// serving function returned.
func (s *Session) Close() error {
	if s.closed {
		return fmt.Errorf("vhostusertest: closed twice")
	}
	s.closed = true
	unix.Shutdown(s.FE.FD, unix.SHUT_RDWR)
	defer unix.Close(s.FE.FD)
	select {
	case err := <-s.done:
		return err
	case <-time.After(10 * time.Second):
		s.tb.Error("vhostusertest: session did not end")
		return fmt.Errorf("vhostusertest: session did not end")
	}
}
