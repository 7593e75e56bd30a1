package datapath

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/sockport"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

// csumTCP4 is a plain frame as a TAP with CSUM hands it over: NEEDS_CSUM, the checksum
// field holding the pseudo-header sum.
func csumTCP4(hl int, seq uint32, payload []byte) []byte {
	f := tcp4(seq, 7, payload)
	tcp := f[34:]
	binary.BigEndian.PutUint16(tcp[16:], vnethdr.Fold(vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, f[26:30], f[30:34], len(tcp))))
	h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, CsumStart: 34, CsumOffset: 16}
	pkt := make([]byte, hl+len(f))
	h.Encode(pkt, hl)
	copy(pkt[hl:], f)
	return pkt
}

// wantOnWire is what the copying pipeline sent for one TAP record: vnethdr.Split's
// segments for a GSO frame, the completed frame for a partial checksum, else the frame.
func wantOnWire(t *testing.T, pkt []byte, hl int) [][]byte {
	var h vnethdr.Hdr
	if err := h.Decode(pkt, hl); err != nil {
		t.Fatal(err)
	}
	f := bytes.Clone(pkt[hl:])
	if !h.IsGSO() {
		if err := vnethdr.CompleteChecksum(f, &h); err != nil {
			t.Fatal(err)
		}
		return [][]byte{f}
	}
	out := make([][]byte, vnethdr.MaxSegments)
	for i := range out {
		out[i] = make([]byte, 2048)
	}
	sizes := make([]int, len(out))
	n, err := vnethdr.Split(f, &h, out, sizes)
	if err != nil {
		t.Fatal(err)
	}
	for i := range out[:n] {
		out[i] = out[i][:sizes[i]]
	}
	return out[:n]
}

// The TAP read buffers are not reused while anything staged points into them: the
// pipeline poisons every buffer the moment it is released (before the next TAP read),
// and a peer that stops reading forces stalls and delayed flushes mid-stream; still
// every byte on the wire is exactly what the copying pipeline sent (Split's segments,
// completed checksums), in order. A buffer released early would put 0xEE bytes on the
// wire.
func TestTapToPortBuffersNotReusedWhileStaged(t *testing.T) {
	tap := taptest.New(false)
	b := testBridge(tap, true)
	b.cfg.rx = rxpool.Config{BufSize: 2048, Bytes: 256 << 10} // pool_full flushes mid-batch too
	near, far, _ := statPair(t)
	b.port.Store(newPortRef(near))
	p := newTapToPort(b)
	var releases atomic.Int64 // read by the test while the pipeline runs
	p.onRelease = func(bufs [][]byte) {
		releases.Add(1)
		for _, buf := range bufs {
			for i := range buf {
				buf[i] = 0xee
			}
		}
	}
	done := make(chan error, 1)
	go func() { done <- p.run() }()
	defer func() { tap.Close(); near.Close(); <-done }() // a flush stuck on a full port ends too

	rng := rand.New(rand.NewPCG(5, 6))
	var want [][]byte
	var pkts [][]byte
	for i := 0; i < 1000; i++ { // ~20 MB: several socket buffers
		var pkt []byte
		switch rng.IntN(4) {
		case 0, 3:
			pkt = gsoTCP4(10, pattern(1+rng.IntN(65000)), 536+rng.IntN(1000))
		case 1:
			pkt = csumTCP4(10, uint32(i), pattern(1+rng.IntN(1460)))
		default:
			plain := tcp4(uint32(i), 1, pattern(1+rng.IntN(1460)))
			pkt = append(make([]byte, 10), plain...)
		}
		binary.BigEndian.PutUint32(pkt[10+38:], uint32(i)<<20) // tell frames apart
		if h := (vnethdr.Hdr{}); h.Decode(pkt, 10) == nil && h.Flags&vnethdr.FlagNeedsCsum == 0 {
			f := pkt[10:]
			binary.BigEndian.PutUint16(f[34+16:], 0)
			binary.BigEndian.PutUint16(f[34+16:], vnethdr.Checksum(f[34:], vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, f[26:30], f[30:34], len(f)-34)))
		}
		pkts = append(pkts, pkt)
		want = append(want, wantOnWire(t, pkt, 10)...)
	}
	go func() {
		for _, pkt := range pkts {
			if !tap.Inject(pkt) {
				return
			}
		}
	}()
	// The port fills (nobody reads far yet); the pipeline stalls inside its flush.
	for deadline := time.Now().Add(10 * time.Second); b.rxStats.Stalls.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no stall with a peer that does not read")
		}
	}
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, port.MaxFrame)
	}
	sizes := make([]int, 64)
	for got := 0; got < len(want); {
		far.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := far.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatalf("after %d of %d frames: %v", got, len(want), err)
		}
		for i := 0; i < n; i++ {
			f := bufs[i][:sizes[i]]
			if !bytes.Equal(f, want[got]) {
				t.Fatalf("frame %d of %d differs from the copying pipeline's (%d bytes, want %d; poisoned: %t)",
					got, len(want), len(f), len(want[got]), bytes.Contains(f, []byte{0xee, 0xee, 0xee, 0xee}))
			}
			got++
		}
		// Slow down now and then so the port fills again.
		if rng.IntN(4) == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if releases.Load() == 0 || b.rxStats.Stalls.Load() == 0 || b.t2p.Drops[DropPortError].Load() != 0 {
		t.Fatalf("releases %d, stalls %d, port-error drops %d", releases.Load(), b.rxStats.Stalls.Load(), b.t2p.Drops[DropPortError].Load())
	}
}

