package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/gsowrite"
	"tapgro/integration/netnstest"
	"tapgro/port"
	"tapgro/sockport"
	"tapgro/sockport/sockporttest"
	"tapgro/tapdev"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

// readRecords reads n records from a vnet port.
func readRecords(t testing.TB, p port.Port, n int) [][]byte {
	t.Helper()
	bufs := make([][]byte, 64)
	for i := range bufs {
		bufs[i] = make([]byte, port.MaxFrame+sockport.VnetStreamHdrLen)
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

func waitWritten(t testing.TB, tap *taptest.TAP, n int) [][]byte {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(tap.Written()) < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	out := tap.Written()
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
	tap := taptest.New(true)
	b := testBridge(tap, true)
	near, far := sockporttest.VnetPair(t, shm)
	b.port.Store(newPortRef(near))
	done := make(chan error, 1)
	go func() { done <- b.runTapToPort() }()
	defer func() { tap.Close(); <-done }()

	pkt := gsoTCP4(10, pattern(65000), 1448)
	tap.Inject(pkt)
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
	if got, want := near.VnetStats().ShmFramesOut.Load(), map[bool]uint64{false: 0, true: 1}[shm]; got != want {
		t.Fatalf("ShmFrames = %d, want %d", got, want)
	}

	// A partial checksum passes too; a plain frame gets an all-zero header.
	plain := tcp4(5, 5, pattern(100))
	pp := make([]byte, 10+len(plain))
	copy(pp[10:], plain)
	tap.Inject(pp)
	rec = readRecords(t, far, 1)[0]
	if !bytes.Equal(rec[12:], plain) || !bytes.Equal(rec[:12], make([]byte, 12)) {
		t.Fatalf("plain frame: header %x", rec[:12])
	}
}

// port→TAP over vnet-hdr=on: a GSO record from the peer is written to the TAP whole,
// and plain segments from it are still coalesced.
func TestVnetPortToTapPassesGSO(t *testing.T) {
	tap := taptest.New(true)
	b := testBridge(tap, true)
	near, far := sockporttest.VnetPair(t, false)
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
	if err := <-done; !errors.Is(err, port.ErrClosed) {
		t.Fatalf("runPortToTap: %v", err)
	}
	if b.p2t.GSOPassthrough.Load() != 1 {
		t.Fatalf("GSOPassthrough = %d", b.p2t.GSOPassthrough.Load())
	}
}

// A GSO record whose header contradicts its frame is dropped, never written: the TAP
// would refuse it with EINVAL and that must not turn offloads off.
func TestVnetPortToTapDropsBadGSO(t *testing.T) {
	tap := taptest.New(true)
	b := testBridge(tap, true)
	near, far := sockporttest.VnetPair(t, false)
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
	if len(out) != 1 || b.p2t.Drops[DropMalformed].Load() != 1 {
		t.Fatalf("%d written, %d dropped; want 1 and 1", len(out), b.p2t.Drops[DropMalformed].Load())
	}
}

// refusingTap is an in-memory TAP that answers EINVAL to the writes refuse picks, as a
// kernel that rejects their virtio_net_hdr would.
func refusingTap(refuse func(pkt []byte) bool) *taptest.TAP {
	tap := taptest.New(true)
	tap.Refuse = func(pkt []byte) error {
		if refuse(pkt) {
			return unix.EINVAL
		}
		return nil
	}
	return tap
}

// isGSO reports whether pkt (behind the in-memory TAP's 10-byte header) is a GSO write.
func isGSO(pkt []byte) bool {
	var h vnethdr.Hdr
	return h.Decode(pkt, 10) == nil && h.IsGSO()
}

// A GSO frame from a vnet-hdr port that the kernel refuses, when the kernel refuses
// tapgro's own probe frame of that kind as well, is re-sent segmented, the offload is
// switched off (sticky, reported once), and later frames of that kind are split before
// the write.
func TestVnetPortToTapEINVALFallback(t *testing.T) {
	// Every GSO write is refused, as by a kernel with a GSO bug.
	tap := refusingTap(isGSO)
	b := testBridge(tap, true)
	var mu sync.Mutex
	var killed []vnethdr.Offloads
	b.onOffloadKill = func(o vnethdr.Offloads, _ error) { mu.Lock(); killed = append(killed, o); mu.Unlock() }
	near, far := sockporttest.VnetPair(t, false)
	done := make(chan error, 1)
	go func() { done <- b.runPortToTap(near) }()
	payload := pattern(14480)
	for i := 0; i < 2; i++ {
		if _, err := far.WriteBatch([][]byte{gsoTCP4(12, payload, 1448)}); err != nil {
			t.Fatal(err)
		}
		waitWritten(t, tap, 10*(i+1))
	}
	far.Close()
	<-done
	out := tap.Written()
	if len(out) != 20 {
		t.Fatalf("TAP got %d segments, want 20", len(out))
	}
	for i, o := range out {
		if len(o) != 10+14+20+20+1448 {
			t.Fatalf("segment %d is %d bytes", i, len(o))
		}
	}
	if tap.Refusals() != 2 {
		t.Errorf("kernel saw %d GSO writes, want 2: the frame and the probe that confirms the refusal (the second frame is split before the write)", tap.Refusals())
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
	tap := taptest.New(true)
	b := testBridge(tap, true) // tapAccepts has no USO
	near, far := sockporttest.VnetPair(t, false)
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
	tap := taptest.New(false)
	b := testBridge(tap, true)
	near, far := sockporttest.VnetPair(t, false)
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
	tap := taptest.New(false)
	br := testBridge(tap, true)
	near, far := sockporttest.VnetPair(b, false)
	benchTapToPort(b, br, near, far)
}

// BenchmarkVnetPortToTap: 64 KB GSO records from a vnet-hdr=on peer to the TAP, lent
// from the stream's read buffer.
func BenchmarkVnetPortToTap(b *testing.B) {
	tap := taptest.New(false)
	br := testBridge(tap, true)
	near, far := sockporttest.VnetPair(b, false)
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
	tapA, tapB := taptest.New(false), taptest.New(false)
	a, c := testBridge(tapA, true), testBridge(tapB, true)
	near, far := sockporttest.VnetPair(b, shm)
	a.port.Store(newPortRef(near))
	doneA, doneB := make(chan error, 1), make(chan error, 1)
	go func() { doneA <- a.runTapToPort() }()
	go func() { doneB <- c.runPortToTap(far) }()
	pkt := gsoTCP4(10, pattern(65000), 1448)
	b.SetBytes(int64(len(pkt) - 10))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tapA.Inject(pkt)
	}
	for tapB.Writes() < b.N {
		time.Sleep(10 * time.Microsecond)
	}
	b.StopTimer()
	tapA.Close()
	<-doneA
	far.Close()
	<-doneB
	if got := far.VnetStats().ShmFramesIn.Load(); (got > 0) != shm {
		b.Fatalf("%d frames crossed in shared memory (shm %v)", got, shm)
	}
}

// gsoFrame6 is what a TAP with TSO6 (udp false) or USO (udp true) hands tapgro: an
// IPv6 frame from fd00:198:18::1 to fd00:198:18::2 with a GSO header and a partial
// checksum.
func gsoFrame6(hl int, udp bool, payload []byte, mss int) []byte {
	l4Len, proto, gsoType, csumOff := 20, uint8(unix.IPPROTO_TCP), uint8(vnethdr.GSOTCPv6), 16
	if udp {
		l4Len, proto, gsoType, csumOff = 8, unix.IPPROTO_UDP, vnethdr.GSOUDPL4, 6
	}
	f := make([]byte, 14+40+l4Len+len(payload))
	copy(f[0:6], []byte{2, 0, 0, 0, 0, 2})
	copy(f[6:12], []byte{2, 0, 0, 0, 0, 1})
	binary.BigEndian.PutUint16(f[12:], 0x86dd)
	ip := f[14:54]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(l4Len+len(payload)))
	ip[6], ip[7] = proto, 64
	copy(ip[8:], []byte{0xfd, 0, 1, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	copy(ip[24:], []byte{0xfd, 0, 1, 0x98, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2})
	l4 := f[54:]
	binary.BigEndian.PutUint16(l4[0:], 5001)
	binary.BigEndian.PutUint16(l4[2:], 5201)
	if udp {
		binary.BigEndian.PutUint16(l4[4:], uint16(len(l4)))
	} else {
		binary.BigEndian.PutUint32(l4[4:], 1)
		binary.BigEndian.PutUint32(l4[8:], 1000)
		l4[12], l4[13] = 5<<4, 0x10
		binary.BigEndian.PutUint16(l4[14:], 512)
	}
	copy(l4[l4Len:], payload)
	binary.BigEndian.PutUint16(l4[csumOff:], vnethdr.Fold(vnethdr.PseudoHeaderSum(proto, ip[8:24], ip[24:40], len(l4))))
	h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: gsoType, HdrLen: uint16(54 + l4Len),
		GSOSize: uint16(mss), CsumStart: 54, CsumOffset: uint16(csumOff)}
	pkt := make([]byte, hl+len(f))
	h.Encode(pkt, hl)
	copy(pkt[hl:], f)
	return pkt
}

// withHdr returns a copy of the record rec (a hl-byte header, then the frame) whose
// header mod has changed.
func withHdr(rec []byte, hl int, mod func(h *vnethdr.Hdr, frameLen int)) []byte {
	rec = bytes.Clone(rec)
	var h vnethdr.Hdr
	h.Decode(rec, hl)
	mod(&h, len(rec)-hl)
	h.Encode(rec, hl)
	return rec
}

// craftedRecords are vnet-hdr=on records (12-byte headers) whose virtio_net_hdr the
// kernel refuses with EINVAL (drivers/net/tun.c tun_get_user, include/linux/virtio_net.h
// virtio_net_hdr_to_skb) on frames that are otherwise fine: what a buggy or hostile peer
// sends to make tapgro believe the kernel refuses GSO (issue 12 item 4).
func craftedRecords() []struct {
	name string
	rec  []byte
} {
	tcp4 := gsoTCP4(12, pattern(5000), 1448)
	tcp6 := gsoFrame6(12, false, pattern(5000), 1428)
	uso4 := udpGSO4(12, pattern(5000), 1400)
	uso6 := gsoFrame6(12, true, pattern(5000), 1400)
	pastFrame := func(h *vnethdr.Hdr, n int) { h.HdrLen = uint16(n + 1) }
	byFrags := func(h *vnethdr.Hdr, _ int) { h.GSOSize = 0xffff }
	return []struct {
		name string
		rec  []byte
	}{
		{"tcp4 hdr_len past the frame", withHdr(tcp4, 12, pastFrame)},
		{"tcp4 gso_size 0xffff", withHdr(tcp4, 12, byFrags)},
		{"tcp6 hdr_len past the frame", withHdr(tcp6, 12, pastFrame)},
		{"tcp6 gso_size 0xffff", withHdr(tcp6, 12, byFrags)},
		{"uso4 hdr_len past the frame", withHdr(uso4, 12, pastFrame)},
		{"uso4 gso_size 0xffff", withHdr(uso4, 12, byFrags)},
		{"uso6 hdr_len 0xffff", withHdr(uso6, 12, func(h *vnethdr.Hdr, _ int) { h.HdrLen = 0xffff })},
		{"uso6 gso_size 0xffff", withHdr(uso6, 12, byFrags)},
		{"tcp4 ecn bit alone", withHdr(tcp4, 12, func(h *vnethdr.Hdr, _ int) { h.GSOType = vnethdr.GSOECN })},
	}
}

// kernelRefuses models the checks a Linux TAP applies to a write (drivers/net/tun.c
// tun_get_user, then include/linux/virtio_net.h virtio_net_hdr_to_skb, current
// mainline) that answer EINVAL. It leaves out the flow dissection of GSO frames without
// NEEDS_CSUM: no test here sends one.
func kernelRefuses(pkt []byte, hl int) bool {
	var h vnethdr.Hdr
	if len(pkt) < hl || h.Decode(pkt, hl) != nil {
		return true
	}
	f := pkt[hl:]
	csum := h.Flags&vnethdr.FlagNeedsCsum != 0
	start, off := int(h.CsumStart), int(h.CsumOffset)
	hdrLen := int(h.HdrLen)
	if csum && start+off+2 > hdrLen { // tun_get_user raises hdr_len to cover the field
		hdrLen = start + off + 2
	}
	if hdrLen > len(f) || len(f) < 14 || (hdrLen != 0 && hdrLen < 14) {
		return true
	}
	thlen, nhMin := 0, 20
	kind := h.GSOType &^ vnethdr.GSOECN
	if h.GSOType != vnethdr.GSONone {
		switch kind {
		case vnethdr.GSOTCPv4:
			thlen = 20
		case vnethdr.GSOTCPv6:
			thlen, nhMin = 20, 40
		case vnethdr.GSOUDP, vnethdr.GSOUDPL4:
			thlen = 8
		default:
			return true
		}
		if h.GSOSize == 0 {
			return true
		}
	}
	pOff := 0
	if csum {
		if start+max(thlen, off+2) > len(f) || start < nhMin {
			return true
		}
		pOff = start + thlen
	}
	if h.GSOType != vnethdr.GSONone {
		switch kind {
		case vnethdr.GSOUDPL4:
			if !csum || off != 6 || len(f)-pOff > int(h.GSOSize)*vnethdr.MaxUSOSegments || h.GSOType != vnethdr.GSOUDPL4 {
				return true
			}
		case vnethdr.GSOTCPv4, vnethdr.GSOTCPv6:
			if csum && off != 16 {
				return true
			}
		}
		if h.GSOSize == 0xffff { // GSO_BY_FRAGS
			return true
		}
	}
	return false
}

// modelTap is an in-memory TAP that refuses with EINVAL what kernelRefuses says a
// kernel would.
func modelTap() *taptest.TAP {
	return refusingTap(func(pkt []byte) bool { return kernelRefuses(pkt, 10) })
}

// recordingTap wraps a TAP, in-memory or real, and keeps what it took and how often it
// answered EINVAL.
type recordingTap struct {
	tapIO
	mu      sync.Mutex
	took    [][]byte
	refused int
}

func (r *recordingTap) Write(pkt []byte) (int, error) {
	n, err := r.tapIO.Write(pkt)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case err == nil:
		r.took = append(r.took, bytes.Clone(pkt))
	case errors.Is(err, unix.EINVAL):
		r.refused++
	}
	return n, err
}

func (r *recordingTap) snapshot() (took [][]byte, refused int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.took), r.refused
}

