package sockport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/rawsys"
	"tapgro/vnethdr"
)

const (
	// maxDgramBatch is how many datagrams one recvmmsg/sendmmsg moves.
	maxDgramBatch = 512

	// dgramSendWait bounds how long WriteBatch waits for a datagram socket that keeps
	// answering EAGAIN. For UDP that is our own send buffer and the wait always ends; for
	// unconnected AF_UNIX datagrams it is the receiver's queue, whose draining may never
	// wake our socket, so after this long the rest of the batch is dropped and counted
	// instead of wedging the pipeline (a proxy stuck on one path while still alive is
	// containers/gvisor-tap-vsock#648).
	dgramSendWait = 100 * time.Millisecond
)

// DgramPort is a port.Port over a datagram socket (*net.UDPConn, or a *net.UnixConn of type
// unixgram): one Ethernet frame per datagram, no prefix, no vnet header (QEMU net/dgram.c,
// net/socket.c). It receives from any source, as QEMU does, and sends to one fixed remote
// address. Datagrams outside [port.MinFrame, port.MaxFrame] are dropped and counted, never fatal.
type DgramPort struct {
	port.Base
	conn     net.Conn
	rc       syscall.RawConn
	sendWait time.Duration // dgramSendWait; tests whose reader may be starved raise it

	dst    [unix.SizeofSockaddrAny]byte // raw sockaddr of the remote, built once
	dstLen uint32

	// Reader state (ReadBatch goroutine).
	rmsgs       [maxDgramBatch]unix.Mmsghdr
	riov        [maxDgramBatch]unix.Iovec
	rWant, rGot int
	rErr        error
	readFn      func(fd uintptr) bool

	// Writer state (WriteBatch goroutine). Msghdr names and iovec pointers are set up
	// once; a batch only fills in iovec bases and lengths.
	wmsgs      [maxDgramBatch]unix.Mmsghdr
	wiov       [2 * maxDgramBatch]unix.Iovec // two per message: wmsgs[i] uses wiov[2i:2i+2]
	wIdx, wEnd int                           // wmsgs[wIdx:wEnd] is still to be sent
	wErr       error                         // errno that ended the current sendmmsg loop
	wBlock     bool                          // EAGAIN waits in the poller (true) or returns to send (false)
	wAgain     bool                          // the last writeFn run stopped on EAGAIN
	writeFn    func(fd uintptr) bool
	waiter     *writeWaiter
	room       *sockRoom
	peerFull   int // consecutive WaitWritable calls that found our own socket writable
}

var (
	_ port.Port        = (*DgramPort)(nil)
	_ port.BatchSender = (*DgramPort)(nil)
	_ port.VecSender   = (*DgramPort)(nil)
)