// A vnet-hdr port gets the same bytes with the zero-copy staging: GSO frames whole
// behind the port's header (a view of the read buffer), plain and split frames behind
// an all-zero header.
func TestTapToVnetPortZeroCopyBytes(t *testing.T) {
	tap := taptest.New(false)
	b := testBridge(tap, true)
	pt := &recPort{hl: sockport.VnetStreamHdrLen, accepts: vnethdr.OffloadCSUM | vnethdr.OffloadTSO4}
	b.port.Store(newPortRef(pt))
	p := newTapToPort(b)
	gso := gsoTCP4(10, pattern(30000), 1448)
	p.sizes[0] = copy(p.bufs[0], gso)
	p.process(1)
	if len(pt.got) != 1 {
		t.Fatalf("%d records, want the GSO frame whole", len(pt.got))
	}
	var h vnethdr.Hdr
	if err := h.Decode(pt.got[0], pt.hl); err != nil || !h.IsGSO() || !bytes.Equal(pt.got[0][pt.hl:], gso[10:]) {
		t.Fatalf("record: %v, header %v", err, h)
	}
	// Without TSO4 the frame is split; each segment behind a zero header is Split's.
	pt.accepts, pt.got = vnethdr.OffloadCSUM, nil
	b.port.Store(newPortRef(pt))
	p.sizes[0] = copy(p.bufs[0], gso)
	p.process(1)
	want := wantOnWire(t, gso, 10)
	if len(pt.got) != len(want) {
		t.Fatalf("%d segments, want %d", len(pt.got), len(want))
	}
	for i := range want {
		if !bytes.Equal(pt.got[i][:pt.hl], make([]byte, pt.hl)) || !bytes.Equal(pt.got[i][pt.hl:], want[i]) {
			t.Fatalf("segment %d differs", i)
		}
	}
}

// A port that takes only contiguous frames (no TryWriteVecs) gets every segment copied
// together by flatSender, more than its scratch holds per call included, in order and
// byte for byte what the copying pipeline sent.
func TestTapToPortFlatSender(t *testing.T) {
	tap := taptest.New(false)
	b := testBridge(tap, true)
	pt := &recPort{}
	b.port.Store(newPortRef(pt))
	p := newTapToPort(b)
	var want [][]byte
	for i := range p.bufs { // 64 × 64 KB: several flatScratch fills
		pkt := gsoTCP4(10, pattern(60000+i), 1448)
		binary.BigEndian.PutUint32(pkt[10+38:], uint32(i)<<20)
		p.sizes[i] = copy(p.bufs[i], pkt)
		want = append(want, wantOnWire(t, pkt, 10)...)
	}
	p.process(len(p.bufs))
	if len(pt.got) != len(want) {
		t.Fatalf("%d frames, want %d", len(pt.got), len(want))
	}
	for i := range want {
		if !bytes.Equal(pt.got[i], want[i]) {
			t.Fatalf("frame %d differs", i)
		}
	}
	if _, ok := p.out.(*flatSender); !ok {
		t.Fatalf("sender is %T, want the flattening adapter", p.out)
	}
}
