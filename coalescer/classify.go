package coalescer

import "tapgro/vnethdr"

// Classify is the first half of Add for a caller that holds frames in pieces it does
// not own (vhostnet: guest memory) and wants to copy only the frames that may merge.
// frame is the frame at its full length, of which only frame[:valid] need hold the real
// bytes (a gathered prefix); the rest is never read. in is the arrival header, as for
// Add.
//
// It returns true when the frame may be coalesced, or when the prefix is too short to
// tell: the caller then copies the whole frame behind VnetHdrLen bytes of headroom and
// hands it to Add, which decides again on the copy. It returns false when Add would
// pass the frame through: that has been done, except for the frame itself — its flow's
// held aggregate was emitted first (so the frame overtakes nothing of its own flow),
// and the decision counted as Add counts it (a segment in, one 1-segment packet out,
// the reason) — and the caller must now deliver the frame unchanged, behind its
// arrival header if that is GSO or NEEDS_CSUM and a zero one otherwise, before it
// calls into the Coalescer again.
func (c *Coalescer) Classify(frame []byte, valid int, in *vnethdr.Hdr) bool {
	p := &c.p
	var r Reason
	switch {
	case in != nil && in.IsGSO():
		c.parse(frame, p) // for the flow key only
		r = ReasonGSOInput
	case c.off:
		p.keyed, p.need = false, 0
		r = ReasonDisabled
	default:
		r = c.parse(frame, p)
	}
	if r == ReasonStarted || p.need > valid {
		return true
	}
	c.stats.Segments.Add(1)
	c.note(c.flushFlow(r), len(frame))
	c.stats.Packets.Add(1)
	c.stats.SegsPerPacket[histBucket(1)].Add(1)
	return false
}

// FlushOne emits the oldest held aggregate (counted as batch_end) and reports whether
// there was one: Flush one packet at a time, for a caller whose output may run out of
// room between packets (vhostnet's receive ring).
func (c *Coalescer) FlushOne() bool {
	if c.oldest < 0 {
		return false
	}
	i := c.oldest
	c.note(ReasonBatchEnd, c.aggs[i].end)
	c.emitAgg(i)
	return true
}

// FlushOneExpired emits the oldest held aggregate if it started at least maxAge ns
// before now (counted as timer) and reports whether it did: FlushExpired one packet at
// a time, for the same callers as FlushOne.
func (c *Coalescer) FlushOneExpired(now, maxAge int64) bool {
	if c.oldest < 0 || now-c.aggs[c.oldest].start < maxAge {
		return false
	}
	i := c.oldest
	c.note(ReasonTimer, c.aggs[i].end)
	c.emitAgg(i)
	return true
}
