package datapath

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"tapgro/pcapio"
	"tapgro/port"
	"tapgro/rxpool"
	"tapgro/sockport/sockporttest"
	"tapgro/tapdev/taptest"
)

// readPcap returns the original length of every record in a capture file.
func readPcap(t *testing.T, path string) []int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < pcapio.FileHeaderLen || binary.LittleEndian.Uint32(b) != pcapio.MagicNanos {
		t.Fatalf("%s: not a pcap file this package writes", path)
	}
	var lens []int
	for off := pcapio.FileHeaderLen; off < len(b); {
		if len(b)-off < pcapio.RecordHeaderLen {
			t.Fatalf("%s: truncated record header at %d", path, off)
		}
		caplen := int(binary.LittleEndian.Uint32(b[off+8:]))
		lens = append(lens, int(binary.LittleEndian.Uint32(b[off+12:])))
		off += pcapio.RecordHeaderLen + caplen
		if off > len(b) {
			t.Fatalf("%s: truncated record", path)
		}
	}
	return lens
}

// Both pipelines write both captures: the TAP side sees GSO super-frames whole, the
// port side MTU frames, and the record counts follow the pipeline counters.
func TestCaptureDatapath(t *testing.T) {
	tap := taptest.New(true)
	b := testBridge(tap, true)
	dir := t.TempDir()
	tapFile, portFile := filepath.Join(dir, "tap.pcap"), filepath.Join(dir, "port.pcap")
	if err := b.capture.set(&b.capture.tap, tapFile); err != nil {
		t.Fatal(err)
	}
	if err := b.capture.set(&b.capture.port, portFile); err != nil {
		t.Fatal(err)
	}
	near, far := sockporttest.StreamPair(t)
	b.port.Store(newPortRef(near))
	p2tDone := make(chan error, 1)
	go func() { p2tDone <- b.runPortToTap(near) }()
	t2pDone := make(chan error, 1)
	go func() { t2pDone <- b.runTapToPort() }()

	// TAP→port: 5 TSO frames of 30000 bytes, 21 segments each at MSS 1448.
	const tso, tsoPayload = 5, 30000
	received := make(chan int, 1)
	go func() {
		bufs := make([][]byte, 64)
		for i := range bufs {
			bufs[i] = make([]byte, port.MaxFrame)
		}
		sizes := make([]int, 64)
		total := 0
		for total < tso*21 {
			n, err := far.ReadBatch(bufs, sizes)
			if err != nil {
				break
			}
			total += n
		}
		received <- total
	}()
	for i := 0; i < tso; i++ {
		tap.Inject(gsoTCP4(10, pattern(tsoPayload), 1448))
	}
	// port→TAP: one batch of 32 in-order segments, coalesced into GSO packets.
	var segs [][]byte
	for i := 0; i < 32; i++ {
		segs = append(segs, tcp4(uint32(1+i*1000), uint16(i), pattern(1000)))
	}
	if _, err := far.WriteBatch(segs); err != nil {
		t.Fatal(err)
	}
	if n := <-received; n != tso*21 {
		t.Fatalf("the port got %d frames, want %d", n, tso*21)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.p2t.Reads.Load() < 32 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	far.Close()
	<-p2tDone
	tap.Close()
	<-t2pDone
	if err := b.capture.close(); err != nil {
		t.Fatal(err)
	}

	tapLens, portLens := readPcap(t, tapFile), readPcap(t, portFile)
	wantTap := b.t2p.Reads.Load() + b.p2t.Frames.Load()
	wantPort := b.t2p.Frames.Load() + b.p2t.Reads.Load()
	if uint64(len(tapLens)) != wantTap || b.capture.tap.Stats().Frames.Load() != wantTap {
		t.Errorf("tap capture: %d records, counter %d; want %d (TAP reads + TAP writes)", len(tapLens), b.capture.tap.Stats().Frames.Load(), wantTap)
	}
	if uint64(len(portLens)) != wantPort || b.capture.port.Stats().Frames.Load() != wantPort {
		t.Errorf("port capture: %d records, counter %d; want %d (port writes + port reads)", len(portLens), b.capture.port.Stats().Frames.Load(), wantPort)
	}
	big := 0
	for _, l := range tapLens {
		if l > 1514 {
			big++
		}
	}
	if big < tso+1 { // the TSO frames read, and at least one GSO packet written
		t.Errorf("tap capture has %d frames over 1514 bytes, want at least %d", big, tso+1)
	}
	for _, l := range portLens {
		if l > 1514 {
			t.Errorf("port capture has a %d-byte frame; the port only carries MTU frames", l)
			break
		}
	}
	if d := b.capture.tap.Stats().Dropped.Load() + b.capture.port.Stats().Dropped.Load(); d != 0 {
		t.Errorf("%d frames dropped by capture", d)
	}
}

type nopSender struct{}

func (nopSender) TryWriteVecs(f []port.Vec) (int, error) { return len(f), nil }
func (nopSender) WaitWritable(time.Time) error           { return nil }
func (nopSender) Room() (int, int)                       { return 1 << 20, 1 << 20 }

// The capture hooks allocate nothing per frame.
func TestCaptureHooksAllocs(t *testing.T) {
	var st pcapio.Stats
	w, err := pcapio.Create(filepath.Join(t.TempDir(), "c.pcap"), pcapio.Options{}, &st)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	frames := [][]byte{make([]byte, 10+1514), make([]byte, 10+60)}
	sizes := []int{10 + 1514, 10 + 60}
	vecs := []port.Vec{{Head: make([]byte, port.VecHeadroom+10+54), Body: make([]byte, 1460)}, {Head: make([]byte, port.VecHeadroom+10+60)}}
	var p tapToPort
	if n := testing.AllocsPerRun(500, func() {
		p.capOut = capSender{inner: nopSender{}, w: w, hl: 10}
		var s rxpool.Sender = &p.capOut
		s.TryWriteVecs(vecs)
		capTapFrames(w, frames, sizes, 2, 10)
	}); n != 0 {
		t.Errorf("capture hooks allocate %v times per batch", n)
	}
}
