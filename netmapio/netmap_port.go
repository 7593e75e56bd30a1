package netmapio

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"tapgro/port"
	"tapgro/vnethdr"
)

// NetmapPort is a Port on a netmap port: a VALE switch port (vale0:1), a NIC in netmap
// mode (netmap:eth0) or a netmap pipe. Frames move through the shared rings with one
// NIOCRXSYNC per read batch and one NIOCTXSYNC per write batch; a frame larger than a
// ring buffer spans several slots chained with NS_MOREFRAG (netmap sys/net/netmap.h). On a
// VALE port with a virtio-net header length set (10 or 12), every frame carries that header
// and GSO frames cross the switch whole.
//
// The port waits in the Go netpoller: /dev/netmap implements poll, and since netmap
// registers its wait queues unconditionally on Linux, epoll works on it (netmap issue
// #171, fixed in 2017). All shared-memory access happens inside RawConn callbacks, which
// hold a reference on the file, so Close (which waits for those references to drop)
// can unmap the region safely.
type NetmapPort struct {
	port.Base
	f      *os.File
	rc     syscall.RawConn
	core   *nmCore
	hdrLen int
	vale   bool
	nst    *NetmapStats

	// setHdr changes the VALE port's header length (NETMAP_REQ_PORT_HDR_SET); nil when
	// the port is not a VALE port. started forbids it once the datapath runs.
	setHdr  func(n int) error
	started atomic.Bool

	// Reader state.
	rbufs  [][]byte
	rsizes []int
	rn     int
	rerr   error
	readFn func(fd uintptr) bool

	// Writer state.
	wframes [][]byte
	wn      int
	werr    error
	tryFn   func(fd uintptr)
	wok     bool
	waitFn  func(fd uintptr) bool
}

var (
	_ port.Port        = (*NetmapPort)(nil)
	_ port.BatchSender = (*NetmapPort)(nil)
)

// nmCloser closes the file (waiting for every RawConn callback to return) and then
// releases the mapping.
type nmCloser struct {
	f       *os.File
	release func() error
}

func (c nmCloser) Close() error {
	err := c.f.Close()
	if c.release != nil {
		if rerr := c.release(); err == nil {
			err = rerr
		}
	}
	return err
}

// newNetmapPort wraps a registered port. f is the pollable file whose readiness follows
// the rings (the /dev/netmap fd; the model's eventfd in tests), release unmaps the region
// after f is closed.
func newNetmapPort(f *os.File, core *nmCore, peer string, vale bool, release func() error, st *port.Stats) (*NetmapPort, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	p := &NetmapPort{f: f, rc: rc, core: core, hdrLen: core.hdrLen, vale: vale, nst: core.nst}
	p.Base = port.NewBase(nmCloser{f, release}, peer, st)
	core.st = p.Stats()
	p.readFn = p.readOnce
	p.tryFn = p.tryOnce
	p.waitFn = p.waitOnce
	return p, nil
}

// VnetHdrLen is the VALE port's virtio-net header length (0, 10 or 12).
func (p *NetmapPort) VnetHdrLen() int { return p.hdrLen }

// Accepts is what a VALE peer may be handed when the port carries a header: checksum
// offload and TCP/UDP segmentation offload. VALE passes frames between ports of equal
// header length untouched and segments in software for ports without one (netmap
// sys/dev/netmap/netmap_vale.c bdg_mismatch_datapath); UFO is included as QEMU does ("a
// netmap interface that supports virtio-net headers always supports UFO", QEMU
// net/netmap.c). USO is not: QEMU's netmap backend has no has_uso, so no guest behind it
// negotiates USO, and VALE's software segmentation has no UDP_L4 case.
func (p *NetmapPort) Accepts() vnethdr.Offloads {
	if p.hdrLen == 0 {
		return 0
	}
	return vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN | vnethdr.OffloadUFO
}

// NetmapStats returns the netmap-specific counters (shared with the Endpoint's other ports).
func (p *NetmapPort) NetmapStats() *NetmapStats { return p.nst }

// HasVnetHdrLen reports whether the port can switch to header length n: 0, 10 or 12 on a
// VALE port, 0 elsewhere.
func (p *NetmapPort) HasVnetHdrLen(n int) bool {
	return n == 0 || (p.vale && (n == vnethdr.Len || n == vnethdr.LenMrgRxbuf))
}

// HasUFO is whether the port takes a vnet header (a VALE port), by QEMU's rule
// (net/netmap.c uses netmap_has_vnet_hdr as has_ufo).
func (p *NetmapPort) HasUFO() bool { return p.vale }

// HasUSO is false: see Accepts.
func (p *NetmapPort) HasUSO() bool { return false }

