package datapath

import (
	"errors"
	"math"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/rxpool"
)

// TAP→port delivery: what is staged in the receive pool goes to the port in batched,
// non-blocking writes; a port that fails is dropped from this side. flatSender and
// blockingSender give ports without port.VecSender or port.BatchSender the pool's
// rxpool.Sender.

// flush hands everything staged to the port and reports whether the port is still
// usable. A failing port is dropped from the TAP→port side; the frames it could not take
// are counted, not retried, like a NIC whose cable was pulled. When the peer has simply
// gone (EPIPE, ECONNRESET) the port is left open for its port→TAP goroutine, which reads
// what the peer sent before it went, up to the end of the stream, and then ends the
// connection; any other failure closes the port at once.
func (p *tapToPort) flush(why rxpool.Reason) bool {
	st := &p.b.t2p
	staged, _ := p.pool.Queued()
	out := p.out
	if w := p.b.capture.port.Writer(); w != nil {
		p.capOut = capSender{inner: out, w: w, hl: p.hl, shm: p.ref.shm}
		out = &p.capOut
	}
	n, bytes, err := p.pool.Flush(out, why)
	st.Frames.Add(uint64(n))
	st.Bytes.Add(uint64(bytes))
	if err == nil {
		return true
	}
	st.Drops[DropPortError].Add(uint64(staged - n))
	p.pool.Discard(rxpool.DropPortError)
	if !errors.Is(err, unix.EPIPE) && !errors.Is(err, unix.ECONNRESET) {
		p.ref.p.Close()
	}
	p.b.port.CompareAndSwap(p.ref, nil)
	p.ref, p.out = nil, nil
	return false
}

// flatSender delivers the pool's Vecs to a port that takes only contiguous frames (a
// netmap port, or a Port without BatchSender): a Vec with header bytes is copied
// together into scratch first — for such a port the copy the pool no longer makes —
// and a Vec that is all body passes as it is. The scratch is allocated on first use.
type flatSender struct {
	inner   port.BatchSender
	frames  [][]byte
	scratch []byte
}

// flatScratch holds at least one largest frame with its vnet header.
const flatScratch = 1 << 20

func (s *flatSender) TryWriteVecs(v []port.Vec) (int, error) {
	if s.frames == nil {
		s.frames = make([][]byte, 512)
		s.scratch = make([]byte, flatScratch)
	}
	k, off := 0, 0
	for k < len(v) && k < len(s.frames) {
		x := &v[k]
		h := x.Head[port.VecHeadroom:]
		if len(h) == 0 {
			s.frames[k] = x.Body
			k++
			continue
		}
		n := x.Len()
		if off+n > len(s.scratch) {
			break
		}
		b := s.scratch[off : off+n : off+n]
		copy(b[copy(b, h):], x.Body)
		s.frames[k] = b
		off += n
		k++
	}
	n, err := s.inner.TryWriteBatch(s.frames[:k])
	clear(s.frames[:k])
	return n, err
}

func (s *flatSender) WaitWritable(d time.Time) error { return s.inner.WaitWritable(d) }
func (s *flatSender) Room() (int, int)               { return s.inner.Room() }

// blockingSender adapts a Port without BatchSender: WriteBatch blocks until everything
// is sent, so it never reports ErrWouldBlock and the pool never waits on it.
type blockingSender struct{ p port.Port }

func (s blockingSender) TryWriteBatch(frames [][]byte) (int, error) { return s.p.WriteBatch(frames) }
func (s blockingSender) WaitWritable(time.Time) error               { return nil }
func (s blockingSender) Room() (int, int)                           { return math.MaxInt, math.MaxInt }
