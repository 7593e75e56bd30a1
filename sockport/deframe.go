package sockport

import (
	"encoding/binary"
	"fmt"
	"tapgro/port"
)

// PrefixLen is the size of the big-endian length in front of every frame on a QEMU stream
// (the length excludes the prefix itself, QEMU net/net.c net_fill_rstate).
const PrefixLen = 4

// Deframer splits the byte stream of a QEMU stream connection into frames. It owns one
// buffer, filled by the caller through Space and Commit, and hands out frames that alias
// that buffer until the next Space call. It does no I/O, so it can be fuzzed on its own.
//
// Invariant: the buffer holds at least head+PrefixLen+hi bytes, so whenever Peek reports
// no complete frame (and no error), Space returns a non-empty slice.
//
// The first head bytes of the buffer never hold data: with them every frame has at least
// head+PrefixLen bytes in front of it inside the buffer, room a caller taking the frame
// in place may write a header into (StreamPort lends plain frames this way; see
// lendOut).
//
// A length prefix outside [lo, hi] is sticky: Peek and Next return the same *port.FrameError
// from then on, because nothing after a bad prefix can be trusted to be a frame boundary
// (QEMU drops the connection in the same case: net/net.c net_fill_rstate rejects a length
// above NET_BUFSIZE, 69632, and net/stream.c then closes the connection).
type Deframer struct {
	buf    []byte
	head   int // buf[:head] is headroom, never data
	r, w   int // buf[r:w] is received and not yet handed out
	lo, hi int // accepted frame lengths
	err    error
}

// NewDeframer returns a Deframer with a buffer of size bytes (raised to PrefixLen+hi if
// smaller) accepting frame lengths in [lo, hi].
func NewDeframer(size, lo, hi int) *Deframer { return newDeframer(size, 0, lo, hi) }

// newDeframer is NewDeframer with head bytes of headroom at the buffer's start.
func newDeframer(size, head, lo, hi int) *Deframer {
	size = max(size, head+PrefixLen+hi)
	return &Deframer{buf: make([]byte, size), head: head, r: head, w: head, lo: lo, hi: hi}
}

// Space returns the free tail of the buffer for the caller to read into, first moving any
// partial frame to the front (it is at most one frame, and every frame is copied out once
// anyway, so this costs less than a second read syscall would). Frames returned earlier
// become invalid.
func (d *Deframer) Space() []byte {
	switch {
	case d.r == d.w:
		d.r, d.w = d.head, d.head
	case d.r > d.head:
		d.w = d.head + copy(d.buf[d.head:], d.buf[d.r:d.w])
		d.r = d.head
	}
	return d.buf[d.w:]
}

// Commit records that n bytes were written into the slice Space returned.
// n outside [0, len(Space())] is a caller bug and panics.
func (d *Deframer) Commit(n int) {
	if n < 0 || n > len(d.buf)-d.w {
		panic(fmt.Sprintf("sockport: Deframer.Commit(%d) with %d bytes free", n, len(d.buf)-d.w))
	}
	d.w += n
}

// Peek returns the next complete frame without consuming it, (nil, nil) when the buffered
// bytes do not yet hold one, or a *port.FrameError for a bad length prefix.
func (d *Deframer) Peek() ([]byte, error) {
	if d.err != nil {
		return nil, d.err
	}
	avail := d.w - d.r
	if avail < PrefixLen {
		return nil, nil
	}
	l := uint64(binary.BigEndian.Uint32(d.buf[d.r:]))
	if err := port.CheckFrameLen(l, d.lo, d.hi); err != nil {
		if l == helloPrefixLen {
			err.(*port.FrameError).Hint = helloHint
		}
		d.err = err
		return nil, err
	}
	if uint64(avail-PrefixLen) < l {
		return nil, nil
	}
	start := d.r + PrefixLen
	end := start + int(l)
	return d.buf[start:end:end], nil
}

// Discard consumes the frame the last Peek returned; it does nothing if there is none.
func (d *Deframer) Discard() {
	if f, _ := d.Peek(); f != nil {
		d.r += PrefixLen + len(f)
	}
}

// consume is Discard for the frame f the last Peek returned, without parsing its
// prefix again (the reader's per-frame step: Peek was 1.7 % of the coalescing tapgro,
// called twice per frame).
func (d *Deframer) consume(f []byte) { d.r += PrefixLen + len(f) }

// Next returns and consumes the next complete frame (see Peek).
func (d *Deframer) Next() ([]byte, error) {
	f, err := d.Peek()
	if f != nil {
		d.r += PrefixLen + len(f)
	}
	return f, err
}

// Buffered is the number of received bytes not yet handed out: once the peer has gone
// (EOF or reset), anything left is a truncated record, even if it is only part of the
// length prefix.
func (d *Deframer) Buffered() int { return d.w - d.r }

// Want is the size of the record (prefix included) currently at the front: PrefixLen while
// the prefix itself is incomplete. It names the numbers in truncation errors.
func (d *Deframer) Want() int {
	if d.w-d.r < PrefixLen {
		return PrefixLen
	}
	return PrefixLen + int(binary.BigEndian.Uint32(d.buf[d.r:]))
}

// Reset forgets all buffered bytes and any sticky error, for reuse on a new connection.
func (d *Deframer) Reset() { d.r, d.w, d.err = d.head, d.head, nil }
