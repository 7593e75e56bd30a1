package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/netmapio"
	"tapgro/vnethdr"
)

// vnetPair is streamPair for the vnet-hdr=on extension: both ends ran the hello, and
// with shm set up shared-memory rings.
func vnetPair(t testing.TB, shm bool) (a, b *netmapio.StreamPort) {
	ca, cb := connPair(t)
	errc := make(chan error, 1)
	go func() {
		var err error
		b, err = netmapio.NewVnetStreamPort(cb, nil, netmapio.VnetStreamAccepts, shm, time.Second)
		errc <- err
	}()
	a, err := netmapio.NewVnetStreamPort(ca, nil, netmapio.VnetStreamAccepts, shm, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if a.ShmActive() != shm || b.ShmActive() != shm {
		t.Fatalf("shared memory active %v/%v, want %v", a.ShmActive(), b.ShmActive(), shm)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// readRecords reads n records from a vnet port.
func readRecords(t testing.TB, p netmapio.Port, n int) [][]byte {
	t.Helper()
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, netmapio.MaxFrame+netmapio.VnetStreamHdrLen)
	}
	sizes := make([]int, 64)
	var out [][]byte
	for len(out) < n {
		k, err := p.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < k; i++ {
			out = append(out, bytes.Clone(bufs[i][:sizes[i]]))
		}
	}
	return out
}

func waitWritten(t testing.TB, tap *fakeTap, n int) [][]byte {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(tap.written()) < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	out := tap.written()
	if len(out) < n {
		t.Fatalf("TAP got %d packets, want %d", len(out), n)
	}
	return out
}

// TAP→port over vnet-hdr=on: a 64 KB TSO frame crosses as one record, its header
// converted from the TAP's 10 bytes to the stream's 12, the frame untouched.
func TestTapToVnetPortPassesGSO(t *testing.T) {
	for _, shm := range []bool{false, true} {
		t.Run(fmt.Sprintf("shm=%v", shm), func(t *testing.T) { testTapToVnetPortPassesGSO(t, shm) })
	}
}

func testTapToVnetPortPassesGSO(t *testing.T, shm bool) {
	tap := newFakeTap(10, true)
	b := testBridge(tap, true)
	near, far := vnetPair(t, shm)
	b.port.Store(newPortRef(near))
	done := make(chan error, 1)
	go func() { done <- b.runTapToPort() }()
	defer func() { close(tap.closed); <-done }()

	pkt := gsoTCP4(10, pattern(65000), 1448)
	tap.in <- pkt
	recs := readRecords(t, far, 1)
	rec := recs[0]
	if !bytes.Equal(rec[12:], pkt[10:]) {
		t.Fatalf("frame changed on the way: %d bytes, want %d", len(rec)-12, len(pkt)-10)
	}
	var got, want vnethdr.Hdr
	got.Decode(rec, 12)
	want.Decode(pkt, 10)
	if got != want {
		t.Fatalf("header %v, want %v", got, want)
	}
	if b.t2p.GSOPassthrough.Load() != 1 || b.t2p.GSOSegmented.Load() != 0 {
		t.Fatalf("passthrough %d segmented %d, want 1 and 0", b.t2p.GSOPassthrough.Load(), b.t2p.GSOSegmented.Load())
	}
	// With shared memory the 64 KB frame went by descriptor, the rest inline.
	if got, want := near.Stats().ShmFramesOut.Load(), map[bool]uint64{false: 0, true: 1}[shm]; got != want {
		t.Fatalf("ShmFrames = %d, want %d", got, want)
	}

	// A partial checksum passes too; a plain frame gets an all-zero header.
	plain := tcp4(5, 5, pattern(100))
	pp := make([]byte, 10+len(plain))
	copy(pp[10:], plain)
	tap.in <- pp
	rec = readRecords(t, far, 1)[0]
	if !bytes.Equal(rec[12:], plain) || !bytes.Equal(rec[:12], make([]byte, 12)) {
		t.Fatalf("plain frame: header %x", rec[:12])
	}
}

// port→TAP over vnet-hdr=on: a GSO record from the peer is written to the TAP whole,
// and plain segments from it are still coalesced.
func TestVnetPortToTapPassesGSO(t *testing.T) {
	tap := newFakeTap(10, true)
	b := testBridge(tap, true)
	near, far := vnetPair(t, false)
	done := make(chan error, 1)
	go func() { done <- b.runPortToTap(near) }()

	pkt := gsoTCP4(12, pattern(65000), 1448)
	if _, err := far.WriteBatch([][]byte{pkt}); err != nil {
		t.Fatal(err)
	}
	out := waitWritten(t, tap, 1)
	if !bytes.Equal(out[0][10:], pkt[12:]) {
		t.Fatalf("TAP got %d bytes, want the 64 KB frame whole", len(out[0])-10)
	}
	var h vnethdr.Hdr
	h.Decode(out[0], 10)
	if h.GSOType != vnethdr.GSOTCPv4 || h.GSOSize != 1448 || h.Flags != vnethdr.FlagNeedsCsum {
		t.Fatalf("header %v", h)
	}

	var segs [][]byte
	for i := 0; i < 10; i++ {
		f := tcp4(1+uint32(i*1448), 100+uint16(i), pattern(1448))
		rec := make([]byte, 12+len(f))
		copy(rec[12:], f)
		segs = append(segs, rec)
	}
	if _, err := far.WriteBatch(segs); err != nil {
		t.Fatal(err)
	}
	out = waitWritten(t, tap, 2)
	h.Decode(out[1], 10)
	if h.GSOType != vnethdr.GSOTCPv4 || len(out[1]) != 10+14+20+20+10*1448 {
		t.Fatalf("plain segments were not coalesced: %v, %d bytes", h, len(out[1]))
	}
	far.Close()
	if err := <-done; !errors.Is(err, netmapio.ErrClosed) {
		t.Fatalf("runPortToTap: %v", err)
	}
	if b.p2t.GSOPassthrough.Load() != 1 {
		t.Fatalf("GSOPassthrough = %d", b.p2t.GSOPassthrough.Load())
	}
}

// A GSO record whose header contradicts its frame is dropped, never written: the TAP
// would refuse it with EINVAL and that must not turn offloads off.
func TestVnetPortToTapDropsBadGSO(t *testing.T) {
	tap := newFakeTap(10, true)
	b := testBridge(tap, true)
	near, far := vnetPair(t, false)
	done := make(chan error, 1)
	go func() { done <- b.runPortToTap(near) }()
	pkt := gsoTCP4(12, pattern(5000), 1448)
	pkt[1] = vnethdr.GSOTCPv6 // an IPv4 frame
	good := gsoTCP4(12, pattern(5000), 1448)
	if _, err := far.WriteBatch([][]byte{pkt, good}); err != nil {
		t.Fatal(err)
	}
	out := waitWritten(t, tap, 1)
	far.Close()
	<-done
	if len(out) != 1 || b.p2t.DropMalformed.Load() != 1 {
		t.Fatalf("%d written, %d dropped; want 1 and 1", len(out), b.p2t.DropMalformed.Load())
	}
}

// einvalTap refuses GSO writes with EINVAL, as a kernel with a GSO bug would.
type einvalTap struct {
	*fakeTap
	refused int
}

func (e *einvalTap) Write(pkt []byte) (int, error) {
	var h vnethdr.Hdr
	if h.Decode(pkt, e.hl) == nil && h.IsGSO() {
		e.mu.Lock()
		e.refused++
		e.mu.Unlock()
		return 0, unix.EINVAL
	}
	return e.fakeTap.Write(pkt)
}

// A GSO frame from a vnet-hdr port that the kernel refuses is re-sent segmented, the
// offload is switched off (sticky, reported once), and later frames of that kind are
// split before the write.
func TestVnetPortToTapEINVALFallback(t *testing.T) {
	tap := &einvalTap{fakeTap: newFakeTap(10, true)}
	b := testBridge(tap, true)
	var mu sync.Mutex
	var killed []vnethdr.Offloads
	b.onOffloadKill = func(o vnethdr.Offloads, _ error) { mu.Lock(); killed = append(killed, o); mu.Unlock() }
	near, far := vnetPair(t, false)
	done := make(chan error, 1)
	go func() { done <- b.runPortToTap(near) }()
	payload := pattern(14480)
	for i := 0; i < 2; i++ {
		if _, err := far.WriteBatch([][]byte{gsoTCP4(12, payload, 1448)}); err != nil {
			t.Fatal(err)
		}
		waitWritten(t, tap.fakeTap, 10*(i+1))
	}
	far.Close()
	<-done
	out := tap.written()
	if len(out) != 20 {
		t.Fatalf("TAP got %d segments, want 20", len(out))
	}
	for i, o := range out {
		if len(o) != 10+14+20+20+1448 {
			t.Fatalf("segment %d is %d bytes", i, len(o))
		}
	}
	if tap.refused != 1 {
		t.Errorf("kernel saw %d GSO writes, want 1 (the second frame is split before the write)", tap.refused)
	}
	if len(killed) != 1 || killed[0] != vnethdr.OffloadTSO4 {
		t.Errorf("offloads reported killed: %v, want [tso4]", killed)
	}
	if b.p2t.GSOFallback.Load() != 1 || !b.groKilled.Load() {
		t.Errorf("fallback %d groKilled %v", b.p2t.GSOFallback.Load(), b.groKilled.Load())
	}
}

// udpGSO4 is a USO frame: one UDP datagram header, payload to be cut into mss pieces.
func udpGSO4(hl int, payload []byte, mss int) []byte {
	f := make([]byte, 14+20+8+len(payload))
	copy(f[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(f[6:12], []byte{2, 0, 0, 0, 0, 1})
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(f)-14))
	ip[8], ip[9] = 64, unix.IPPROTO_UDP
	copy(ip[12:], []byte{198, 18, 0, 1, 198, 18, 0, 2})
	binary.BigEndian.PutUint16(ip[10:], vnethdr.Checksum(ip, 0))
	udp := f[34:]
	binary.BigEndian.PutUint16(udp[0:], 5001)
	binary.BigEndian.PutUint16(udp[2:], 5201)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	binary.BigEndian.PutUint16(udp[6:], vnethdr.Fold(vnethdr.PseudoHeaderSum(unix.IPPROTO_UDP, ip[12:16], ip[16:20], len(udp))))
	h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOUDPL4, HdrLen: 42,
		GSOSize: uint16(mss), CsumStart: 34, CsumOffset: 6}
	pkt := make([]byte, hl+len(f))
	h.Encode(pkt, hl)
	copy(pkt[hl:], f)
	return pkt
}