// realTap opens a TAP with a 10-byte vnet header in a namespace of its own and brings
// it up. It skips without root (fails under TAPGRO_REQUIRE_PRIV=1).
func realTap(t *testing.T) *tapdev.Device {
	t.Helper()
	ns := netnstest.New(t, "peerhdr")
	var d *tapdev.Device
	if err := ns.Do(func() (err error) {
		d, err = tapdev.Open(tapdev.Config{Name: "tgpeerhdr0", VnetHdrLen: 10})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.ConfigureLink(tapdev.LinkConfig{MTU: 1500, Up: true}); err != nil {
		t.Fatal(err)
	}
	return d
}

// A vnet-hdr=on peer cannot switch an offload off: records whose header the kernel
// refuses (hdr_len past the frame, gso_size 0xffff; TCPv4, TCPv6, USO v4 and v6) are
// dropped and counted as malformed before they reach the TAP, nothing is killed, and
// valid GSO frames sent afterwards reach the TAP whole, with the hdr_len their headers
// give. Once against a model of the kernel's checks, once against a real TAP.
func TestVnetPortToTapCraftedHeadersKillNothing(t *testing.T) {
	t.Run("model", func(t *testing.T) {
		testCraftedHeaders(t, modelTap(), vnethdr.OffloadCSUM|vnethdr.OffloadTSO4|
			vnethdr.OffloadTSO6|vnethdr.OffloadTSOECN|vnethdr.OffloadUSO)
	})
	t.Run("tap", func(t *testing.T) {
		d := realTap(t)
		testCraftedHeaders(t, d, d.Accepts())
	})
}

func testCraftedHeaders(t *testing.T, tap tapIO, accepts vnethdr.Offloads) {
	rec := &recordingTap{tapIO: tap}
	b := testBridge(rec, true)
	b.cfg.tapAccepts = accepts
	var mu sync.Mutex
	var killed []string
	b.onOffloadKill = func(o vnethdr.Offloads, _ error) { mu.Lock(); killed = append(killed, o.String()); mu.Unlock() }
	b.onGROKill = func(error) { mu.Lock(); killed = append(killed, "gro"); mu.Unlock() }
	near, far := sockporttest.VnetPair(t, false)
	done := make(chan error, 1)
	go func() { done <- b.runPortToTap(near) }()

	crafted := craftedRecords()
	for _, c := range crafted {
		if _, err := far.WriteBatch([][]byte{c.rec}); err != nil {
			t.Fatal(err)
		}
	}
	valid := []struct {
		rec    []byte
		hdrLen uint16
	}{
		{gsoTCP4(12, pattern(20000), 1448), 54},
		{gsoFrame6(12, false, pattern(20000), 1428), 74},
		{udpGSO4(12, pattern(6000), 1400), 42},
		{gsoFrame6(12, true, pattern(6000), 1400), 62},
	}
	for _, v := range valid {
		// A hdr_len hint that fits is replaced by the one the headers give.
		r := withHdr(v.rec, 12, func(h *vnethdr.Hdr, n int) { h.HdrLen = uint16(n) })
		if _, err := far.WriteBatch([][]byte{r}); err != nil {
			t.Fatal(err)
		}
	}
	uso := accepts&vnethdr.OffloadUSO == vnethdr.OffloadUSO
	want := 2 // the TCP frames; without USO the UDP ones arrive as datagrams
	if uso {
		want = 4
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if took, _ := rec.snapshot(); len(took) >= want {
			break
		}
		time.Sleep(time.Millisecond)
	}
	far.Close()
	<-done

	took, refused := rec.snapshot()
	if refused != 0 {
		t.Errorf("the TAP refused %d writes: a crafted header reached the kernel", refused)
	}
	if len(killed) != 0 || b.tapKilled.Load() != 0 || b.groKilled.Load() {
		t.Errorf("offloads killed: %v (tapKilled %s, groKilled %v)", killed, vnethdr.Offloads(b.tapKilled.Load()), b.groKilled.Load())
	}
	if got := b.p2t.Drops[DropMalformed].Load(); got != uint64(len(crafted)) {
		t.Errorf("%d records counted as malformed, want the %d crafted ones", got, len(crafted))
	}
	if b.p2t.GSOFallback.Load() != 0 {
		t.Errorf("%d GSO writes fell back to segments", b.p2t.GSOFallback.Load())
	}
	var whole []vnethdr.Hdr
	for _, pkt := range took {
		var h vnethdr.Hdr
		h.Decode(pkt, 10)
		if h.IsGSO() {
			whole = append(whole, h)
		}
	}
	if len(whole) != want {
		t.Fatalf("%d GSO frames reached the TAP whole, want %d (USO %v)", len(whole), want, uso)
	}
	for i, h := range whole {
		if h.HdrLen != valid[i].hdrLen {
			t.Errorf("GSO frame %d reached the TAP with hdr_len %d, want the %d its headers give", i, h.HdrLen, valid[i].hdrLen)
		}
	}
	for i := range want {
		if !bytes.Equal(took[i][10:], valid[i].rec[12:]) {
			t.Errorf("valid frame %d did not reach the TAP whole and unchanged", i)
		}
	}
}

// isProbe reports whether pkt is one of tapgro's probe frames (gsoprobe.go).
func isProbe(pkt []byte, hl int) bool {
	return len(pkt) >= hl+6 && bytes.Equal(pkt[hl:hl+6], []byte{0x02, 0x74, 0x61, 0x70, 0x67, 0x72})
}

// A GSO packet the kernel refuses turns its offload off only when tapgro's own probe
// frame of the same kind is refused too: if the kernel takes the probe, the refused
// packet alone is re-sent segmented and the next packet is again written whole. Both
// for a packet the GRO engine built (plain port) and one a vnet-hdr=on peer sent.
func TestGSORefusalKillsOnlyWithProbe(t *testing.T) {
	for _, vnet := range []bool{false, true} {
		for _, probeRefused := range []bool{false, true} {
			name := fmt.Sprintf("vnet=%v/probe_refused=%v", vnet, probeRefused)
			t.Run(name, func(t *testing.T) { testRefusalProbe(t, vnet, probeRefused) })
		}
	}
}

func testRefusalProbe(t *testing.T, vnet, probeRefused bool) {
	// The kernel objects to large GSO packets only, or (a GSO bug) to every one.
	tap := refusingTap(func(pkt []byte) bool { return isGSO(pkt) && (probeRefused || len(pkt) > 1000) })
	b := testBridge(tap, true)
	var mu sync.Mutex
	var killed []vnethdr.Offloads
	b.onOffloadKill = func(o vnethdr.Offloads, _ error) { mu.Lock(); killed = append(killed, o); mu.Unlock() }
	var port, far port.Port
	hl := 0
	if vnet {
		port, far = sockporttest.VnetPair(t, false)
		hl = 12
	} else {
		port, far = sockporttest.StreamPair(t)
	}
	done := make(chan error, 1)
	go func() { done <- b.runPortToTap(port) }()
	// Round r sends ten 1448-byte segments of one flow: as one GSO record from a vnet
	// peer, as ten plain frames (which the GRO engine merges) from a plain one.
	send := func(r int) {
		first := uint32(1 + r*10*1448)
		if vnet {
			pkt := gsoTCP4(12, pattern(14480), 1448)
			binary.BigEndian.PutUint32(pkt[hl+38:], first)
			tcp := pkt[hl+34:]
			binary.BigEndian.PutUint16(tcp[16:], vnethdr.Fold(vnethdr.PseudoHeaderSum(unix.IPPROTO_TCP, pkt[hl+26:hl+30], pkt[hl+30:hl+34], len(tcp))))
			if _, err := far.WriteBatch([][]byte{pkt}); err != nil {
				t.Fatal(err)
			}
			return
		}
		var segs [][]byte
		for i := 0; i < 10; i++ {
			segs = append(segs, tcp4(first+uint32(i*1448), uint16(r*10+i), pattern(1448)))
		}
		if _, err := far.WriteBatch(segs); err != nil {
			t.Fatal(err)
		}
	}
	segments := func() (n, probes int) {
		for _, o := range tap.Written() {
			if isProbe(o, 10) {
				probes++
			} else {
				n++
			}
		}
		return n, probes
	}
	for r := 0; r < 2; r++ {
		send(r)
		deadline := time.Now().Add(5 * time.Second)
		for n, _ := segments(); n < 10*(r+1) && time.Now().Before(deadline); n, _ = segments() {
			time.Sleep(time.Millisecond)
		}
	}
	far.Close()
	<-done

	n, probes := segments()
	if n != 20 {
		t.Fatalf("TAP got %d frames, want 20 segments", n)
	}
	for i, o := range tap.Written() {
		if !isProbe(o, 10) && len(o) != 10+14+20+20+1448 {
			t.Fatalf("frame %d is %d bytes, want a 1448-byte segment", i, len(o))
		}
	}
	if probeRefused {
		// Round 1: the packet and the probe are refused, the offload goes; round 2 is
		// split before the write (vnet) or never merged (GRO off for TCP).
		if tap.Refusals() != 2 || probes != 0 {
			t.Errorf("%d refusals, %d probes taken; want 2 and 0", tap.Refusals(), probes)
		}
		if len(killed) != 1 || killed[0] != vnethdr.OffloadTSO4 || !b.groKilled.Load() {
			t.Errorf("killed %v, groKilled %v; want [tso4] and true", killed, b.groKilled.Load())
		}
		return
	}
	// Each round: the packet refused, the probe taken, the packet split.
	if tap.Refusals() != 2 || probes != 2 || b.p2t.GSOFallback.Load() != 2 {
		t.Errorf("%d refusals, %d probes taken, %d fallbacks; want 2, 2, 2", tap.Refusals(), probes, b.p2t.GSOFallback.Load())
	}
	if len(killed) != 0 || b.tapKilled.Load() != 0 || b.groKilled.Load() {
		t.Errorf("killed %v, groKilled %v, although the kernel took the probe", killed, b.groKilled.Load())
	}
}

// Every probe kind (package gsowrite) is a frame the kernel model here takes, and the
// start-up probe is the TCPv4 one.
func TestProbeFramesOfEveryKind(t *testing.T) {
	for _, hl := range []int{10, 12} {
		for _, k := range probeKinds {
			if kernelRefuses(gsowrite.AppendProbe(nil, hl, k.gsoType, k.ipv6), hl) {
				t.Errorf("%s: the kernel model refuses the probe", k.name)
			}
		}
	}
	if !bytes.Equal(buildProbeFrame(10), gsowrite.AppendProbe(nil, 10, vnethdr.GSOTCPv4, false)) {
		t.Error("the start-up probe is not the TCPv4 probe")
	}
}

var probeKinds = []struct {
	name    string
	gsoType uint8
	ipv6    bool
	needs   vnethdr.Offloads
}{
	{"tcp4", vnethdr.GSOTCPv4, false, vnethdr.OffloadTSO4},
	{"tcp4 ecn", vnethdr.GSOTCPv4 | vnethdr.GSOECN, false, vnethdr.OffloadTSO4},
	{"tcp6", vnethdr.GSOTCPv6, true, vnethdr.OffloadTSO6},
	{"tcp6 ecn", vnethdr.GSOTCPv6 | vnethdr.GSOECN, true, vnethdr.OffloadTSO6},
	{"uso4", vnethdr.GSOUDPL4, false, vnethdr.OffloadUSO},
	{"uso6", vnethdr.GSOUDPL4, true, vnethdr.OffloadUSO},
}

// A real kernel takes every probe kind it has the offload for: a probe that it refused
// would turn a working offload off.
func TestProbeFramesRealTap(t *testing.T) {
	d := realTap(t)
	acc := d.Accepts()
	for _, k := range probeKinds {
		if acc&k.needs != k.needs {
			t.Logf("%s: this kernel does not take it (accepts %s)", k.name, acc)
			continue
		}
		if _, err := d.Write(gsowrite.AppendProbe(nil, 10, k.gsoType, k.ipv6)); err != nil {
			t.Errorf("%s probe: %v", k.name, err)
		}
	}
}