// NewDgramPort wraps a bound datagram socket. remote is where frames go: a *net.UDPAddr
// for a UDP socket, a *net.UnixAddr for a unixgram socket. st may be nil.
// The port.Port owns c from now on: Close closes it.
func NewDgramPort(c net.Conn, remote net.Addr, st *port.Stats) (*DgramPort, error) {
	rc, err := rawConn(c)
	if err != nil {
		return nil, err
	}
	p := &DgramPort{conn: c, rc: rc, sendWait: dgramSendWait}
	switch c := c.(type) {
	case *net.UDPConn:
		ra, ok := remote.(*net.UDPAddr)
		if !ok {
			return nil, fmt.Errorf("sockport: UDP port needs a *net.UDPAddr remote, got %T", remote)
		}
		var local unix.Sockaddr
		var gerr error
		if err := rc.Control(func(fd uintptr) { local, gerr = unix.Getsockname(int(fd)) }); err != nil {
			return nil, err
		}
		if gerr != nil {
			return nil, fmt.Errorf("sockport: getsockname: %w", gerr)
		}
		if err := p.setInetDst(local, ra); err != nil {
			return nil, err
		}
	case *net.UnixConn:
		ra, ok := remote.(*net.UnixAddr)
		if !ok {
			return nil, fmt.Errorf("sockport: unixgram port needs a *net.UnixAddr remote, got %T", remote)
		}
		if len(ra.Name) == 0 || len(ra.Name) > MaxUnixPath {
			return nil, fmt.Errorf("sockport: remote path is %d bytes, want 1 to %d", len(ra.Name), MaxUnixPath)
		}
		binary.NativeEndian.PutUint16(p.dst[0:], unix.AF_UNIX)
		copy(p.dst[2:], ra.Name)
		p.dstLen = uint32(2 + len(ra.Name) + 1)
	default:
		return nil, fmt.Errorf("sockport: datagram port needs a *net.UDPConn or *net.UnixConn, got %T", c)
	}
	setBuffers(c)
	p.Base = port.NewBase(c, remote.Network()+":"+remote.String(), st)
	for i := range p.rmsgs {
		p.rmsgs[i].Hdr.Iov = &p.riov[i]
		p.rmsgs[i].Hdr.SetIovlen(1)
		p.wmsgs[i].Hdr.Iov = &p.wiov[2*i]
		p.wmsgs[i].Hdr.SetIovlen(1)
		p.wmsgs[i].Hdr.Name = &p.dst[0]
		p.wmsgs[i].Hdr.Namelen = p.dstLen
	}
	p.readFn = p.recvmmsg
	p.writeFn = p.sendmmsg
	p.waiter = newWriteWaiter()
	p.room = newSockRoom()
	return p, nil
}

// setInetDst encodes ra as a sockaddr of the local socket's family (an IPv4 remote on an
// IPv6 socket becomes v4-mapped).
func (p *DgramPort) setInetDst(local unix.Sockaddr, ra *net.UDPAddr) error {
	port := uint16(ra.Port)
	switch local.(type) {
	case *unix.SockaddrInet4:
		ip4 := ra.IP.To4()
		if ip4 == nil {
			return fmt.Errorf("sockport: remote %s is not IPv4 but the local socket is", ra)
		}
		binary.NativeEndian.PutUint16(p.dst[0:], unix.AF_INET)
		binary.BigEndian.PutUint16(p.dst[2:], port)
		copy(p.dst[4:8], ip4)
		p.dstLen = unix.SizeofSockaddrInet4
	case *unix.SockaddrInet6:
		ip16 := ra.IP.To16()
		if ip16 == nil {
			return fmt.Errorf("sockport: bad remote address %s", ra)
		}
		binary.NativeEndian.PutUint16(p.dst[0:], unix.AF_INET6)
		binary.BigEndian.PutUint16(p.dst[2:], port)
		copy(p.dst[8:24], ip16)
		if ra.Zone != "" {
			ifi, err := net.InterfaceByName(ra.Zone)
			if err != nil {
				return fmt.Errorf("sockport: remote %s: %w", ra, err)
			}
			binary.NativeEndian.PutUint32(p.dst[24:], uint32(ifi.Index))
		}
		p.dstLen = unix.SizeofSockaddrInet6
	default:
		return fmt.Errorf("sockport: UDP socket has unexpected local address %T", local)
	}
	return nil
}

// VnetHdrLen is 0: QEMU's dgram and socket backends never carry a virtio_net_hdr.
func (p *DgramPort) VnetHdrLen() int { return 0 }

// Accepts is empty: frames must be plain, fully checksummed and no larger than the MTU.
func (p *DgramPort) Accepts() vnethdr.Offloads { return 0 }

