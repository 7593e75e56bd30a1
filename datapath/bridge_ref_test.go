package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/coalescer"
	"tapgro/integration/netnstest"
	"tapgro/port"
	"tapgro/tapdev"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

// The port→TAP pipeline merges a plain port's segments by reference into the ring of
// read buffers (portToTap.claim, coalescer.AddRef). These tests hand it a port that
// poisons every buffer it is given to fill, so a buffer the pipeline handed out while an
// aggregate still pointed into it would put poison on the TAP.

// scriptPort is a plain port.Port whose reads follow a script: each step is a batch of
// frames (pending says whether the next step counts as already buffered, for batch
// flush) or a pause (a read that times out: the run loop's timer, after a sleep past
// the read deadline so held aggregates have expired). Every buffer handed to ReadBatch
// is poisoned first, all of it, filled or not. After the script: port.ErrClosed.
type scriptPort struct {
	port.Port // nil: only the methods below are used
	steps     []scriptStep
	deadline  time.Time
	poison    []byte
	reads     int
}

type scriptStep struct {
	frames  [][]byte
	pending bool
	pause   time.Duration
}

func (p *scriptPort) VnetHdrLen() int                   { return 0 }
func (p *scriptPort) Accepts() vnethdr.Offloads         { return 0 }
func (p *scriptPort) Close() error                      { return nil }
func (p *scriptPort) SetReadDeadline(t time.Time) error { p.deadline = t; return nil }
func (p *scriptPort) Pending() bool                     { return len(p.steps) > 0 && p.steps[0].pending }

func (p *scriptPort) ReadBatch(bufs [][]byte, sizes []int) (int, error) {
	for _, b := range bufs {
		copy(b, p.poison)
	}
	if len(p.steps) == 0 {
		return 0, port.ErrClosed
	}
	s := p.steps[0]
	p.steps = p.steps[1:]
	if s.pause > 0 {
		time.Sleep(s.pause)
		if !p.deadline.IsZero() {
			return 0, os.ErrDeadlineExceeded
		}
	}
	if len(s.frames) > len(bufs) {
		panic("script step larger than the batch")
	}
	for i, f := range s.frames {
		sizes[i] = copy(bufs[i], f)
	}
	p.reads++
	return len(s.frames), nil
}

// scriptLender is a scriptPort that lends its frames as a QEMU-framed StreamPort does:
// records back to back in one buffer, each frame with port.ShmHeadroom bytes in front
// of it that are the previous record's tail. The whole buffer is poisoned when the loan
// ends (ReleaseLent) and before every read, so a frame used after its loan, or damaged
// by the next frame's header written into its tail too early, puts poison on the TAP.
type scriptLender struct {
	*scriptPort
	buf []byte
}

func (p *scriptLender) ReadBatchLent(bufs [][]byte, sizes []int, lent [][]byte) (int, error) {
	copy(p.buf, p.scriptPort.poison)
	n, err := p.scriptPort.ReadBatch(bufs, sizes)
	off := port.ShmHeadroom - 4 // the deframer's headroom, then the first length prefix
	for i := 0; i < n; i++ {
		start := off + 4
		copy(p.buf[start:], bufs[i][:sizes[i]])
		lent[i] = p.buf[start-port.ShmHeadroom : start+sizes[i]]
		off = start + sizes[i]
	}
	return n, err
}

func (p *scriptLender) ReleaseLent() { copy(p.buf, p.scriptPort.poison) }

// tcp4From is tcp4 from source port sport.
func tcp4From(sport uint16, seq uint32, id uint16, payload []byte, flags byte) []byte {
	f := tcp4(seq, id, payload)
	tcp := f[34:]
	binary.BigEndian.PutUint16(tcp[0:], sport)
	tcp[13] |= flags
	binary.BigEndian.PutUint16(tcp[16:], 0)
	binary.BigEndian.PutUint16(tcp[16:], vnethdr.Checksum(tcp, vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, f[26:30], f[30:34], len(tcp))))
	return f
}

