package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/sockport/sockporttest"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

// tcp4 builds an Ethernet/IPv4/TCP frame from 198.18.0.1:5001 to 198.18.0.2:5201 with
// correct checksums.
func tcp4(seq uint32, id uint16, payload []byte) []byte {
	f := make([]byte, 14+20+20+len(payload))
	copy(f[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(f[6:12], []byte{2, 0, 0, 0, 0, 1})
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(f)-14))
	binary.BigEndian.PutUint16(ip[4:], id)
	binary.BigEndian.PutUint16(ip[6:], 0x4000)
	ip[8], ip[9] = 64, unix.IPPROTO_TCP
	copy(ip[12:], []byte{198, 18, 0, 1, 198, 18, 0, 2})
	binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip, 0))
	tcp := f[34:]
	binary.BigEndian.PutUint16(tcp[0:], 5001)
	binary.BigEndian.PutUint16(tcp[2:], 5201)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], 1000)
	tcp[12], tcp[13] = 5<<4, 0x10
	binary.BigEndian.PutUint16(tcp[14:], 512)
	copy(tcp[20:], payload)
	binary.BigEndian.PutUint16(tcp[16:], vnethdr.Checksum(tcp, vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, ip[12:16], ip[16:20], len(tcp))))
	return f
}

// gsoTCP4 is what a TAP with TSO hands tapgro: one frame carrying len(payload) bytes with
// a GSO header and a partial checksum.
func gsoTCP4(hl int, payload []byte, mss int) []byte {
	f := tcp4(1, 100, payload)
	tcp := f[34:]
	binary.BigEndian.PutUint16(tcp[16:], vnethdr.Fold(vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, f[26:30], f[30:34], len(tcp))))
	h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOTCPv4, HdrLen: 54,
		GSOSize: uint16(mss), CsumStart: 34, CsumOffset: 16}
	pkt := make([]byte, hl+len(f))
	h.Encode(pkt, hl)
	copy(pkt[hl:], f)
	return pkt
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

func testBridge(tap tapIO, gro bool) *bridge {
	return newBridge(bridgeConfig{
		vnetHdrLen: 10, batch: 64, gro: gro, udpGRO: true, maxFlows: 64, rscInterval: 50 * time.Microsecond,
		tapAccepts: vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN,
	}, tap)
}

// TAP→port: a 64 KB TSO frame from the TAP leaves as plain MTU frames whose payloads,
// concatenated, are the original, each with valid IPv4 and TCP checksums.
func TestTapToPortSegments(t *testing.T) {
	tap := taptest.New(true)
	b := testBridge(tap, true)
	near, far := sockporttest.StreamPair(t)
	b.port.Store(&portRef{p: near})
	done := make(chan error, 1)
	go func() { done <- b.runTapToPort() }()
	defer func() { tap.Close(); <-done }()

	payload := pattern(65000)
	tap.Inject(gsoTCP4(10, payload, 1448))
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, port.MaxFrame)
	}
	sizes := make([]int, 64)
	var got []byte
	frames := 0
	for len(got) < len(payload) {
		n, err := far.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			f := bufs[i][:sizes[i]]
			if len(f) > 1514 {
				t.Fatalf("segment %d is %d bytes: larger than the MTU", frames, len(f))
			}
			lay, err := vnethdr.ParseLayout(f)
			if err != nil {
				t.Fatal(err)
			}
			if !lay.IPv4HeaderChecksumValid(f) {
				t.Fatalf("segment %d: bad IPv4 header checksum", frames)
			}
			if c := vnethdr.Checksum(f[lay.L4Off:lay.End], lay.PseudoHeaderSum(f, lay.End-lay.L4Off)); c != 0 {
				t.Fatalf("segment %d: TCP checksum does not verify", frames)
			}
			got = append(got, f[lay.PayloadOff:lay.End]...)
			frames++
		}
	}
	if !bytes.Equal(got, payload) || frames != 45 {
		t.Fatalf("got %d bytes in %d frames; want the %d-byte payload in 45", len(got), frames, len(payload))
	}
	if b.t2p.GSOSegmented.Load() != 1 {
		t.Errorf("GSOSegmented = %d, want 1", b.t2p.GSOSegmented.Load())
	}
}

// port→TAP: a burst of in-order MTU segments reaches the TAP as one GSO packet, and
// splitting that packet gives back the exact segments.
func TestPortToTapCoalesces(t *testing.T) {
	for _, timer := range []bool{false, true} {
		name := "batch"
		if timer {
			name = "timer"
		}
		t.Run(name, func(t *testing.T) {
			tap := taptest.New(true)
			b := testBridge(tap, true)
			b.cfg.timerFlush = timer
			near, far := sockporttest.StreamPair(t)
			var segs [][]byte
			for i := 0; i < 40; i++ {
				segs = append(segs, tcp4(1+uint32(i*1448), 100+uint16(i), pattern(1448)))
			}
			done := make(chan error, 1)
			go func() { done <- b.runPortToTap(near) }()
			if _, err := far.WriteBatch(segs); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(tap.Written()) == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			far.Close()
			if err := <-done; !errors.Is(err, port.ErrClosed) {
				t.Fatalf("runPortToTap ended with %v, want ErrClosed", err)
			}
			out := tap.Written()
			if len(out) != 1 {
				t.Fatalf("TAP got %d packets, want 1 GSO packet", len(out))
			}
			var h vnethdr.Hdr
			h.Decode(out[0], 10)
			if h.GSOType != vnethdr.GSOTCPv4 || h.GSOSize != 1448 || h.CsumStart != 34 || h.CsumOffset != 16 {
				t.Fatalf("header %v", h)
			}
			split := make([][]byte, 64)
			for i := range split {
				split[i] = make([]byte, 1600)
			}
			sizes := make([]int, 64)
			n, err := vnethdr.Split(out[0][10:], &h, split, sizes)
			if err != nil || n != len(segs) {
				t.Fatalf("Split = %d, %v; want %d segments", n, err, len(segs))
			}
			for i := range segs {
				if !bytes.Equal(split[i][:sizes[i]], segs[i]) {
					t.Fatalf("segment %d differs after coalescing and re-segmenting", i)
				}
			}
		})
	}
}