// ReadBatch receives up to len(bufs) datagrams with one recvmmsg, blocking in the
// netpoller until at least one is ready. Datagrams shorter than port.MinFrame or longer than
// port.MaxFrame (detected with MSG_TRUNC) are dropped and counted; the good ones are packed
// into bufs[0:n]. Errors are only ever fatal socket errors (or port.ErrClosed after Close).
func (p *DgramPort) ReadBatch(bufs [][]byte, sizes []int) (int, error) {
	want := min(len(bufs), len(sizes), maxDgramBatch)
	if want == 0 {
		return 0, nil
	}
	for i := 0; i < want; i++ {
		if len(bufs[i]) == 0 {
			return 0, fmt.Errorf("sockport: read buffer %d is empty", i)
		}
	}
	for {
		for i := 0; i < want; i++ {
			// One byte over port.MaxFrame is enough to tell an oversize datagram by MSG_TRUNC.
			p.riov[i].Base = &bufs[i][0]
			p.riov[i].SetLen(min(len(bufs[i]), port.MaxFrame+1))
		}
		p.rWant, p.rGot, p.rErr = want, 0, nil
		err := p.rc.Read(p.readFn)
		if err == nil {
			err = p.rErr
		}
		if err != nil {
			clear(p.riov[:want])
			if errors.Is(err, net.ErrClosed) {
				return 0, port.ErrClosed
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, err // the caller's timer, not a broken socket
			}
			return 0, p.Fail(fmt.Errorf("sockport: receive on %s: %w", p.Peer(), err))
		}
		n, bytes := 0, 0
		for i := 0; i < p.rGot; i++ {
			m := &p.rmsgs[i]
			l := int(m.Len)
			switch {
			case m.Hdr.Flags&unix.MSG_TRUNC != 0 || l > port.MaxFrame || l > len(bufs[n]):
				p.Stats().OversizeDatagram.Add(1)
			case l < port.MinFrame:
				p.Stats().ShortDatagram.Add(1)
			default:
				if n != i {
					copy(bufs[n], bufs[i][:l]) // rare: only after a dropped datagram
				}
				sizes[n] = l
				bytes += l
				n++
			}
		}
		clear(p.riov[:want])
		if n > 0 {
			p.Stats().FramesIn.Add(uint64(n))
			p.Stats().BytesIn.Add(uint64(bytes))
			return n, nil
		}
	}
}

// SetReadDeadline implements Port.
func (p *DgramPort) SetReadDeadline(t time.Time) error { return p.conn.SetReadDeadline(t) }

// Pending implements Port. recvmmsg takes whatever is queued in one call, so nothing is
// ever left buffered in user space.
func (p *DgramPort) Pending() bool { return false }

// recvmmsg runs inside rc.Read; false means "wait for readability".
func (p *DgramPort) recvmmsg(fd uintptr) bool {
	for {
		n, errno := rawsys.Recvmmsg(fd, p.rmsgs[:p.rWant], 0)
		p.Stats().ReadCalls.Add(1)
		switch errno {
		case 0:
			p.rGot = int(n)
			return true
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		case unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH:
			// A queued ICMP error surfacing on receive: it concerns a past send, not
			// this socket, and the next call reads data again.
		default:
			p.rErr = errno
			return true
		}
	}
}

// WriteBatch sends each frame as one datagram to the remote, up to 512 per sendmmsg.
// A frame outside [port.MinFrame, port.MaxFrame] is not sent: WriteBatch returns the count before
// it and a *port.FrameError. Datagrams the kernel refuses for reasons of the moment (the remote
// UNIX path does not exist yet or nobody is bound to it, ENOBUFS, unreachable, or a
// receiver that stays full for dgramSendWait) are dropped and counted in SendDrops, and
// count as handled: datagram links are lossy and a missing peer must not stop the
// pipeline. Other errors are fatal to the port.
func (p *DgramPort) WriteBatch(frames [][]byte) (int, error) { return p.write(frames, false) }

// TryWriteBatch implements port.BatchSender: like WriteBatch, but the first EAGAIN returns the
// count handled so far with port.ErrWouldBlock instead of waiting (datagrams are whole by
// nature). Datagrams refused for reasons of the moment are still dropped and counted.
func (p *DgramPort) TryWriteBatch(frames [][]byte) (int, error) { return p.write(frames, true) }

