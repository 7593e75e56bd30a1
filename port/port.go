package port

import (
	"errors"
	"fmt"
	"time"

	"tapgro/vnethdr"
)

// MaxFrame is the largest record QEMU's socket-family backends accept: NET_BUFSIZE =
// 4096 + 65536 (QEMU include/net/net.h). net/stream.c drops the connection on a longer
// length prefix, so tapgro treats one as a framing error too, and every port's receive
// buffers hold at least this much.
const MaxFrame = 69632

// MinFrame is an Ethernet header: anything shorter is not a frame (passt resets the
// connection on it; QEMU would hand an empty packet to the guest).
const MinFrame = 14

// ErrClosed is returned by a Port after Close or once the peer has gone away for good;
// the supervisor reacts by waiting for the next connection.
var ErrClosed = errors.New("port: closed")

// ErrWouldBlock is returned by TryWriteBatch when the transport cannot take the next
// whole frame right now. It is backpressure, not a failure: the port stays usable, and
// the caller keeps the frames from the first unsent one on and retries after
// WaitWritable.
var ErrWouldBlock = errors.New("port: cannot take more frames now")

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
	// socket-family backends: QEMU net/stream.c and net/socket.c send bare frames).
	VnetHdrLen() int

	// Accepts is what the peer may be handed: QEMU socket-family backends accept nothing
	// (plain, fully checksummed frames no larger than the MTU).
	Accepts() vnethdr.Offloads

	// Peer describes the remote end for logs and metrics.
	Peer() string

	// Close ends the connection and unblocks ReadBatch and WriteBatch.
	Close() error
}

// BatchSender is what the TAP→port pool (package rxpool) needs of a Port to deliver in
// batches without blocking (with VecSender, without copying frames together first). A
// Port that does not implement it is written to with WriteBatch. It belongs to the goroutine that calls WriteBatch.
type BatchSender interface {
	// TryWriteBatch is WriteBatch without waiting: it writes frames in order until the
	// transport is full and then returns how many went out whole, with ErrWouldBlock. On
	// a stream the kernel may have taken part of the next record: the port remembers how
	// much, and the next write must begin with that same frame (same memory), which it
	// resumes mid-record so the peer sees one contiguous byte stream. Callers keep
	// unsent frames queued in order anyway, so this costs them nothing.
	TryWriteBatch(frames [][]byte) (n int, err error)

	// WaitWritable blocks in the netpoller until the transport can take data again, the
	// deadline passes (an error wrapping os.ErrDeadlineExceeded; the zero time means no
	// deadline), or the port is closed (ErrClosed). It never spins.
	WaitWritable(deadline time.Time) error

	// Room estimates the free bytes in the send buffer and the buffer's size (for a
	// socket, SIOCOUTQ against SO_SNDBUF). Both are in the kernel's accounting units,
	// which include per-packet overhead, so they are a guide, not a promise. A transport
	// that cannot tell reports free == size == math.MaxInt.
	Room() (free, size int)
}

// VecHeadroom is the room at the front of every Vec's Head that a VecSender may
// overwrite with its own framing before it sends the Vec: the stream transport writes
// the record's 4-byte length prefix there (QEMU net/stream.c framing), so prefix and
// headers go out as one iovec and a record is at most two (IOV_MAX = 1024 then still
// carries 512 records per writev). It is not part of the frame.
const VecHeadroom = 4

// Vec is one outgoing frame in two pieces sent back to back: Head[VecHeadroom:] (what
// the sender built for this frame: a vnet header, a segment's headers) and then Body (a
// view of the buffer the frame was read into, never copied). Either piece may be empty,
// not both; len(Head) >= VecHeadroom always.
type Vec struct {
	Head, Body []byte
}

// Len is the frame's length: what a peer receives, not counting the headroom.
func (v *Vec) Len() int { return len(v.Head) - VecHeadroom + len(v.Body) }

// VecSender is a BatchSender that takes frames as Vecs, so a frame assembled from
// headers built for it and a payload left where it was read reaches the kernel as an
// iovec pair (writev on streams, sendmmsg with per-message iovecs on datagrams)
// instead of being copied together first. TryWriteVecs is TryWriteBatch over Vecs,
// with the same rules: frames in order, whole, ErrWouldBlock when full; on a stream a
// record the kernel took in part must begin the next write (the same Vec, same memory),
// which resumes inside it. The sender may overwrite each Head[:VecHeadroom].
type VecSender interface {
	BatchSender
	TryWriteVecs(frames []Vec) (n int, err error)
}

