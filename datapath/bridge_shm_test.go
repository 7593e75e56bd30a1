package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"tapgro/port"
	"tapgro/sockport/sockporttest"
	"tapgro/tapdev/taptest"
)

// shmFrames builds n TAP packets (10-byte header): every third a small plain frame, the
// others 64 KB TSO frames, each numbered in its payload so order and content can be
// checked at the far TAP.
func shmFrames(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		if i%3 == 2 {
			f := tcp4(uint32(i), uint16(i), pattern(100))
			pkt := make([]byte, 10+len(f))
			copy(pkt[10:], f)
			binary.BigEndian.PutUint32(pkt[10+54:], uint32(i))
			out[i] = pkt
			continue
		}
		payload := pattern(60000 + i%1000)
		binary.BigEndian.PutUint32(payload, uint32(i))
		out[i] = gsoTCP4(10, payload, 1448)
	}
	return out
}

// Two bridges joined by a vnet-hdr=on stream with shared-memory rings: large frames
// cross by descriptor, small ones inline, and the far TAP gets every frame intact and in
// order, several times round the ring. In the stalled variant the receiver starts only
// after the sender has found its ring full, so frames that went inline while the ring was
// full sit in the stream behind descriptors and must still come out in order.
func TestShmBridgeEndToEnd(t *testing.T) {
	for _, stall := range []bool{false, true} {
		name := map[bool]string{false: "flowing", true: "stalled"}[stall]
		t.Run(name, func(t *testing.T) {
			tapA, tapB := taptest.New(false), taptest.New(true)
			a, b := testBridge(tapA, false), testBridge(tapB, false)
			near, far := sockporttest.VnetPair(t, true)
			a.port.Store(newPortRef(near))
			// The port-side capture records the frames descriptors name, not descriptors.
			portFile := filepath.Join(t.TempDir(), "port.pcap")
			if err := a.capture.set(&a.capture.port, portFile); err != nil {
				t.Fatal(err)
			}
			doneA := make(chan error, 1)
			go func() { doneA <- a.runTapToPort() }()

			in := shmFrames(900)
			for _, pkt := range in {
				tapA.Inject(pkt)
			}
			if stall {
				// Wait until the sender is stuck: its ring used up, the socket full.
				last, still := tapA.Queued(), 0
				for deadline := time.Now().Add(10 * time.Second); still < 20 && time.Now().Before(deadline); {
					time.Sleep(5 * time.Millisecond)
					if n := tapA.Queued(); n == last {
						still++
					} else {
						last, still = n, 0
					}
				}
			}
			doneB := make(chan error, 1)
			go func() { doneB <- b.runPortToTap(far) }()
			out := waitWritten(t, tapB, len(in))
			for i := range in {
				if !bytes.Equal(out[i][10:], in[i][10:]) {
					t.Fatalf("frame %d: %d bytes at the far TAP, want %d (or different content)", i, len(out[i])-10, len(in[i])-10)
				}
			}
			if len(out) != len(in) {
				t.Fatalf("far TAP got %d frames, want %d", len(out), len(in))
			}
			sent, got := near.VnetStats().ShmFramesOut.Load(), far.VnetStats().ShmFramesIn.Load()
			if sent == 0 || sent != got {
				t.Fatalf("frames by descriptor: %d sent, %d received", sent, got)
			}
			// Stalled, the ring runs out: later large frames cross the socket inline,
			// behind descriptors still in the stream.
			if stall && sent >= 600 {
				t.Fatalf("all %d large frames went by descriptor: the stall did not exhaust the ring", sent)
			}
			t.Logf("%d of 600 large frames by descriptor, ring empty %d times", sent, near.VnetStats().ShmRingFull.Load())
			far.Close()
			if err := <-doneB; !errors.Is(err, port.ErrClosed) {
				t.Fatalf("runPortToTap: %v", err)
			}
			tapA.Close()
			<-doneA
			if err := a.capture.close(); err != nil {
				t.Fatal(err)
			}
			lens := readPcap(t, portFile)
			if len(lens) != len(in) {
				t.Fatalf("port capture holds %d records, want %d", len(lens), len(in))
			}
			for i, l := range lens {
				if l != len(in[i])-10 {
					t.Fatalf("port capture record %d is %d bytes, want the %d-byte frame", i, l, len(in[i])-10)
				}
			}
		})
	}
}
