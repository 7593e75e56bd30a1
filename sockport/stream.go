package sockport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/rawsys"
	"tapgro/vnethdr"
)

const (
	// streamBufSize is the receive buffer of one stream connection: room for several
	// 64 KiB frames per read syscall, allocated once per connection.
	streamBufSize = 256 << 10

	// maxIov is IOV_MAX (UIO_MAXIOV) on Linux: writev refuses more iovecs with EINVAL.
	maxIov = 1024

	// maxStreamBatch is how many frames one writev carries: a prefix and a frame each.
	maxStreamBatch = maxIov / 2
)

// StreamPort is a port.Port over a connected stream socket (*net.UnixConn or *net.TCPConn)
// speaking QEMU's stream framing: a 4-byte big-endian length, then the Ethernet frame
// (QEMU net/stream.c, net/net.c net_fill_rstate). It carries no vnet header.
//
// Reads fill a 256 KiB buffer with one read syscall and return every complete frame in it;
// writes send up to 512 length-prefixed frames per writev. Neither allocates in steady
// state. One goroutine may call ReadBatch while another calls WriteBatch.
type StreamPort struct {
	port.Base
	conn net.Conn
	rc   syscall.RawConn

	// Reader state, owned by the ReadBatch goroutine. read is called from inside
	// rc.Read with the bound method value readFn, as writev is below.
	df      *Deframer
	badSeen bool
	rN      int           // what the last read returned
	rErr    syscall.Errno // and its errno
	readFn  func(fd uintptr) bool

	// Writer state, owned by the WriteBatch goroutine. writev is called from inside
	// rc.Write with the bound method value writeFn, so that the netpoller, not a busy
	// loop, waits when the socket buffer is full, and no closure is allocated per batch.
	prefix     [maxStreamBatch][PrefixLen]byte
	iov        [maxIov]unix.Iovec
	wIdx, wEnd int   // iov[wIdx:wEnd] is still to be written
	wErr       error // errno that ended the current writev loop
	wTry       bool  // TryWriteBatch: stop on EAGAIN instead of waiting
	wBlocked   bool  // the writev loop stopped on EAGAIN (TryWriteBatch)
	writeFn    func(fd uintptr) bool

	// A record TryWriteBatch left partly written: the next write must start with the
	// same frame (same memory, same length) and resumes pendOff bytes into its record.
	pendBase *byte
	pendBody *byte
	pendLen  int
	pendOff  int

	// Per record of the batch being written: where its iovecs end in iov, and its
	// frame's length (without the prefix).
	recEnd [maxStreamBatch]int
	recLen [maxStreamBatch]int
	// What identifies record k's memory should it be left partly written: a Vec's head
	// and body, a plain frame's first byte (its prefix is the port's own).
	recBase [maxStreamBatch]*byte
	recBody [maxStreamBatch]*byte

	waiter *writeWaiter
	room   *sockRoom

	// lo and hi bound the record lengths accepted (frame plus any vnet header).
	lo, hi int

	// vnet-hdr=on (vnetstream.go): zero for QEMU framing.
	vnetFraming

	// Shared-memory rings (shm.go): nil unless both ends of a vnet-hdr=on stream over
	// AF_UNIX agreed on them.
	shm  *shmLink
	vnet *VnetStats // vnet-hdr=on only: its own counters (VnetStats)
}

var (
	_ port.Port        = (*StreamPort)(nil)
	_ port.BatchSender = (*StreamPort)(nil)
	_ port.VecSender   = (*StreamPort)(nil)
)

// NewStreamPort wraps a connected stream socket. It sets TCP_NODELAY on TCP (as QEMU does
// on its TCP sockets) and asks for 4 MiB socket buffers. st may be nil for private
// counters. The port.Port owns c from now on: Close closes it.
func NewStreamPort(c net.Conn, st *port.Stats) (*StreamPort, error) { return newStreamPort(c, st, 0) }

