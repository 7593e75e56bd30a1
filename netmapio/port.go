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