// Shortest and longest wait of WaitWritable for a write-space event (see there).
const (
	peerFullMinWait = time.Millisecond
	peerFullMaxWait = 64 * time.Millisecond
)

// WaitWritable implements port.BatchSender. An unconnected AF_UNIX datagram socket answers
// EAGAIN when the receiver's queue is full (net.unix.max_dgram_qlen, 10 by default) while
// our own socket still polls writable, so polling would spin. But every datagram stays
// charged to our socket until the receiver reads it, and freeing it raises a
// write-space event on our socket: so WaitWritable waits for the next such event in the
// netpoller, whatever poll says. An event that fired between the failed send and this
// wait is lost, so the wait is bounded: 1 ms, doubling up to 64 ms while waits keep
// timing out (a stopped receiver then costs ~16 wake-ups a second), back to 1 ms after
// a send succeeds. For UDP the event is our own send buffer draining.
func (p *DgramPort) WaitWritable(deadline time.Time) error {
	step := min(peerFullMinWait<<min(p.peerFull, 6), peerFullMaxWait)
	until := time.Now().Add(step)
	if !deadline.IsZero() && deadline.Before(until) {
		until = deadline
	}
	p.waiter.nextEdge = true
	err := p.waiter.wait(p.conn, p.rc, until)
	if errors.Is(err, os.ErrDeadlineExceeded) && (deadline.IsZero() || time.Now().Before(deadline)) {
		p.peerFull++
		return nil // our own bound, not the caller's: try sending again
	}
	return err
}

// Room implements port.BatchSender. For AF_UNIX datagrams the bytes stay charged to us until
// the receiver reads them; for UDP only until the packet leaves the host.
func (p *DgramPort) Room() (free, size int) { return p.room.room(p.rc) }

// TryWriteVecs implements port.VecSender: TryWriteBatch for frames in two pieces, each
// datagram one message of sendmmsg with the iovec pair [Head after its headroom][Body]
// (an empty piece is left out), so nothing is copied together first.
func (p *DgramPort) TryWriteVecs(frames []port.Vec) (int, error) {
	return sendChunks(frames, maxDgramBatch, p.layVecs,
		func(_ []port.Vec, k int) (int, error) { return p.sendBuilt(k, true) })
}

// layVecs lays out the leading datagrams of chunk in wmsgs (see sendChunks).
func (p *DgramPort) layVecs(chunk []port.Vec) (k int, bad error) {
	for i := range chunk {
		v := &chunk[i]
		if len(v.Head) < port.VecHeadroom {
			return k, fmt.Errorf("sockport: a Vec's head of %d bytes is shorter than its headroom", len(v.Head))
		}
		if bad = port.CheckFrameLen(uint64(v.Len()), port.MinFrame, port.MaxFrame); bad != nil {
			return k, bad
		}
		iov := p.wiov[2*k : 2*k+2]
		n := 0
		if h := v.Head[port.VecHeadroom:]; len(h) > 0 {
			iov[n].Base = &h[0]
			iov[n].SetLen(len(h))
			n++
		}
		if len(v.Body) > 0 {
			iov[n].Base = &v.Body[0]
			iov[n].SetLen(len(v.Body))
			n++
		}
		p.wmsgs[k].Hdr.SetIovlen(n)
		k++
	}
	return k, nil
}

// sendBuilt sends the k messages laid out in wmsgs (try: only what goes without
// waiting) and returns how many went and the error for the caller to return:
// ErrWouldBlock as is, anything else through Fail.
func (p *DgramPort) sendBuilt(k int, try bool) (int, error) {
	var err error
	if try {
		err = p.trySend(k)
	} else {
		err = p.send(k)
	}
	clear(p.wiov[:2*k])
	if err != nil && err != port.ErrWouldBlock {
		err = p.Fail(err)
	}
	return p.wIdx, err
}

