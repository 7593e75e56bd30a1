package coalescer

import (
	"math/bits"

	"tapgro/vnethdr"
)

// AddSplit is Add for a frame whose first valid bytes the caller has copied into buf
// (after the VnetHdrLen headroom) and whose remaining len(buf)-VnetHdrLen-valid bytes
// still lie in rest, in order: a vhost-user guest's descriptor chain in guest memory,
// which the guest may rewrite at any time. buf must be the frame's full length; what it
// holds past valid is scratch.
//
// Decisions, counters and output are exactly Add's on the same bytes. The difference is
// the copy: Add's caller must first gather the whole frame into buf, and a merged
// segment's payload is then copied a second time, into its aggregate. Here the payload
// past valid goes from rest straight into the aggregate, checksummed in the same pass
// (vnethdr.SumCopy). A frame that is not coalesced is gathered into buf first and leaves
// as Add's would.
//
// Each byte of rest is read at most once: every decision is made on buf's private
// prefix (a frame whose headers reach past valid is gathered before it is parsed
// again), the checksum is over the very bytes copied, and a segment that fails it is
// passed through from that copy. rest is not used after AddSplit returns.
func (c *Coalescer) AddSplit(buf []byte, valid int, rest [][]byte, in *vnethdr.Hdr, now int64) {
	vl := c.cfg.VnetHdrLen
	if len(buf) < vl || valid >= len(buf)-vl {
		c.add(buf, in, now, -1)
		return
	}
	sp := &c.sp
	sp.on, sp.valid, sp.read, sp.rest, sp.ri, sp.roff = true, valid, valid, rest, 0, 0
	c.add(buf, in, now, -1)
	sp.on, sp.rest = false, nil
}

// splitSrc is the frame of an AddSplit in progress: frame bytes [0, valid) are in the
// caller's buffer, [valid, len) in rest; [valid, read) have been read from rest.
type splitSrc struct {
	on          bool
	valid, read int
	rest        [][]byte
	ri, roff    int // rest[ri][roff] is frame byte read
}

// headersPrivate reports whether the decision parse made on the frame in c.p rests on
// bytes of the private prefix only, headers and TCP options included; otherwise the
// frame must be gathered and parsed again.
func (s *splitSrc) headersPrivate(p *pkt) bool {
	return p.need <= s.valid && p.payOff <= s.valid
}

// readInto copies frame bytes [from, to) into dst, the private prefix from frame and the
// rest from s.rest, which must not have been read past from. With sum it returns the
// bytes' ones'-complement sum folded to 16 bits, as vnethdr.Fold(vnethdr.Sum(frame[from:
// to], 0)) would on the flat frame (a piece at an odd offset adds its sum byte-swapped,
// RFC 1071 section 2(B)).
func (s *splitSrc) readInto(dst, frame []byte, from, to int, sum bool) uint16 {
	var acc uint64 // Sum accumulator of the bytes copied, as if they were one slice
	n := 0         // bytes copied so far
	if from < s.valid {
		end := min(to, s.valid)
		if sum {
			acc = vnethdr.SumCopy(dst, frame[from:end], 0)
		} else {
			copy(dst, frame[from:end])
		}
		n, from = end-from, end
	}
	if from >= to {
		return vnethdr.Fold(acc)
	}
	s.skipTo(from)
	for from < to {
		piece := s.rest[s.ri][s.roff:]
		k := min(len(piece), to-from)
		switch {
		case !sum:
			copy(dst[n:], piece[:k])
		case n&1 == 0:
			acc = vnethdr.SumCopy(dst[n:], piece[:k], acc)
		default:
			// At an odd offset the piece's bytes sit in the other half of each 16-bit
			// word: its own sum, byte-swapped (RFC 1071 section 2(B)).
			f := bits.ReverseBytes16(vnethdr.Fold(vnethdr.SumCopy(dst[n:], piece[:k], 0)))
			acc = uint64(vnethdr.Fold(acc)) + uint64(f)
		}
		n, from = n+k, from+k
		s.advance(k)
	}
	return vnethdr.Fold(acc)
}

// skipTo checks that the rest cursor is at frame offset off: rest is read strictly in
// order, each byte once, so a read that does not start where the last one ended is a
// bug in this package.
func (s *splitSrc) skipTo(off int) {
	if off != s.read {
		panic("coalescer: AddSplit would read rest out of order")
	}
}

func (s *splitSrc) advance(k int) {
	s.read += k
	for k > 0 {
		left := len(s.rest[s.ri]) - s.roff
		if k < left {
			s.roff += k
			return
		}
		k -= left
		s.ri, s.roff = s.ri+1, 0
	}
	for s.ri < len(s.rest) && s.roff == len(s.rest[s.ri]) {
		s.ri, s.roff = s.ri+1, 0
	}
}

// flatten makes the frame in the caller's buffer whole for a pass-through: bytes of rest
// already read come back from copied (copied[x] holds frame byte x, for x in [valid,
// read); nil when nothing was read), the others are read now. The split ends.
func (c *Coalescer) flatten(frame, copied []byte) {
	s := &c.sp
	if !s.on {
		return
	}
	if s.read > s.valid {
		copy(frame[s.valid:s.read], copied[s.valid:s.read])
	}
	if s.read < len(frame) {
		s.readInto(frame[s.read:], frame, s.read, len(frame), false)
	}
	s.on = false
}
