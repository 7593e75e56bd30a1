package datapath

import (
	"tapgro/rxpool"
	"tapgro/vnethdr"
)

// TAP→port segmentation: a GSO frame the port cannot take whole is split in software,
// each segment staged as headers built in a pool header slot followed by a slice of the
// TAP read buffer; headers longer than a slot take the copying vnethdr.Split.

// split segments one GSO frame without copying its payload: each segment is a vector
// of its headers, built by vnethdr.SplitHeaders in the segment's header slot (behind an
// all-zero vnet header for a vnet-hdr port), and its payload, a slice of the TAP read
// buffer that the L4 checksum was summed over in place. All segments are reserved
// before anything is built (the pool is flushed first when they do not fit), so a frame
// is never half-staged. Headers too long for a slot (rxpool.HeadCap: only IPv6 with
// long extension headers) take the copying path, splitCopy.
func (p *tapToPort) split(frame []byte) {
	st := &p.b.t2p
	pl, err := vnethdr.Plan(frame, &p.hdr)
	if err != nil {
		st.Drops[DropMalformed].Add(1)
		return
	}
	segCap, nseg := p.hl+pl.SegCap, pl.Segments
	if !p.pool.Fits(segCap, nseg) {
		p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
		return
	}
	headLen := p.hl + pl.HdrLen
	if headLen > rxpool.HeadCap {
		p.splitCopy(frame, pl)
		return
	}
	mss := pl.SegCap - pl.HdrLen
	if !p.reserveSegs(true, headLen, mss, nseg) {
		return
	}
	n, err := vnethdr.SplitHeaders(frame, &p.hdr, p.segs[:nseg], p.payloads[:nseg])
	p.finishSplit(n, err, func(i int) { p.pool.CommitVec(p.payloads[i]) })
	clear(p.payloads[:n])
}

// finishSplit commits the n segments a split of the reserved ones produced, each behind
// an all-zero header (commit(i) commits segment i), and hands back the rest; err means
// the frame was malformed, and nothing is committed.
func (p *tapToPort) finishSplit(n int, err error, commit func(i int)) {
	if err != nil {
		p.pool.Cancel()
		p.b.t2p.Drops[DropMalformed].Add(1)
		return
	}
	p.b.t2p.GSOSegmented.Add(1)
	for i := 0; i < n; i++ {
		// A plain segment behind an all-zero header: a stale GSO header on a segment
		// makes the receiver treat it as a super-frame.
		vnethdr.Zero(p.segBufs[i], p.hl)
		commit(i)
	}
	p.pool.Cancel() // segments the split did not need, if any
	if p.pool.PerFrame() {
		p.flush(rxpool.ReasonFrame)
	}
}

// reserveSegs claims nseg segments for one GSO frame, or none: vectors of headLen
// header bytes and up to bodyMax payload bytes (vec), or pool buffers of headLen bytes.
// When they do not fit now the pool is flushed first; on false the frame has been
// counted as dropped.
func (p *tapToPort) reserveSegs(vec bool, headLen, bodyMax, nseg int) bool {
	if p.tryReserveSegs(vec, headLen, bodyMax, nseg) {
		return true
	}
	if !p.flush(rxpool.ReasonPoolFull) {
		p.b.t2p.Drops[DropPortError].Add(1)
		return false
	}
	if !p.tryReserveSegs(vec, headLen, bodyMax, nseg) { // cannot happen: they Fit an empty pool
		p.b.rxStats.Drops[rxpool.DropTooBig].Add(1)
		return false
	}
	return true
}

func (p *tapToPort) tryReserveSegs(vec bool, headLen, bodyMax, nseg int) bool {
	for i := 0; i < nseg; i++ {
		var buf []byte
		var ok bool
		if vec {
			buf, ok = p.pool.ReserveVec(headLen, bodyMax)
		} else {
			buf, ok = p.pool.Reserve(headLen)
		}
		if !ok {
			p.pool.Cancel()
			return false
		}
		p.segBufs[i] = buf
		p.segs[i] = buf[p.hl:]
	}
	return true
}

// splitCopy segments one GSO frame (plan pl, which Fits the pool) straight into pool
// buffers with the copying vnethdr.Split: the path for headers longer than a header
// slot.
func (p *tapToPort) splitCopy(frame []byte, pl vnethdr.SplitPlan) {
	segCap, nseg := p.hl+pl.SegCap, pl.Segments
	if !p.reserveSegs(false, segCap, 0, nseg) {
		return
	}
	n, err := vnethdr.Split(frame, &p.hdr, p.segs[:nseg], p.segSizes[:nseg])
	p.finishSplit(n, err, func(i int) { p.pool.Commit(p.hl + p.segSizes[i]) })
}