// resegment turns what the TAP got back into plain frames, as the kernel would
// (vnethdr.Split for GSO packets); a plain frame must carry a zero header.
func resegment(t *testing.T, pkts [][]byte, hl int) [][]byte {
	t.Helper()
	var out [][]byte
	for _, pkt := range pkts {
		var h vnethdr.Hdr
		if err := h.Decode(pkt, hl); err != nil {
			t.Fatal(err)
		}
		frame := pkt[hl:]
		if !h.IsGSO() {
			if h != (vnethdr.Hdr{}) {
				t.Fatalf("plain frame behind header %s", h)
			}
			out = append(out, frame)
			continue
		}
		pl, err := vnethdr.Plan(frame, &h)
		if err != nil {
			t.Fatalf("TAP got an unsplittable GSO packet (%s): %v", h, err)
		}
		bufs := make([][]byte, pl.Segments)
		for i := range bufs {
			bufs[i] = make([]byte, pl.SegCap)
		}
		sizes := make([]int, pl.Segments)
		n, err := vnethdr.Split(frame, &h, bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			out = append(out, bufs[i][:sizes[i]])
		}
	}
	return out
}

// TestPortToTapRefPoisoned: several interleaved flows, more than the flow table holds
// (eviction), held across reads (timer mode, and batch mode while the port has more
// buffered), over a ring that wraps many times while aggregates are held (copy on hold),
// with pauses that let the timer flush. Every flow's frames must come back from the TAP
// exactly, in order, with no poison.
func TestPortToTapRefPoisoned(t *testing.T) {
	for _, lend := range []bool{false, true} {
		t.Run(map[bool]string{false: "ring", true: "lent"}[lend], func(t *testing.T) { testPortToTapPoisoned(t, lend) })
	}
}

// testPortToTapPoisoned is TestPortToTapRefPoisoned over the ring (by reference) or
// over frames lent in place back to back (lend: copied into aggregates, every frame's
// headroom the previous frame's tail).
func testPortToTapPoisoned(t *testing.T, lend bool) {
	for _, mode := range []struct {
		name       string
		timer      bool
		interval   time.Duration
		maxFlows   int
		pendingAll bool
		seg        int  // full segment payload
		refMin     bool // keep groRefMinPayload (else reference every aggregate)
	}{
		{"timer-held", true, time.Hour, 8, false, 1448, false},
		{"timer-expiring", true, 2 * time.Millisecond, 8, false, 1448, false},
		{"batch-pending", false, 0, 8, true, 1448, false},
		{"batch", false, 0, 64, false, 1448, false},
		{"jumbo-timer-held", true, time.Hour, 8, false, 8948, true},
		{"mtu-default", true, time.Hour, 8, false, 1448, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			tap := taptest.New(true)
			b := testBridge(tap, true)
			b.cfg.timerFlush, b.cfg.rscInterval, b.cfg.maxFlows = mode.timer, mode.interval, mode.maxFlows
			if !mode.refMin {
				b.groRefMin = 0
			}
			rng := rand.New(rand.NewPCG(7, uint64(len(mode.name))))

			const nflows = 10
			seqs := make([]uint32, nflows)
			ids := make([]uint16, nflows)
			var sent [nflows][][]byte
			var steps []scriptStep
			for range 120 {
				var batch [][]byte
				for range 1 + rng.IntN(64) {
					f := rng.IntN(nflows)
					if f >= 3 && rng.IntN(3) != 0 {
						f = rng.IntN(3) // three busy flows, seven sparse ones
					}
					size, flags := mode.seg, byte(0)
					switch r := rng.IntN(100); {
					case r < 3:
						size = 1 + rng.IntN(mode.seg-1) // short: ends the aggregate
					case r < 5:
						flags = 0x08 // PSH
					}
					payload := make([]byte, size)
					for i := range payload {
						payload[i] = byte(rng.Uint32())
					}
					fr := tcp4From(uint16(6000+f), seqs[f], ids[f], payload, flags)
					seqs[f] += uint32(size)
					ids[f]++
					sent[f] = append(sent[f], fr)
					batch = append(batch, fr)
				}
				steps = append(steps, scriptStep{frames: batch, pending: mode.pendingAll && rng.IntN(8) != 0})
				if mode.interval > 0 && mode.interval < time.Second && rng.IntN(10) == 0 {
					steps = append(steps, scriptStep{pause: 2 * mode.interval})
				}
			}
			sp := &scriptPort{steps: steps, poison: bytes.Repeat([]byte{0xdb}, 64*(16+port.MaxFrame))}
			var pt port.Port = sp
			if lend {
				pt = &scriptLender{scriptPort: sp, buf: make([]byte, len(sp.poison))}
			}
			if err := b.runPortToTap(pt); err != port.ErrClosed {
				t.Fatalf("runPortToTap: %v", err)
			}

			got := resegment(t, tap.Written(), 10)
			var per [nflows][][]byte
			for _, f := range got {
				if bytes.Contains(f, []byte{0xdb, 0xdb, 0xdb, 0xdb, 0xdb, 0xdb, 0xdb, 0xdb}) {
					// Not proof on its own (random payload may hold it), but the
					// comparison below decides.
					t.Logf("poison-like bytes in a %d-byte frame", len(f))
				}
				fi := int(binary.BigEndian.Uint16(f[34:])) - 6000
				if fi < 0 || fi >= nflows {
					t.Fatalf("TAP frame of unknown flow %d (poisoned headers?)", fi)
				}
				per[fi] = append(per[fi], f)
			}
			for fi := range nflows {
				if len(per[fi]) != len(sent[fi]) {
					t.Fatalf("flow %d: %d frames out, %d in", fi, len(per[fi]), len(sent[fi]))
				}
				for j := range sent[fi] {
					if !bytes.Equal(per[fi][j], sent[fi][j]) {
						t.Fatalf("flow %d frame %d differs (%d vs %d bytes)", fi, j, len(per[fi][j]), len(sent[fi][j]))
					}
				}
			}
			st := b.coal.Stats()
			t.Logf("%d reads, %d packets (%d GSO), eviction %d, timer %d, batch_end %d, %d bytes copied on hold",
				sp.reads, st.Packets.Load(), st.GSOOut.Load(), st.Reason(coalescer.ReasonEviction).Load(), st.Reason(coalescer.ReasonTimer).Load(), st.Reason(coalescer.ReasonBatchEnd).Load(), st.HeldCopies.Load())
			if st.GSOOut.Load() == 0 {
				t.Fatal("nothing was coalesced")
			}
			if lend {
				// No references to check: the engine copies what it keeps of lent frames.
				if st.HeldCopies.Load() != 0 || (mode.timer && st.Reason(coalescer.ReasonEviction).Load() == 0) {
					t.Fatal("lent frames were referenced, or the run did not exercise eviction")
				}
				return
			}
			switch mode.name {
			case "mtu-default":
				if st.HeldCopies.Load() != 0 {
					t.Fatal("MTU segments were referenced below groRefMinPayload")
				}
			case "timer-held", "batch-pending", "jumbo-timer-held":
				if st.Reason(coalescer.ReasonEviction).Load() == 0 || st.HeldCopies.Load() == 0 {
					t.Fatal("the run did not exercise eviction and copy on hold")
				}
			case "timer-expiring":
				if st.Reason(coalescer.ReasonTimer).Load() == 0 || st.Reason(coalescer.ReasonEviction).Load() == 0 {
					t.Fatal("the run did not exercise the timer flush and eviction")
				}
			}
			for k := range b.refRing() {
				if b.coal.Pinned(k) {
					t.Fatalf("ring buffer %d still referenced after the connection", k)
				}
			}
		})
	}
}