// BenchmarkTapToPort measures the host→guest path per 64 KB TSO frame: segmentation into
// 45 MTU frames and one writev to a stream port (drained by another goroutine).
func BenchmarkTapToPort(b *testing.B) {
	tap := taptest.New(false)
	br := testBridge(tap, true)
	near, far := sockporttest.StreamPair(b)
	benchTapToPort(b, br, near, far)
	frames := float64(br.t2p.Frames.Load())
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/frames, "ns/frame")
}

// benchTapToPort times the TAP→port pipeline on batches of eight 64 KB TSO frames sent
// to near, whose far end another goroutine drains.
func benchTapToPort(b *testing.B, br *bridge, near, far port.Port) {
	br.port.Store(newPortRef(near))
	go drain(far, nil)
	p := newTapToPort(br)
	pkt := gsoTCP4(10, pattern(65000), 1448)
	for i := range p.bufs {
		p.sizes[i] = copy(p.bufs[i], pkt)
	}
	const perBatch = 8
	b.SetBytes(int64(len(pkt) * perBatch))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.process(perBatch)
	}
	b.StopTimer()
}

// BenchmarkPortToTap measures the guest→host path per burst of 44 MTU segments: one
// port read (frames lent in place), GRO, one TAP write.
func BenchmarkPortToTap(b *testing.B) {
	tap := taptest.New(false)
	br := testBridge(tap, true)
	near, far := sockporttest.StreamPair(b)
	var segs [][]byte
	for i := 0; i < 44; i++ {
		segs = append(segs, tcp4(1+uint32(i*1448), uint16(i), pattern(1448)))
	}
	p := newPortToTap(br, 0, near) // a stream port lends its frames, as in runPortToTap
	br.coalescerFor()              // allocate the GRO engine outside the timed loop, as a connection does
	done := make(chan error, 1)
	b.SetBytes(int64(44 * 1448))
	b.ReportAllocs()
	b.ResetTimer()
	go func() { done <- p.run(near) }()
	for i := 0; i < b.N; i++ {
		// Each burst continues the same flow so it coalesces like a real stream.
		for j := range segs {
			binary.BigEndian.PutUint32(segs[j][38:], uint32(1+(i*44+j)*1448))
			ip := segs[j][14:34]
			binary.BigEndian.PutUint16(ip[4:], uint16(i*44+j))
			binary.BigEndian.PutUint16(ip[10:], 0)
			binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip, 0))
			tcp := segs[j][34:]
			binary.BigEndian.PutUint16(tcp[16:], 0)
			binary.BigEndian.PutUint16(tcp[16:], vnethdr.Checksum(tcp, vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, segs[j][26:30], segs[j][30:34], len(tcp))))
		}
		if _, err := far.WriteBatch(segs); err != nil {
			b.Fatal(err)
		}
	}
	far.Close()
	<-done
	b.StopTimer()
	b.ReportMetric(float64(br.p2t.Reads.Load())/float64(max(1, br.p2t.Frames.Load())), "segs/packet")
}

// A peer that sends and then goes away: the TAP→port write fails with EPIPE, and the
// port→TAP side still delivers everything the peer sent before it went.
func TestPeerGoneKeepsWhatItSent(t *testing.T) {
	tap := taptest.New(true)
	b := testBridge(tap, false)
	near, far := sockporttest.StreamPair(t)
	ref := newPortRef(near)
	b.port.Store(ref)
	var sent [][]byte
	for i := 0; i < 200; i++ {
		sent = append(sent, tcp4(uint32(i), uint16(i), pattern(1000)))
	}
	if _, err := far.WriteBatch(sent); err != nil {
		t.Fatal(err)
	}
	far.Close()
	// The TAP→port side writes into the dead connection first, before anyone reads.
	p := newTapToPort(b)
	pkt := make([]byte, 10+len(sent[0]))
	copy(pkt[10:], sent[0])
	p.sizes[0] = copy(p.bufs[0], pkt)
	for i := 0; i < 10 && b.port.Load() != nil; i++ {
		p.process(1)
	}
	if b.port.Load() != nil {
		t.Fatal("the TAP→port side kept a port whose peer is gone")
	}
	if err := b.runPortToTap(near); !errors.Is(err, port.ErrClosed) {
		t.Fatalf("runPortToTap: %v, want the end of the stream", err)
	}
	if got := len(tap.Written()); got != len(sent) {
		t.Fatalf("TAP got %d of the %d frames the peer sent before it went", got, len(sent))
	}
}