// SetVnetHdrLen changes the VALE port's header length (NETMAP_REQ_PORT_HDR_SET) and
// drops the frames already received with the old one. It is for negotiation before the
// datapath starts: after the first ReadBatch or write it returns an error, because frames
// in flight would be read with the wrong header.
func (p *NetmapPort) SetVnetHdrLen(n int) error {
	if !p.HasVnetHdrLen(n) {
		return fmt.Errorf("netmap: %s cannot carry a %d-byte vnet header (want 0, 10 or 12 on a VALE port)", p.Peer(), n)
	}
	if n == p.hdrLen {
		return nil
	}
	if p.started.Load() || p.setHdr == nil {
		return fmt.Errorf("netmap: %s: the header length can only change before the first read or write", p.Peer())
	}
	var err error
	if cerr := p.rc.Control(func(uintptr) {
		if err = p.setHdr(n); err == nil {
			p.hdrLen, p.core.hdrLen = n, n
			err = p.core.drain()
		}
	}); cerr != nil {
		return p.ioErr("set header length", cerr)
	}
	return err
}

// ReadBatch blocks in the netpoller until at least one complete frame is in an RX ring,
// then copies out up to len(bufs) frames (each with the vnet header, if any). Slots are
// handed back to the kernel at the next read. A multi-slot frame cut at tail stays in the
// ring until its last slot arrives.
func (p *NetmapPort) ReadBatch(bufs [][]byte, sizes []int) (int, error) {
	if min(len(bufs), len(sizes)) == 0 {
		return 0, nil
	}
	p.started.Store(true)
	p.rbufs, p.rsizes, p.rn, p.rerr = bufs, sizes, 0, nil
	err := p.rc.Read(p.readFn)
	p.rbufs, p.rsizes = nil, nil
	if err == nil {
		err = p.rerr
	}
	if err != nil {
		return 0, p.ioErr("receive", err)
	}
	return p.rn, nil
}

func (p *NetmapPort) readOnce(uintptr) bool {
	p.rn, p.rerr = p.core.read(p.rbufs, p.rsizes)
	return p.rn > 0 || p.rerr != nil
}

// SetReadDeadline implements Port.
func (p *NetmapPort) SetReadDeadline(t time.Time) error { return p.f.SetReadDeadline(t) }

// Pending implements Port: a complete frame is already visible in an RX ring.
func (p *NetmapPort) Pending() bool { return p.core.pending }

// WriteBatch copies frames into TX ring 0 and syncs once per batch, waiting in the
// netpoller while the ring is full. A frame that needs more slots than one packet may
// span (64, or the ring size) is dropped and counted in NetmapStats.TxTooBig, and counts
// as handled; a frame outside [MinFrame, MaxFrame] (plus the header) stops the batch with
// a *FrameError.
func (p *NetmapPort) WriteBatch(frames [][]byte) (int, error) {
	done := 0
	for done < len(frames) {
		n, err := p.TryWriteBatch(frames[done:])
		done += n
		if err == port.ErrWouldBlock {
			p.Stats().WriteWaits.Add(1)
			if err = p.WaitWritable(time.Time{}); err == nil {
				continue
			}
		}
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// TryWriteBatch implements BatchSender: frames go out whole until the TX ring has no
// room for the next one, then it returns port.ErrWouldBlock. A frame is never written in part.
func (p *NetmapPort) TryWriteBatch(frames [][]byte) (int, error) {
	if len(frames) == 0 {
		return 0, nil
	}
	p.started.Store(true)
	p.wframes, p.wn, p.werr = frames, 0, nil
	err := p.rc.Control(p.tryFn)
	p.wframes = nil
	if err != nil {
		return 0, p.ioErr("send", err)
	}
	switch err := p.werr; {
	case err == nil:
		return p.wn, nil
	case err == errNoRoom:
		return p.wn, port.ErrWouldBlock
	case errors.As(err, new(*port.FrameError)):
		return p.wn, err
	default:
		return p.wn, p.ioErr("send", err)
	}
}

func (p *NetmapPort) tryOnce(uintptr) { p.wn, p.werr = p.core.write(p.wframes) }

// WaitWritable implements BatchSender: it blocks until the TX ring has room for the frame
// that last did not fit.
func (p *NetmapPort) WaitWritable(deadline time.Time) error {
	if !deadline.IsZero() {
		if err := p.f.SetWriteDeadline(deadline); err != nil {
			return p.ioErr("wait", err)
		}
		defer p.f.SetWriteDeadline(time.Time{})
	}
	p.werr = nil
	err := p.rc.Write(p.waitFn)
	if err == nil {
		err = p.werr
	}
	if err != nil {
		return p.ioErr("wait for TX room", err)
	}
	return nil
}

func (p *NetmapPort) waitOnce(uintptr) bool {
	p.wok, p.werr = p.core.writable()
	return p.wok || p.werr != nil
}

// Room implements BatchSender: free TX slots times the buffer size, and the ring's
// capacity, as of the last sync.
func (p *NetmapPort) Room() (free, size int) { return p.core.room() }

// ioErr maps errors after Close to port.ErrClosed and leaves deadlines alone; anything else
// ends the port.
func (p *NetmapPort) ioErr(op string, err error) error {
	switch {
	case p.Closed() || errors.Is(err, os.ErrClosed):
		return port.ErrClosed
	case errors.Is(err, os.ErrDeadlineExceeded):
		return err
	}
	return p.Fail(fmt.Errorf("netmapio: %s on %s: %w", op, p.Peer(), err))
}