// TestMaxIov: an aggregate never needs more iovecs than a writev takes.
func TestMaxIov(t *testing.T) {
	if coalescer.DefaultMaxRefs+1 > tapdev.MaxIov || coalescer.MaxIovRefs+1 > tapdev.MaxIov {
		t.Fatalf("MaxRefs %d (at most %d) + 1 header iovec > tapdev.MaxIov %d",
			coalescer.DefaultMaxRefs, coalescer.MaxIovRefs, tapdev.MaxIov)
	}
}

// BenchmarkPortToTapRef is the port→TAP pipeline without a socket: batches of 64 MTU
// segments of one flow copied into the read buffers (as sockport copies them out of its
// own), through GRO to 64 KB aggregates (45 segments) on an in-memory TAP, merged by
// reference (ref: claim, AddRef, one writev per aggregate) or by copying into the
// aggregate (copy: Add, the path before). One op is one segment.
func BenchmarkPortToTapRef(b *testing.B) {
	const frames = 45 * 64 // 64 full aggregates, then the flow wraps (out of order)
	src := make([][]byte, frames)
	for i := range src {
		src[i] = tcp4(1+uint32(i*1448), uint16(i), pattern(1448))
	}
	for _, mode := range []string{"copy", "ref"} {
		b.Run(mode, func(b *testing.B) {
			br := testBridge(taptest.New(false), true)
			coal := benchPipeline(b, br, mode == "ref", src, 1448)
			st := coal.Stats()
			b.ReportMetric(float64(st.Segments.Load())/float64(st.Packets.Load()), "segs/packet")
		})
	}
}