// A USO frame from the peer to a TAP that does not take USO (a 6.1 kernel) is split
// into checksummed datagrams before the write; the TAP never sees UDP_L4 GSO.
func TestVnetPortToTapSplitsUSOForOldKernel(t *testing.T) {
	tap := newFakeTap(10, true)
	b := testBridge(tap, true) // tapAccepts has no USO
	near, far := vnetPair(t, false)
	done := make(chan error, 1)
	go func() { done <- b.runPortToTap(near) }()
	if _, err := far.WriteBatch([][]byte{udpGSO4(12, pattern(4000), 1400)}); err != nil {
		t.Fatal(err)
	}
	out := waitWritten(t, tap, 3)
	far.Close()
	<-done
	var total int
	for i, o := range out {
		var h vnethdr.Hdr
		h.Decode(o, 10)
		if h.IsGSO() {
			t.Fatalf("datagram %d written as GSO", i)
		}
		f := o[10:]
		lay, err := vnethdr.ParseLayout(f)
		if err != nil {
			t.Fatal(err)
		}
		if c := vnethdr.Checksum(f[lay.L4Off:lay.End], lay.PseudoHeaderSum(f, lay.End-lay.L4Off)); c != 0 {
			t.Fatalf("datagram %d: UDP checksum does not verify", i)
		}
		total += lay.PayloadLen()
	}
	if total != 4000 || b.p2t.GSOSegmented.Load() != 1 {
		t.Fatalf("payload %d (want 4000), segmented %d", total, b.p2t.GSOSegmented.Load())
	}
}

