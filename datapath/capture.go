package datapath

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"tapgro/pcapio"
	"tapgro/port"
	"tapgro/rxpool"
)

// Capture (--pcap-tap, --pcap-port, `tapgro ctl pcap`): the datapath goroutines write
// every frame that crosses a side into that side's pcapio.Writer.
//
//	tap side:  frames read from the TAP (runTapToPort) and written to it (tapWriter),
//	           as the kernel sees them: 64 KB GSO super-frames, vnet header left out
//	port side: frames read from the port (portToTap) and delivered to it (the receive
//	           pool's flush), as the guest sees them: MTU frames for a plain port
//
// Off, it costs one atomic pointer load per read batch or TAP write. Each side's Writer
// is written by both pipeline goroutines, so the Writer serialises them with its own
// mutex: capture is a debugging feature, and that lock is its whole cost on the packet
// path. Frames tapgro makes itself outside the pipelines (the start-up GSO probe, the
// address announcements to a new peer) are not captured.
//
// Counts: the tap capture records tap_to_port reads plus port_to_tap frames; the port
// capture records tap_to_port frames plus port_to_tap reads. Frames a port sends that
// are shorter than its vnet header are malformed and not recorded.

// capSide is one side's capture point, named for messages.
type capSide struct {
	name string
	pcapio.Point
}

// captures are the bridge's two capture points.
type captures struct {
	opt  pcapio.Options
	mu   sync.Mutex // one switch at a time, across both sides (the same-file check)
	tap  capSide
	port capSide
}

// set starts capture of side into path, or stops it for path "". The other side may
// not write the same file.
func (c *captures) set(side *capSide, path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if path != "" {
		other := &c.port
		if side == other {
			other = &c.tap
		}
		if ow := other.Writer(); ow != nil && filepath.Clean(ow.Path()) == filepath.Clean(path) {
			return fmt.Errorf("pcap %s: already the %s capture; each side needs its own file", path, other.name)
		}
	}
	return side.Set(path, c.opt)
}

// reopen is SIGHUP's: both live captures rotate (or restart after logrotate moved them).
func (c *captures) reopen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(c.tap.Reopen(), c.port.Reopen())
}

// close stops both captures, flushing them.
func (c *captures) close() error {
	return errors.Join(c.set(&c.tap, ""), c.set(&c.port, ""))
}

// capTapFrames records frames read from the TAP (each buffer starts with its vnet
// header of hl bytes).
func capTapFrames(w *pcapio.Writer, bufs [][]byte, sizes []int, n, hl int) {
	now := time.Now()
	for i := 0; i < n; i++ {
		if sizes[i] > hl {
			w.WriteFrame(now, bufs[i][hl:sizes[i]])
		}
	}
}

// capSender records the frames a port took whole, after its vnet header (hl bytes).
// It lives in tapToPort, so wrapping the port's sender allocates nothing.
type capSender struct {
	inner rxpool.Sender
	w     *pcapio.Writer
	hl    int
	shm   port.ShmSender // resolves descriptor records to the frames they name
	segs  [2][]byte
}

func (s *capSender) TryWriteVecs(frames []port.Vec) (int, error) {
	n, err := s.inner.TryWriteVecs(frames)
	if n > 0 {
		now := time.Now()
		for i := range frames[:n] {
			f := &frames[i]
			if s.shm != nil && len(f.Body) == 0 {
				if fr := s.shm.TxFrame(f.Head[port.VecHeadroom:]); fr != nil {
					s.w.WriteFrame(now, fr)
					continue
				}
			}
			if l := f.Len() - s.hl; l > 0 {
				s.segs[0], s.segs[1] = f.Head, f.Body
				s.w.WriteFrameV(now, s.segs[:], port.VecHeadroom+s.hl, l)
			}
		}
		s.segs = [2][]byte{}
	}
	return n, err
}

func (s *capSender) WaitWritable(d time.Time) error { return s.inner.WaitWritable(d) }
func (s *capSender) Room() (int, int)               { return s.inner.Room() }

// snapshot is the side's state for Snapshot.
func (s *capSide) snapshot() Capture {
	st := s.Stats()
	return Capture{State: s.Describe(), Frames: st.Frames.Load(), Dropped: st.Dropped.Load()}
}