// newStreamPort is NewStreamPort for records carrying a hdrLen-byte vnet header in front
// of each frame (0: QEMU framing); a record is then at most port.MaxFrame+hdrLen bytes.
func newStreamPort(c net.Conn, st *port.Stats, hdrLen int) (*StreamPort, error) {
	switch c.(type) {
	case *net.UnixConn, *net.TCPConn:
	default:
		return nil, fmt.Errorf("sockport: stream port needs a *net.UnixConn or *net.TCPConn, got %T", c)
	}
	rc, err := rawConn(c)
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true) // Go's default already; stated because frames must not wait
	}
	setBuffers(c)
	s := &StreamPort{
		Base:        port.NewBase(c, PeerString(c), st),
		conn:        c,
		rc:          rc,
		df:          newDeframer(streamBufSize, lendHeadroom(hdrLen), port.MinFrame+hdrLen, port.MaxFrame+hdrLen),
		vnetFraming: vnetFraming{hdrLen: hdrLen},
		lo:          port.MinFrame + hdrLen,
		hi:          port.MaxFrame + hdrLen,
	}
	s.writeFn = s.writev
	s.readFn = s.read
	s.waiter = newWriteWaiter()
	s.room = newSockRoom()
	return s, nil
}

// VnetHdrLen is 0 for QEMU framing: QEMU's stream backend never carries a
// virtio_net_hdr (net/stream.c has no has_vnet_hdr). On a vnet-hdr=on stream it is
// VnetStreamHdrLen.
func (s *StreamPort) VnetHdrLen() int { return s.hdrLen }

// Accepts is empty for QEMU framing: frames must be plain, fully checksummed and no
// larger than the MTU. On a vnet-hdr=on stream it is what the peer's hello advertised.
func (s *StreamPort) Accepts() vnethdr.Offloads { return s.accepts }

// ReadBatch returns every complete frame already buffered (up to len(bufs)), reading from
// the socket, and blocking in the netpoller, only when none is complete.
//
// A bad length prefix returns a *port.FrameError and a clean EOF returns an error wrapping
// port.ErrClosed and io.EOF; a reset by the peer wraps port.ErrClosed and syscall.ECONNRESET. A
// connection that ends (EOF or reset) inside a record, its length prefix included, also
// wraps io.ErrUnexpectedEOF and is counted in Stats.Truncated.
// Frames complete before such a condition are returned first, with a nil error. After an
// error the caller must Close the port: the stream has lost sync or ended.
func (s *StreamPort) ReadBatch(bufs [][]byte, sizes []int) (int, error) {
	return s.readBatch(bufs, sizes, nil)
}

// ReadBatchLent is ReadBatch for a caller that can take frames in place instead of
// having them copied: from the peer's shared-memory ring (shm.go), or, on a vnet-hdr=on
// stream, from the port's own read buffer. With lent non-nil, frame i is either copied
// into bufs[i] as by ReadBatch, with lent[i] set to nil, or lent: the record (vnet
// header, then frame, sizes[i] bytes in all) then starts at
// lent[i][port.ShmHeadroom-VnetHdrLen()], and the port.ShmHeadroom bytes before the frame may be
// overwritten (with the TAP's own header). Lent frames stay valid until ReleaseLent,
// which the caller must call once it is done with them and before the next
// ReadBatchLent. With lent nil, nothing is lent.
func (s *StreamPort) ReadBatchLent(bufs [][]byte, sizes []int, lent [][]byte) (int, error) {
	return s.readBatch(bufs, sizes, lent)
}

// recKind is what one record on the stream is.
type recKind uint8

const (
	recFrame recKind = iota + 1 // a frame (vnet header first on a vnet-hdr=on stream)
	recDesc                     // a shared-memory descriptor naming a slot of the peer's ring
)

// readBatch is the reader: one record step (record) per frame, each taken by the copy
// path (copyOut) or, for a caller that takes frames in place (lent non-nil), the lend
// path (lendOut); a read(2) only when no complete record is buffered.
func (s *StreamPort) readBatch(bufs [][]byte, sizes []int, lent [][]byte) (int, error) {
	want := min(len(bufs), len(sizes))
	if lent != nil {
		want = min(want, len(lent))
	}
	if want == 0 {
		return 0, nil
	}
	for {
		n, bytes := 0, 0
		var ferr error
		for n < want {
			rec, kind, err := s.record()
			if err != nil || kind == 0 {
				ferr = err
				break
			}
			var size, b int
			if lent != nil {
				size, b, err = s.lendOut(rec, kind, lent, n)
			} else {
				size, b, err = s.copyOut(rec, kind, bufs, n)
			}
			if err != nil {
				ferr = err
				break
			}
			sizes[n] = size
			bytes += b
			n++
		}
		if n > 0 {
			s.Stats().FramesIn.Add(uint64(n))
			s.Stats().BytesIn.Add(uint64(bytes))
			return n, nil // any error is sticky and comes back on the next call
		}
		if ferr != nil {
			var fe *port.FrameError
			if (errors.As(ferr, &fe) || errors.Is(ferr, errBadDesc)) && !s.badSeen {
				s.badSeen = true
				s.Stats().BadLength.Add(1)
			}
			return 0, s.Fail(ferr)
		}

		m, err := s.readSome()
		s.Stats().ReadCalls.Add(1)
		if m > 0 {
			s.df.Commit(m)
			continue // a read error, if any, is reported again by the next Read
		}
		if err == nil {
			continue
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, err // the caller's timer, not a broken stream
		}
		return 0, s.Fail(s.readErr(err))
	}
}