// The TAP→port path to a vnet port allocates nothing per batch either.
func TestTapToVnetPortZeroAllocs(t *testing.T) {
	tap := newFakeTap(10, false)
	b := testBridge(tap, true)
	near, far := vnetPair(t, false)
	b.port.Store(newPortRef(near))
	go drain(far, nil)
	p := newTapToPort(b)
	fillMixed(p)
	if allocs := testing.AllocsPerRun(100, func() { p.process(8) }); allocs != 0 {
		t.Fatalf("%v allocations per batch, want 0", allocs)
	}
}

// BenchmarkTapToVnetPort: 64 KB TSO frames passed whole to a vnet-hdr=on stream.
func BenchmarkTapToVnetPort(b *testing.B) {
	tap := newFakeTap(10, false)
	br := testBridge(tap, true)
	near, far := vnetPair(b, false)
	benchTapToPort(b, br, near, far)
}

// BenchmarkVnetPortToTap: 64 KB GSO records from a vnet-hdr=on peer to the TAP, lent
// from the stream's read buffer.
func BenchmarkVnetPortToTap(b *testing.B) {
	tap := newFakeTap(10, false)
	br := testBridge(tap, true)
	near, far := vnetPair(b, false)
	done := make(chan error, 1)
	pkt := gsoTCP4(12, pattern(65000), 1448)
	batch := [][]byte{pkt, pkt, pkt, pkt}
	b.SetBytes(int64(len(pkt) * len(batch)))
	b.ReportAllocs()
	b.ResetTimer()
	go func() { done <- br.runPortToTap(near) }()
	for i := 0; i < b.N; i++ {
		if _, err := far.WriteBatch(batch); err != nil {
			b.Fatal(err)
		}
	}
	far.Close()
	<-done
}

