//go:build linux

package vhostnet

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/coalescer"
	"tapgro/tapdev"
	"tapgro/vhostuser"
	"tapgro/vnethdr"
)

// GRO toward the TAP (guest → TAP). A guest that sends MTU-sized TCP segments (it did
// not ack HOST_TSO4/6, or runs `ethtool -K eth0 tso off gso off`, which QEMU 7.2 never
// passes to a vhost-user back-end) would cost the host stack one skb per 1448 bytes.
// Each TX worker runs the frames through package coalescer — the stream path's engine,
// its merge rules and counters — so the TAP receives 64 KB TCP GSO packets, which
// tun_get_user always accepts on write (drivers/net/tun.c → virtio_net_hdr_to_skb takes
// VIRTIO_NET_HDR_GSO_TCPV4/6 and _ECN whatever TUNSETOFFLOAD says).
//
// Only the segments the engine may merge are copied, and their payload once. tx has
// gathered the frame's first validatePrefix bytes (or all of it) into private memory,
// st.lin, once (the guest may rewrite its own at any time, and parse must never see
// bytes change under it), and Coalescer.Classify decides from that copy. A merge
// candidate goes to Coalescer.AddSplit as that prefix plus the rest where it lies in
// guest memory: the engine decides on the prefix and copies the rest straight into the
// aggregate, checksummed in the same read, as the stream path's lent frames go in (a
// frame it does not keep it gathers first). Anything else — the guest's GSO frames,
// ACKs, non-TCP — has had its flow's held aggregate emitted first and is then written
// from guest memory as before, so a flow's frames never overtake each other. A prefix
// too short for the headers (IPv6 extension headers past 512 bytes) counts as a
// candidate: the engine gathers the frame and decides on the full copy.

// txGRO is one TX worker's engine and the buffers its output is written from.
type txGRO struct {
	n    *Net
	st   *txState   // the worker's: the EINVAL fallback's probe and splitter
	q    *queuePair // the worker's pair: its TAP queue and counters
	c    *coalescer.Coalescer
	buf  []byte   // [12 headroom][frame]: a merge candidate's private prefix (all of it for Add)
	rest [][]byte // the rest of a merge candidate, in guest memory (AddSplit)
	iov  [][]byte // emit's writev: our header for the TAP's length, then the packet
	hdr  [vnethdr.LenMrgRxbuf]byte

	timer    bool  // --gro-flush timer: aggregates may outlive a batch, by interval at most
	interval int64 // ns
	udp      bool  // UDP is coalesced too (Net.UDPGROActive when the engine was configured)
}

// groHdrLen is the engine's header length. It is fixed at 12 whatever the session's
// header length: emit re-encodes each packet's header for the TAP's length in effect, so
// a SET_FEATURES that changes it between batches (timer mode may hold aggregates
// across them) never needs the engine reconfigured.
const groHdrLen = vnethdr.LenMrgRxbuf

// newTXGRO builds a TX worker's engine: at the worker's start with GRO on, else at the
// first batch after SetGRO turned it on (the one allocation a switch costs).
func (n *Net) newTXGRO(st *txState) *txGRO {
	g := &txGRO{n: n, st: st, q: st.pair, buf: make([]byte, groHdrLen+MaxFrame), iov: make([][]byte, 2), rest: make([][]byte, 0, 16),
		timer: n.timerFlush, interval: n.rscInterval.Nanoseconds(), udp: n.UDPGROActive()}
	g.c = coalescer.New(g.config(), g.emit)
	return g
}

func (g *txGRO) config() coalescer.Config {
	return coalescer.Config{
		MaxFlows:   g.n.maxFlows,
		VnetHdrLen: groHdrLen,
		// CWR may start an aggregate (GSO_ECN on write is always accepted, above). UDP
		// only with --udp-gro, on a TAP that takes UDP_L4 on write (Net.UDPGROActive):
		// the engine's rules are the stream path's (coalescer: equal-sized datagrams
		// with checksums, at most 64 per packet).
		ECN:   true,
		UDP:   g.udp,
		Stats: &g.n.stats.GRO,
	}
}

// groBatch takes up SetGRO at the start of a TX batch, and reports whether this batch
// runs the engine. Turned off, the engine first writes what it holds, before any frame
// of the batch, so a flow's frames stay in order; it is kept for a later switch on.
func (n *Net) groBatch(st *txState) bool {
	on := n.GROActive()
	if on && st.gro == nil {
		st.gro = n.newTXGRO(st)
	}
	if st.gro == nil {
		return false
	}
	if !on {
		if st.gro.c.Held() > 0 {
			st.gro.c.Flush()
		}
		return false
	}
	st.gro.beginBatch()
	return true
}