func (p *DgramPort) write(frames [][]byte, try bool) (int, error) {
	return sendChunks(frames, maxDgramBatch, p.layFrames,
		func(_ [][]byte, k int) (int, error) { return p.sendBuilt(k, try) })
}

// layFrames lays out the leading datagrams of chunk in wmsgs (see sendChunks).
func (p *DgramPort) layFrames(chunk [][]byte) (k int, bad error) {
	for _, f := range chunk {
		if bad = port.CheckFrameLen(uint64(len(f)), port.MinFrame, port.MaxFrame); bad != nil {
			return k, bad
		}
		p.wiov[2*k].Base = &f[0]
		p.wiov[2*k].SetLen(len(f))
		p.wmsgs[k].Hdr.SetIovlen(1)
		k++
	}
	return k, nil
}

// send pushes wmsgs[0:k] out, waiting at most dgramSendWait each time the socket stays
// full. On return wIdx is the number of datagrams sent or dropped.
func (p *DgramPort) send(k int) error {
	p.wIdx, p.wEnd, p.wErr, p.wBlock = 0, k, nil, false
	var err error
	for {
		p.wAgain = false
		err = p.rc.Write(p.writeFn)
		if p.wBlock {
			_ = p.conn.SetWriteDeadline(time.Time{})
			p.wBlock = false
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			p.Stats().SendDrops.Add(uint64(p.wEnd - p.wIdx))
			p.wIdx, err = p.wEnd, nil
			break
		}
		if err != nil || p.wErr != nil || !p.wAgain {
			break
		}
		// Slow path: wait in the poller, but not forever.
		_ = p.conn.SetWriteDeadline(time.Now().Add(p.sendWait))
		p.wBlock = true
	}
	if err == nil {
		err = p.wErr
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, net.ErrClosed):
		return port.ErrClosed
	}
	return fmt.Errorf("sockport: send to %s: %w", p.Peer(), err)
}

// trySend pushes wmsgs[0:k] out until the first EAGAIN (port.ErrWouldBlock). On return wIdx
// is the number of datagrams sent or dropped.
func (p *DgramPort) trySend(k int) error {
	p.wIdx, p.wEnd, p.wErr, p.wBlock, p.wAgain = 0, k, nil, false, false
	err := p.rc.Write(p.writeFn)
	if err == nil {
		err = p.wErr
	}
	switch {
	case err == nil && p.wAgain:
		return port.ErrWouldBlock
	case err == nil:
		p.peerFull = 0
		return nil
	case errors.Is(err, net.ErrClosed):
		return port.ErrClosed
	}
	return fmt.Errorf("sockport: send to %s: %w", p.Peer(), err)
}

// sendmmsg runs inside rc.Write.
func (p *DgramPort) sendmmsg(fd uintptr) bool {
	for p.wIdx < p.wEnd {
		n, errno := rawsys.Sendmmsg(fd, p.wmsgs[p.wIdx:p.wEnd], 0)
		p.Stats().WriteCalls.Add(1)
		switch errno {
		case 0:
			b := uint64(0)
			for i := p.wIdx; i < p.wIdx+int(n); i++ {
				b += uint64(p.wmsgs[i].Len) // what the kernel took of message i
			}
			p.Stats().FramesOut.Add(uint64(n))
			p.Stats().BytesOut.Add(b)
			p.wIdx += int(n)
		case unix.EINTR:
		case unix.EAGAIN:
			p.Stats().WriteWaits.Add(1)
			if p.wBlock {
				return false
			}
			p.wAgain = true
			return true
		case unix.ENOENT, unix.ECONNREFUSED, unix.ENOBUFS, unix.EHOSTUNREACH,
			unix.ENETUNREACH, unix.EADDRNOTAVAIL, unix.EPERM, unix.EACCES:
			// sendmmsg reports an error only for the first datagram it tried.
			p.Stats().SendDrops.Add(1)
			p.wIdx++
		default:
			p.wErr = errno
			return true
		}
	}
	return true
}