// BenchmarkVnetEndToEnd: 64 KB TSO frames from one bridge's TAP to another's across a
// vnet-hdr=on stream, both pipelines running. With shared-memory rings frames are read
// into ring slots and written from them, so only descriptors cross the socket; over the
// socket each frame is copied into the pool, through the socket, and out of it.
func BenchmarkVnetEndToEnd(b *testing.B) {
	for _, shm := range []bool{true, false} {
		b.Run(map[bool]string{true: "shm", false: "socket"}[shm], func(b *testing.B) { benchVnetEndToEnd(b, shm) })
	}
}

func benchVnetEndToEnd(b *testing.B, shm bool) {
	tapA, tapB := newFakeTap(10, false), newFakeTap(10, false)
	a, c := testBridge(tapA, true), testBridge(tapB, true)
	near, far := vnetPair(b, shm)
	a.port.Store(newPortRef(near))
	doneA, doneB := make(chan error, 1), make(chan error, 1)
	go func() { doneA <- a.runTapToPort() }()
	go func() { doneB <- c.runPortToTap(far) }()
	pkt := gsoTCP4(10, pattern(65000), 1448)
	b.SetBytes(int64(len(pkt) - 10))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tapA.in <- pkt
	}
	for tapB.writes() < b.N {
		time.Sleep(10 * time.Microsecond)
	}
	b.StopTimer()
	close(tapA.closed)
	<-doneA
	far.Close()
	<-doneB
	if got := far.Stats().ShmFramesIn.Load(); (got > 0) != shm {
		b.Fatalf("%d frames crossed in shared memory (shm %v)", got, shm)
	}
}