// benchPipeline times the port→TAP pipeline of br on src, 64 frames a batch, by
// reference (ref, every size) or by copy, with b.SetBytes(seg) per op (one segment).
func benchPipeline(b *testing.B, br *bridge, ref bool, src [][]byte, seg int) *coalescer.Coalescer {
	const batch = 64
	if ref {
		br.groRefMin = 0
	}
	p := newPortToTap(br, 0, nil)
	coal := br.coalescerFor()
	p.ring = ref
	next := 0
	hl := br.cfg.vnetHdrLen
	b.SetBytes(int64(seg))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += batch {
		if p.ring {
			p.claim(coal)
		}
		for j := range batch {
			p.sizes[j] = copy(p.views[j], src[next])
			if next++; next == len(src) {
				next = 0
			}
		}
		p.consumed(batch)
		now := time.Now().UnixNano()
		for j := range batch {
			if p.ring {
				coal.AddRef(p.cur[j][:hl+p.sizes[j]], nil, now, p.tags[j])
			} else {
				coal.Add(p.cur[j][:hl+p.sizes[j]], nil, now)
			}
		}
		// No flush per batch (as while the port has more buffered): aggregates end
		// full, at 65535 bytes, and span batches.
	}
	b.StopTimer()
	coal.Flush()
	if br.p2t.Drops[DropTapError].Load() != 0 {
		b.Fatal("TAP write errors")
	}
	return coal
}

// benchTap opens a TAP (10-byte vnet header) in a namespace of its own, link up, for
// the benchmarks that need the kernel's side of a write. It skips without root.
func benchTap(b *testing.B, name string) *tapdev.Device {
	ns := netnstest.New(b, name)
	var d *tapdev.Device
	if err := ns.Do(func() (err error) {
		d, err = tapdev.Open(tapdev.Config{Name: name + "0", VnetHdrLen: 10})
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	if err := d.ConfigureLink(tapdev.LinkConfig{MTU: 1500, Up: true}); err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkPortToTapRealTap is BenchmarkPortToTapRef into a real TAP, by segment size:
// what groRefMinPayload is chosen from. The frames are addressed to another MAC, so the
// kernel builds each skb (the copy in question) and drops it in ip_rcv.
func BenchmarkPortToTapRealTap(b *testing.B) {
	d := benchTap(b, "tgbref")
	for _, seg := range []int{1448, 4344, 8948} {
		src := make([][]byte, (65000/seg)*64)
		for i := range src {
			src[i] = tcp4(1+uint32(i*seg), uint16(i), pattern(seg))
		}
		for _, mode := range []string{"copy", "ref"} {
			b.Run(fmt.Sprintf("%d/%s", seg, mode), func(b *testing.B) {
				benchPipeline(b, testBridge(d, true), mode == "ref", src, seg)
			})
		}
	}
}

// BenchmarkTapWritev is the kernel's cost of one ~64 KB GSO write into a real TAP, from
// one buffer (write), from two (writev2: header, payload) or gathered from one buffer
// per segment (writev), and write after copying the pieces together in userspace
// (copy+write; cold pieces, unlike GRO's cache-hot copy). One op is one packet.
func BenchmarkTapWritev(b *testing.B) {
	d := benchTap(b, "tgbwv")
	for _, seg := range []int{1448, 4344, 8948} {
		nseg := 65000 / seg
		pkt := gsoTCP4(10, pattern(nseg*seg), seg)
		pkt[10] = 0x02 // another destination MAC: dropped once the skb is built
		hdrEnd := 10 + 54
		iov := [][]byte{pkt[:hdrEnd]}
		for i := range nseg {
			piece := make([]byte, 64+seg) // one allocation per piece, as the ring's buffers
			copy(piece[64:], pkt[hdrEnd+i*seg:hdrEnd+(i+1)*seg])
			iov = append(iov, piece[64:])
		}
		iov2 := [][]byte{pkt[:hdrEnd], pkt[hdrEnd:]}
		for _, mode := range []string{"write", "writev2", "writev", "copy+write"} {
			b.Run(fmt.Sprintf("%d/%s", seg, mode), func(b *testing.B) {
				b.SetBytes(int64(len(pkt)))
				b.ReportAllocs()
				for b.Loop() {
					var err error
					switch mode {
					case "write":
						_, err = d.Write(pkt)
					case "writev2":
						_, err = d.Writev(iov2)
					case "writev":
						_, err = d.Writev(iov)
					default:
						off := hdrEnd
						for _, p := range iov[1:] {
							off += copy(pkt[off:], p)
						}
						_, err = d.Write(pkt)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