// readSome is one read(2) into the deframer's free space, which is never empty (the
// buffer holds a whole record, NewDeframer), so 0 bytes is the peer's EOF. The call goes
// through package rawsys on the non-blocking socket; the wait for readability, the read
// deadline and Close waking a blocked reader are the netpoller's, as with conn.Read.
func (s *StreamPort) readSome() (int, error) {
	s.rN, s.rErr = 0, 0
	if err := s.rc.Read(s.readFn); err != nil {
		return 0, err // closed (net.ErrClosed) or past the deadline
	}
	switch {
	case s.rErr != 0:
		return 0, os.NewSyscallError("read", s.rErr)
	case s.rN == 0:
		return 0, io.EOF
	}
	return s.rN, nil
}

// read runs inside rc.Read; false means "wait for readability".
func (s *StreamPort) read(fd uintptr) bool {
	for {
		n, e := rawsys.Read(fd, s.df.Space())
		switch e {
		case 0:
			s.rN = n
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		s.rErr = e
		return true
	}
}

// record is the reader's one record step: the next complete record in the read buffer,
// not yet consumed, and what it is; kind 0 when none is complete. A bad length prefix
// is the deframer's sticky *port.FrameError. With shared memory the deframer lets
// records as short as a descriptor through, so anything else that short is refused here.
func (s *StreamPort) record() ([]byte, recKind, error) {
	f, err := s.df.Peek()
	if err != nil || f == nil {
		return nil, 0, err
	}
	if s.shm != nil {
		if s.shm.isDesc(f) {
			return f, recDesc, nil
		}
		if len(f) < port.MinFrame+s.hdrLen {
			return nil, 0, &port.FrameError{Length: uint64(len(f)), Limit: port.MinFrame + s.hdrLen}
		}
	}
	return f, recFrame, nil
}

// copyOut is the copy path: record rec goes into bufs[i] and is consumed. A descriptor's
// slot is copied from and handed back to the peer at once. It returns the size put in
// bufs[i] and the bytes counted in Stats.BytesIn.
func (s *StreamPort) copyOut(rec []byte, kind recKind, bufs [][]byte, i int) (size, bytes int, err error) {
	if kind == recDesc {
		sl, fl, err := s.shm.lend(rec)
		if err != nil {
			return 0, 0, err
		}
		s.df.consume(rec)
		size = copy(bufs[i], sl[port.ShmHeadroom-s.hdrLen:port.ShmHeadroom+fl])
		s.shm.releaseLent()
		return size, s.hdrLen + fl, nil
	}
	if len(bufs[i]) < len(rec) {
		return 0, 0, fmt.Errorf("sockport: read buffer %d holds %d bytes, frame is %d: %w",
			i, len(bufs[i]), len(rec), io.ErrShortBuffer)
	}
	size = copy(bufs[i], rec)
	s.df.consume(rec)
	return size, size, nil
}

// lendOut is the lend path: record rec is lent in lent[i] and consumed, its record
// starting at port.ShmHeadroom-VnetHdrLen(). A descriptor lends the peer's slot (held
// until ReleaseLent); a frame is lent in place from the read buffer, which stays as it
// is until the next call, with port.ShmHeadroom bytes in front of it always inside the
// buffer. On a vnet-hdr=on stream those are the record's own length prefix and vnet
// header. On a QEMU-framed stream they are the length prefix and the 12 bytes before
// it: the deframer's headroom (lendHeadroom) for the first record in the buffer, the
// previous record's tail for the others, so writing a frame's headroom ends the
// previous frame's loan (port.Lender says so; the datapath takes frames in order).
// Lending instead of copying saves a memmove of every byte the port delivers.
func (s *StreamPort) lendOut(rec []byte, kind recKind, lent [][]byte, i int) (size, bytes int, err error) {
	if kind == recDesc {
		sl, fl, err := s.shm.lend(rec)
		if err != nil {
			return 0, 0, err
		}
		s.df.consume(rec)
		lent[i] = sl
		return s.hdrLen + fl, s.hdrLen + fl, nil
	}
	start := s.df.r + PrefixLen
	lent[i] = s.df.buf[start+s.hdrLen-port.ShmHeadroom : start+len(rec)]
	s.df.consume(rec)
	return len(rec), len(rec), nil
}

// lendHeadroom is the deframer headroom that puts port.ShmHeadroom bytes in front of
// every frame in the read buffer (see lendOut): the length prefix and the record's vnet
// header cover it on vnet-hdr=on streams (0), the deframer's own headroom adds what a
// QEMU-framed stream lacks.
func lendHeadroom(hdrLen int) int { return max(0, port.ShmHeadroom-PrefixLen-hdrLen) }

// SetReadDeadline implements Port.
func (s *StreamPort) SetReadDeadline(t time.Time) error { return s.conn.SetReadDeadline(t) }

// Pending implements Port: a complete frame (or a framing error to report) is buffered.
func (s *StreamPort) Pending() bool {
	f, err := s.df.Peek()
	return f != nil || err != nil
}

// readErr maps the error that ended a read. The peer going away is port.ErrClosed whether it
// closed cleanly (EOF) or the kernel reset the connection (ECONNRESET): Linux resets
// instead of sending EOF when the peer closes with data of ours still unread in its
// receive queue (tcp_close sends an RST, RFC 2525 section 2.17; unix_release_sock sets
// ECONNRESET on an AF_UNIX peer), which a QEMU that quits under load does. Either way
// the reader first gets every byte the peer sent, so anything still buffered — part of a
// length prefix or part of a frame — is a truncated record, counted once per connection.
func (s *StreamPort) readErr(err error) error {
	reset := errors.Is(err, syscall.ECONNRESET)
	switch {
	case errors.Is(err, net.ErrClosed):
		return port.ErrClosed
	case !reset && !errors.Is(err, io.EOF):
		return fmt.Errorf("sockport: read from %s: %w", s.Peer(), err)
	}
	how := "closed"
	if reset {
		how = "reset"
	} else {
		err = io.EOF // a bare EOF, not the *net.OpError around it
	}
	if n := s.df.Buffered(); n > 0 {
		s.Stats().Truncated.Add(1)
		where := "frame"
		if n < PrefixLen {
			where = "length prefix"
		}
		if reset {
			return fmt.Errorf("%w: %s reset the connection inside a %s (%d of %d bytes received): %w: %w",
				port.ErrClosed, s.Peer(), where, n, s.df.Want(), io.ErrUnexpectedEOF, err)
		}
		return fmt.Errorf("%w: %s closed the connection inside a %s (%d of %d bytes received): %w",
			port.ErrClosed, s.Peer(), where, n, s.df.Want(), io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("%w: %s %s the connection: %w", port.ErrClosed, s.Peer(), how, err)
}

// WriteBatch sends the frames in order, up to 512 per writev. A frame shorter than
// port.MinFrame or longer than port.MaxFrame is not sent (QEMU would drop the connection over it):
// WriteBatch returns the frames before it and a *port.FrameError, and the connection stays
// usable. Otherwise it returns only when every frame is in the socket or the connection
// failed; a partial frame is left behind only on a broken connection.
func (s *StreamPort) WriteBatch(frames [][]byte) (int, error) { return s.write(frames, false) }

// TryWriteBatch implements port.BatchSender: WriteBatch that returns port.ErrWouldBlock, with the
// count of whole frames sent, as soon as the socket is full. It never waits. When the
// kernel took part of a record, the port remembers how much: the next TryWriteBatch or
// WriteBatch must begin with that same frame (the same memory, as rxpool guarantees by
// keeping it staged) and resumes inside its record, so the peer sees one contiguous
// stream. Beginning with any other frame would corrupt the stream: the call fails with
// ErrPartialRecord instead and the connection must be closed.
func (s *StreamPort) TryWriteBatch(frames [][]byte) (int, error) { return s.write(frames, true) }

// ErrPartialRecord is returned when a write after a TryWriteBatch that left a record
// partly written does not begin with that record's frame.
var ErrPartialRecord = errors.New("sockport: a partly written record was not resumed with the same frame")

// WaitWritable implements port.BatchSender.
func (s *StreamPort) WaitWritable(deadline time.Time) error {
	return s.waiter.wait(s.conn, s.rc, deadline)
}

// Room implements port.BatchSender. For AF_UNIX the bytes stay charged to our buffer until the
// peer reads them, so Room grows exactly as the peer consumes; for TCP it grows as data is
// acknowledged, which a peer that stopped reading stops doing once its window closes.
func (s *StreamPort) Room() (free, size int) { return s.room.room(s.rc) }

// TryWriteVecs implements port.VecSender: TryWriteBatch for frames in two pieces. Each
// record goes out as at most two iovecs, [length prefix, written into the Vec's
// headroom, + Head][Body], so 512 records fill one writev's IOV_MAX = 1024 as with
// TryWriteBatch; a longer batch is several writevs, each of whole records. A record
// left partly written resumes as with TryWriteBatch: the next call must begin with the
// same Vec (same memory, same length), or it fails with ErrPartialRecord.
func (s *StreamPort) TryWriteVecs(frames []port.Vec) (int, error) {
	bytes := 0
	return sendChunks(frames, maxStreamBatch,
		func(chunk []port.Vec) (k int, bad error) { k, bytes, bad = s.layVecs(chunk); return k, bad },
		func(chunk []port.Vec, k int) (int, error) {
			first := &chunk[0]
			return s.send(k, bytes, &first.Head[0], bodyBase(first.Body), first.Len(), true)
		})
}

// layVecs lays out the leading records of chunk in iov (see sendChunks) and returns
// their frame bytes too.
func (s *StreamPort) layVecs(chunk []port.Vec) (k, bytes int, bad error) {
	iv := 0
	for i := range chunk {
		v := &chunk[i]
		n := v.Len()
		if len(v.Head) < port.VecHeadroom {
			return k, bytes, fmt.Errorf("sockport: a Vec's head of %d bytes has no room for the length prefix", len(v.Head))
		}
		if s.shm == nil || n != s.hdrLen+ShmDescLen {
			if bad = port.CheckFrameLen(uint64(n), s.lo, s.hi); bad != nil {
				return k, bytes, bad
			}
		}
		binary.BigEndian.PutUint32(v.Head, uint32(n))
		s.iov[iv] = unix.Iovec{Base: &v.Head[0], Len: uint64(len(v.Head))}
		iv++
		if len(v.Body) > 0 {
			s.iov[iv] = unix.Iovec{Base: &v.Body[0], Len: uint64(len(v.Body))}
			iv++
		}
		s.recEnd[k], s.recLen[k] = iv, n
		s.recBase[k], s.recBody[k] = &v.Head[0], bodyBase(v.Body)
		bytes += n
		k++
	}
	return k, bytes, nil
}

func bodyBase(b []byte) *byte {
	if len(b) == 0 {
		return nil
	}
	return &b[0]
}

func (s *StreamPort) write(frames [][]byte, try bool) (int, error) {
	bytes := 0
	return sendChunks(frames, maxStreamBatch,
		func(chunk [][]byte) (k int, bad error) { k, bytes, bad = s.layFrames(chunk); return k, bad },
		func(chunk [][]byte, k int) (int, error) {
			return s.send(k, bytes, &chunk[0][0], nil, len(chunk[0]), try)
		})
}

// layFrames lays out the leading records of chunk in iov, each with its length prefix
// in s.prefix (see sendChunks), and returns their frame bytes too.
func (s *StreamPort) layFrames(chunk [][]byte) (k, bytes int, bad error) {
	for _, f := range chunk {
		if s.shm == nil || len(f) != s.hdrLen+ShmDescLen {
			if bad = port.CheckFrameLen(uint64(len(f)), s.lo, s.hi); bad != nil {
				return k, bytes, bad
			}
		}
		binary.BigEndian.PutUint32(s.prefix[k][:], uint32(len(f)))
		s.iov[2*k] = unix.Iovec{Base: &s.prefix[k][0], Len: PrefixLen}
		s.iov[2*k+1] = unix.Iovec{Base: &f[0], Len: uint64(len(f))}
		s.recEnd[k], s.recLen[k] = 2*k+2, len(f)
		s.recBase[k], s.recBody[k] = &f[0], nil
		bytes += len(f)
		k++
	}
	return k, bytes, nil
}

// send writes the k records laid out in iov[:recEnd[k-1]] (bytes frame bytes in all;
// the first record's frame starts at base, its body at body, and is n bytes long) and
// returns how many went out whole. A record partly written when the socket filled
// (try) is remembered by its memory so that the next write resumes it; the error is
// then port.ErrWouldBlock.
func (s *StreamPort) send(k, bytes int, base, body *byte, n int, try bool) (int, error) {
	end := s.recEnd[k-1]
	s.wIdx, s.wEnd, s.wErr, s.wTry, s.wBlocked = 0, end, nil, try, false
	if s.pendOff > 0 {
		if base != s.pendBase || body != s.pendBody || n != s.pendLen {
			clear(s.iov[:end])
			return 0, s.Fail(fmt.Errorf("%w: %d of a %d-byte frame sent, next frame is %d bytes",
				ErrPartialRecord, s.pendOff, s.pendLen, n))
		}
		s.advance(uint64(s.pendOff))
		s.pendBase, s.pendBody, s.pendLen, s.pendOff = nil, nil, 0, 0
	}
	err := s.rc.Write(s.writeFn)
	sent := 0 // records fully written
	for sent < k && s.recEnd[sent] <= s.wIdx {
		sent++
	}
	if s.wBlocked && err == nil && s.wErr == nil && sent < k {
		s.notePartial(sent)
	}
	clear(s.iov[:end]) // do not pin the caller's buffers
	clear(s.recBase[:k])
	clear(s.recBody[:k])
	if err == nil {
		err = s.wErr
	}
	if sent == k {
		s.Stats().FramesOut.Add(uint64(k))
		s.Stats().BytesOut.Add(uint64(bytes))
	} else {
		b := 0
		for _, l := range s.recLen[:sent] {
			b += l
		}
		s.Stats().FramesOut.Add(uint64(sent))
		s.Stats().BytesOut.Add(uint64(b))
	}
	if err != nil {
		return sent, s.Fail(s.writeErr(err))
	}
	if s.wBlocked {
		return sent, port.ErrWouldBlock
	}
	return sent, nil
}

func (s *StreamPort) writeErr(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return port.ErrClosed
	}
	return fmt.Errorf("sockport: write to %s: %w", s.Peer(), err)
}

// writev runs inside rc.Write. It returns false to make the netpoller wait for
// writability (EAGAIN; ENOBUFS is treated the same, as backpressure: gvproxy exiting on
// ENOBUFS under load was containers/gvisor-tap-vsock#367), and true when iov[wIdx:wEnd] is
// all written or a hard error is in s.wErr. unix.Writev is not used because it builds a
// fresh []Iovec (an allocation above 8 iovecs) on every call; the iovecs here live in the
// port.
func (s *StreamPort) writev(fd uintptr) bool {
	for s.wIdx < s.wEnd {
		n, errno := rawsys.Writev(fd, s.iov[s.wIdx:s.wEnd])
		s.Stats().WriteCalls.Add(1)
		switch errno {
		case 0:
			s.advance(uint64(n))
		case unix.EINTR:
		case unix.EAGAIN, unix.ENOBUFS:
			if s.wTry {
				s.wBlocked = true
				return true
			}
			s.Stats().WriteWaits.Add(1)
			return false
		default:
			s.wErr = errno
			return true
		}
	}
	return true
}

// notePartial records how far into record r the writev loop stopped, if it stopped
// inside it (iov[wIdx], possibly trimmed, belongs to record r): the record's bytes
// (prefix included) minus what is left of its iovecs.
func (s *StreamPort) notePartial(r int) {
	left := uint64(0)
	for i := s.wIdx; i < s.recEnd[r]; i++ {
		left += s.iov[i].Len
	}
	if written := PrefixLen + s.recLen[r] - int(left); written > 0 {
		s.pendBase, s.pendBody, s.pendLen, s.pendOff = s.recBase[r], s.recBody[r], s.recLen[r], written
	}
}

// advance consumes n written bytes from iov[wIdx:], trimming a partly written iovec so the
// next writev resumes mid-frame (the peer sees one contiguous byte stream, as with QEMU's
// own short writes, net/stream.c net_stream_receive).
func (s *StreamPort) advance(n uint64) {
	for n > 0 && s.wIdx < s.wEnd {
		v := &s.iov[s.wIdx]
		if n < v.Len {
			v.Base = (*byte)(unsafe.Add(unsafe.Pointer(v.Base), n))
			v.Len -= n
			return
		}
		n -= v.Len
		s.wIdx++
	}
}