// beginBatch takes up a switch of UDP coalescing (SetUDPGRO) at the start of a batch;
// what the engine held under the old setting is written first.
func (g *txGRO) beginBatch() {
	if udp := g.n.UDPGROActive(); udp != g.udp {
		g.udp = udp
		g.c.SetConfig(g.config())
	}
}

// offer runs one validated guest frame (header h, frameLen bytes in c.Iov after ringHL
// header bytes, the first k of them already copied into st.lin) through the engine. It
// returns true if the engine took it (copied: the chain may be completed now), false if
// the caller must write it itself, now (its flow holds nothing any more).
func (g *txGRO) offer(st *txState, c vhostuser.Chain, ringHL, frameLen, k int, h *vnethdr.Hdr) bool {
	if !g.c.Classify(st.lin[:frameLen], k, h) {
		return false
	}
	buf := g.buf[:groHdrLen+frameLen]
	copy(buf[groHdrLen:], st.lin[:k])
	if cw := g.n.capture.Writer(); cw != nil || k == frameLen {
		// Whole here already, or wanted whole by the capture: as the guest sent it,
		// before the engine rewrites headers.
		vhostuser.CopyFrom(buf[groHdrLen+k:], c.Iov, ringHL+k)
		if cw != nil {
			cw.WriteFrame(time.Now(), buf[groHdrLen:])
		}
		g.c.Add(buf, h, time.Now().UnixNano())
	} else {
		// The rest of the frame goes from guest memory straight into its aggregate,
		// read once (coalescer.AddSplit).
		g.rest = vhostuser.AppendFrom(g.rest[:0], c.Iov, ringHL+k)
		g.c.AddSplit(buf, k, g.rest, h, time.Now().UnixNano())
		clear(g.rest) // no view of guest memory outlives the frame
	}
	g.n.stats.TXFrames.Add(1)
	g.n.stats.TXBytes.Add(uint64(frameLen))
	g.q.stats.TXFrames.Add(1)
	g.q.stats.TXBytes.Add(uint64(frameLen))
	return true
}

// emit writes one engine packet ([12-byte header][frame]) to the TAP, under the batch's
// read lock (n.tapHdr is stable). A packet the TAP refuses is counted as a tx_tap drop;
// one it cannot take now (its send buffer full, which tun's INT_MAX default makes
// practically impossible) is dropped too rather than wait inside the batch: the
// segments were taken from the guest, and TCP retransmits them.
func (g *txGRO) emit(pkt []byte) {
	n := g.n
	var h vnethdr.Hdr
	if h.Decode(pkt, groHdrLen) != nil {
		return
	}
	tapHL := n.tapHdr
	h.Encode(g.hdr[:], tapHL)
	g.iov[0], g.iov[1] = g.hdr[:tapHL], pkt[groHdrLen:]
	_, err := g.q.tap.TryWritev(g.iov)
	g.iov[1] = nil
	switch {
	case err == nil:
		if cw := n.tapCap.Writer(); cw != nil {
			cw.WriteFrame(time.Now(), pkt[groHdrLen:])
		}
	case errors.Is(err, unix.EINVAL) && h.IsGSO():
		// A kernel that refuses TCP GSO writes (fallback.go): sent as segments.
		n.refused(g.st, pkt[groHdrLen:], &h, err, false)
	default:
		n.stats.Drops[DropTXTAP].Add(1)
		if errors.Is(err, tapdev.ErrWouldBlock) {
			n.stats.TXBlocked.Add(1)
		}
	}
}

// endBatch applies the flush policy at the end of a TX batch (under the read lock).
// idle says the worker is about to wait (the ring is empty, or the TAP is full): then
// everything held is written, since nothing is held while the worker sleeps — a guest
// that sent its last segment and waits for the ACK would otherwise stall, and Go's
// timers are too coarse (netpoll waits in milliseconds) to wake a worker for a 50 µs
// deadline without losing the kicks that arrive meanwhile. A batch that ended on its
// budget is followed at once by the next one: batch mode (--gro-flush batch) flushes
// anyway, timer mode keeps what is younger than --rsc-interval so the next batch can
// extend it, like the stream path's timer holding aggregates across reads.
func (g *txGRO) endBatch(idle bool) {
	if !g.timer || idle {
		g.c.Flush()
		return
	}
	g.c.FlushExpired(time.Now().UnixNano(), g.interval)
}

// flushAll emits everything held (the worker is ending).
func (g *txGRO) flushAll() {
	if g == nil || g.c.Held() == 0 {
		return
	}
	g.n.mu.RLock()
	g.c.Flush()
	g.n.mu.RUnlock()
}