// ShmHeadroom is where a lent or shared-memory frame starts: the bytes in front of it
// hold either end's TAP vnet header (10 or 12 bytes), so a TAP read into the slot and a
// TAP write from it both see [header][frame] contiguous, with no copy. It is part of
// the shared-memory ring's layout, which both ends of a link must agree on.
const ShmHeadroom = 16

// ShmSender is a port that can send frames through a shared-memory ring the peer maps
// (the sending half of a tapgro-to-tapgro link over AF_UNIX). The ring's layout is the
// transport's: the engine learns the two sizes it needs from ShmMinFrame and
// ShmDescLen, once, when it adopts the port.
type ShmSender interface {
	// ShmActive reports whether frames may cross through shared memory now.
	ShmActive() bool
	// ShmMinFrame is the smallest frame worth sending through the ring; a shorter one
	// is sent inline, where copying it costs less than a slot. Constant for a port.
	ShmMinFrame() int
	// ShmDescLen is the length of the descriptor PutShmDesc writes, the part of the
	// record after the vnet header. Constant for a port.
	ShmDescLen() int
	// TxSlots hands out up to len(slots) free ring slots for the next TAP read, laid out
	// so that an hl-byte vnet header followed by the frame, read into slots[i], puts the
	// frame at ShmHeadroom of the slot. TxDone must follow every call that returned n > 0.
	TxSlots(slots [][]byte, hl int) int
	// PutShmDesc fills rec[:ShmDescLen()] with the descriptor for slot i holding an
	// n-byte read.
	PutShmDesc(rec []byte, i int, n int)
	// TxDone returns the slots that no PutShmDesc named.
	TxDone()
	// TxFrame returns the frame a descriptor record points to (for capture).
	TxFrame(rec []byte) []byte
}

// Lender is a port that can lend received frames in place instead of copying them out.
// ReadBatchLent is ReadBatch with a third slice: frame i is either copied into bufs[i]
// (lent[i] == nil) or lent, its record (vnet header, then frame, sizes[i] bytes) starting
// at lent[i][ShmHeadroom-VnetHdrLen()], with the ShmHeadroom bytes before it the
// caller's to overwrite (with the TAP's own header). Lent frames stay valid until
// ReleaseLent, which the reader calls before its next ReadBatchLent. The headroom of
// frame i may be the tail of frame i-1 (a port without vnet headers lends frames where
// they lie, back to back in its read buffer): writing it ends frame i-1's loan, so a
// caller takes the frames of a batch in order, done with each before writing the next
// one's headroom.
type Lender interface {
	ReadBatchLent(bufs [][]byte, sizes []int, lent [][]byte) (int, error)
	ReleaseLent()
}

// Backend is QEMU's generic backend offload model (NetClientInfo's has_vnet_hdr_len and
// set_offload callbacks in QEMU include/net/net.h) cut to what tapgro's negotiation
// calls. The TAP and every port implement it.
type Backend interface {
	// VnetHdrLen is the header length every frame carries now (0 = plain frames).
	VnetHdrLen() int
	// Accepts is what this side may be handed: partial checksums and which GSO kinds.
	Accepts() vnethdr.Offloads
	// SetOffloads declares what this side may deliver to tapgro (like virtio-net's
	// guest offloads, or TUNSETOFFLOAD on the TAP) and returns what it will deliver.
	SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error)
	// State describes the current setting in one short line, for logs and `tapgro ctl`.
	State() string
}

// BackendOf returns p's Backend, or, for a Port that does not implement one, a fixed
// description built from its VnetHdrLen and Accepts.
func BackendOf(p Port) Backend {
	if b, ok := p.(Backend); ok {
		return b
	}
	return fixedBackend{p}
}

type fixedBackend struct{ p Port }

func (f fixedBackend) VnetHdrLen() int           { return f.p.VnetHdrLen() }
func (f fixedBackend) Accepts() vnethdr.Offloads { return f.p.Accepts() }
func (f fixedBackend) SetOffloads(vnethdr.Offloads) (vnethdr.Offloads, error) {
	if f.p.VnetHdrLen() == 0 {
		return 0, nil
	}
	return f.p.Accepts(), nil
}
func (f fixedBackend) State() string { return Describe("port", f.p.VnetHdrLen(), f.p.Accepts()) }

// Describe is the State line every transport uses: "stream(plain)",
// "stream(vnet-hdr 12, accepts csum,tso4)".
func Describe(kind string, hdrLen int, accepts vnethdr.Offloads) string {
	if hdrLen == 0 {
		return kind + "(plain)"
	}
	return fmt.Sprintf("%s(vnet-hdr %d, accepts %s)", kind, hdrLen, accepts)
}
