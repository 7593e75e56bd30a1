package netmapio

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"tapgro/port"
)

// checkLeaks fails the test if goroutines started during it are still running after
// cleanup (polling briefly, since closed files wake their goroutines asynchronously).
func checkLeaks(t *testing.T) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > before {
			buf := make([]byte, 1<<16)
			t.Errorf("goroutine leak: %d before, %d after\n%s", before, n, buf[:runtime.Stack(buf, true)])
		}
	})
}

// frame returns an n-byte frame whose bytes identify it (tag) and its position.
func frame(n int, tag byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = tag ^ byte(i) ^ byte(i>>8)
	}
	return b
}

func makeBufs(n, size int) ([][]byte, []int) {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return bufs, make([]int, n)
}

// readFrames reads from p until want frames arrived and checks them against want.
func readFrames(t testing.TB, p port.Port, want [][]byte) {
	t.Helper()
	bufs, sizes := makeBufs(64, port.MaxFrame)
	got := 0
	for got < len(want) {
		n, err := p.ReadBatch(bufs, sizes)
		if err != nil {
			t.Fatalf("ReadBatch after %d of %d frames: %v", got, len(want), err)
		}
		for i := 0; i < n; i++ {
			if got >= len(want) {
				t.Fatalf("more frames than sent")
			}
			if !bytes.Equal(bufs[i][:sizes[i]], want[got]) {
				t.Fatalf("frame %d: got %d bytes, want %d (content differs)", got, sizes[i], len(want[got]))
			}
			got++
		}
	}
}
