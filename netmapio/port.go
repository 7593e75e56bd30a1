package netmapio

import (
	"errors"
	"time"

	"tapgro/vnethdr"
)

// MaxFrame is the largest record QEMU's socket-family backends accept: NET_BUFSIZE =
// 4096 + 65536 (wire.md §3.1). A longer length prefix makes QEMU drop the connection, so
// tapgro treats it as a framing error too.
const MaxFrame = 69632

// MinFrame is an Ethernet header: anything shorter is not a frame (passt resets the
// connection on it; QEMU would hand an empty packet to the guest).
const MinFrame = 14

// ErrClosed is returned by a Port after Close or once the peer has gone away for good;
// the supervisor reacts by waiting for the next connection.
var ErrClosed = errors.New("netmapio: port closed")

// Port is one live connection to a peer (a QEMU netdev, or another tapgro). It moves
// Ethernet frames in batches; when VnetHdrLen() > 0 every frame is preceded by a
// virtio_net_hdr of that length, otherwise frames are plain and fully checksummed.
//
// A Port is used by exactly two goroutines: one calls ReadBatch, the other WriteBatch.
type Port interface {
	// ReadBatch blocks until at least one frame is available, then fills bufs[i][:sizes[i]]
	// with up to len(bufs) frames that are ready now, without blocking again. Each buffer
	// must be able to hold MaxFrame (+ VnetHdrLen) bytes. Malformed input from the peer is
	// counted; on a stream it ends the connection (ReadBatch returns an error wrapping the
	// reason), on a datagram port the frame is dropped.
	ReadBatch(bufs [][]byte, sizes []int) (n int, err error)

	// WriteBatch sends frames in order, batching system calls where the transport allows
	// (writev on streams, sendmmsg on datagrams). It returns the number of frames fully
	// handed to the kernel; on a stream a partial frame is never left behind unless the
	// connection is broken.
	WriteBatch(frames [][]byte) (n int, err error)

	// SetReadDeadline makes a ReadBatch blocked past t return an error wrapping
	// os.ErrDeadlineExceeded. Unlike every other read error it does not end the
	// connection: the I/O loop uses it as its timer (GRO timer flush) instead of a Go
	// timer per flow. The zero time clears it.
	SetReadDeadline(t time.Time) error

	// Pending reports whether complete frames are already buffered, so ReadBatch would
	// return at once without a system call. A "read batch" ends when this is false: the
	// GRO engine flushes there rather than at every ReadBatch (whose size is the
	// caller's buffer count, not what the peer sent).
	Pending() bool

	// VnetHdrLen is the virtio_net_hdr length carried with each frame (0 for QEMU's
	// socket-family backends, which never carry one: wire.md §3.5).
	VnetHdrLen() int

	// Accepts is what the peer may be handed: QEMU socket-family backends accept nothing
	// (plain, fully checksummed frames no larger than the MTU).
	Accepts() vnethdr.Offloads

	// Peer describes the remote end for logs and metrics.
	Peer() string

	// Close ends the connection and unblocks ReadBatch and WriteBatch.
	Close() error
}

// ErrWouldBlock is returned by TryWriteBatch when the socket cannot take the next whole
// frame right now. It is backpressure, not a failure: the port stays usable, and the
// caller keeps the frames from the first unsent one on and retries after WaitWritable.
var ErrWouldBlock = errors.New("netmapio: port cannot take more frames now")

// BatchSender is what the TAP→port pool (package rxpool) needs of a Port to deliver in
// batches without blocking. StreamPort and DgramPort implement it; a Port that does not
// is written to with WriteBatch. It belongs to the goroutine that calls WriteBatch.
type BatchSender interface {
	// TryWriteBatch is WriteBatch without waiting: it writes frames in order until the
	// socket is full and then returns how many went out whole, with ErrWouldBlock. On a
	// stream the kernel may have taken part of the next record: the port remembers how
	// much, and the next write must begin with that same frame (same memory), which it
	// resumes mid-record so the peer sees one contiguous byte stream. Callers keep
	// unsent frames queued in order anyway, so this costs them nothing.
	TryWriteBatch(frames [][]byte) (n int, err error)

	// WaitWritable blocks in the netpoller until the socket can take data again, the
	// deadline passes (an error wrapping os.ErrDeadlineExceeded; the zero time means no
	// deadline), or the port is closed (ErrClosed). It never spins.
	WaitWritable(deadline time.Time) error

	// Room estimates the free bytes in the socket's send buffer and the buffer's size
	// (SIOCOUTQ against SO_SNDBUF). Both are in the kernel's accounting units, which
	// include per-packet overhead, so they are a guide, not a promise. A socket that
	// cannot tell reports free == size == math.MaxInt.
	Room() (free, size int)
}
