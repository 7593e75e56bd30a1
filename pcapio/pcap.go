package pcapio

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// File format constants (libpcap's savefile format).
const (
	MagicNanos       = 0xa1b23c4d // nanosecond-resolution timestamps
	VersionMajor     = 2
	VersionMinor     = 4
	LinkTypeEthernet = 1
	FileHeaderLen    = 24
	RecordHeaderLen  = 16

	// DefaultSnapLen is Wireshark's maximum for Ethernet: room for a 64 KB GSO
	// super-frame with its headers.
	DefaultSnapLen = 262144
	// MinSnapLen keeps Ethernet, IPv6 and TCP headers with options.
	MinSnapLen = 128
	// MinMaxBytes is the smallest size cap: a file header and a few full frames.
	MinMaxBytes = 64 << 10
	// MaxFiles bounds --pcap-files.
	MaxFiles = 100

	// DefaultFlushInterval is how far a watched capture may lag.
	DefaultFlushInterval = time.Second
	bufSize              = 256 << 10
)

// Options configures a Writer. Zero fields take the defaults.
type Options struct {
	SnapLen       int           // largest caplen written (DefaultSnapLen)
	MaxBytes      int64         // rotate before the file would exceed this; 0: no cap
	Files         int           // rotated files kept (PATH.1 … PATH.Files); 0: stop at the cap
	FlushInterval time.Duration // background flush period (DefaultFlushInterval)
}

// Validate reports options out of range.
func (o Options) Validate() error {
	if o.SnapLen != 0 && (o.SnapLen < MinSnapLen || o.SnapLen > DefaultSnapLen) {
		return fmt.Errorf("snap length %d: want %d..%d", o.SnapLen, MinSnapLen, DefaultSnapLen)
	}
	if o.MaxBytes != 0 && o.MaxBytes < MinMaxBytes {
		return fmt.Errorf("size cap %d bytes: want 0 (none) or at least %d", o.MaxBytes, MinMaxBytes)
	}
	if o.Files < 0 || o.Files > MaxFiles {
		return fmt.Errorf("rotated files %d: want 0..%d", o.Files, MaxFiles)
	}
	if o.FlushInterval < 0 {
		return fmt.Errorf("flush interval %v: want > 0", o.FlushInterval)
	}
	return nil
}

// Stats counts one capture. The caller owns it, so counts survive the Writer being
// replaced (`tapgro ctl pcap`).
type Stats struct {
	Frames    atomic.Uint64 // records written
	Bytes     atomic.Uint64 // bytes of frame data written (caplen)
	Dropped   atomic.Uint64 // frames not written: capture failed, stopped at the cap, or closed
	Rotations atomic.Uint64 // files rotated (at the cap or on Reopen)
	Errors    atomic.Uint64 // write, flush, rotate or reopen failures
}

// ErrCapReached disables a Writer with Files = 0 once its file is full.
var ErrCapReached = errors.New("pcapio: size cap reached and no rotation configured")

var errClosed = errors.New("pcapio: closed")

// Writer writes one capture file. It is safe for concurrent use.
type Writer struct {
	path  string
	names []string // PATH.1 … PATH.N, precomputed so rotation builds no strings per frame
	opt   Options
	stats *Stats

	mu      sync.Mutex
	f       *os.File
	w       *bufio.Writer
	size    int64 // bytes in the current file, buffered ones included
	err     error // non-nil: disabled
	scratch [RecordHeaderLen]byte

	stop chan struct{}
	done chan struct{}
}

// Create truncates or creates path (mode 0600: a capture holds guest traffic) and
// writes the file header. stats must not be nil.
func Create(path string, opt Options, stats *Stats) (*Writer, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	if opt.SnapLen == 0 {
		opt.SnapLen = DefaultSnapLen
	}
	if opt.FlushInterval == 0 {
		opt.FlushInterval = DefaultFlushInterval
	}
	w := &Writer{path: path, opt: opt, stats: stats, stop: make(chan struct{}), done: make(chan struct{})}
	for i := 1; i <= max(opt.Files, 1); i++ {
		w.names = append(w.names, path+"."+strconv.Itoa(i))
	}
	w.w = bufio.NewWriterSize(nil, bufSize)
	if err := w.openFresh(); err != nil {
		return nil, err
	}
	go w.flusher()
	return w, nil
}

// Path is the file the Writer writes.
func (w *Writer) Path() string { return w.path }

// SnapLen is the effective snap length.
func (w *Writer) SnapLen() int { return w.opt.SnapLen }

// Err is the failure that disabled the Writer, or nil.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == errClosed {
		return nil
	}
	return w.err
}

// openFresh creates the file at path and writes the file header. Called with mu held
// (or before the Writer is shared).
//
// The path is refused if it is a symbolic link (O_NOFOLLOW) or anything but a regular
// file: tapgro may run as root, and a capture path in a directory others can write
// would otherwise let them point it at a file of root's to truncate, or at a FIFO or
// device to hang or feed. The file is truncated only once it is known to be regular;
// O_NONBLOCK keeps the open itself from waiting for a FIFO's reader.
func (w *Writer) openFresh() error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			err = errors.New("is a symbolic link; give the file's own path")
		}
		return fmt.Errorf("pcap %s: %w", w.path, err)
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = fmt.Errorf("not a regular file (%v)", st.Mode().Type())
		}
		return fmt.Errorf("pcap %s: %w", w.path, err)
	}
	if err := f.Truncate(0); err != nil {
		f.Close()
		return fmt.Errorf("pcap %s: %w", w.path, err)
	}
	w.f = f
	w.w.Reset(f)
	var h [FileHeaderLen]byte
	putFileHeader(h[:], w.opt.SnapLen)
	w.w.Write(h[:]) // a bufio error surfaces at the next flush
	w.size = FileHeaderLen
	return nil
}

// putFileHeader fills the 24-byte pcap file header.
func putFileHeader(h []byte, snap int) {
	le := binary.LittleEndian
	le.PutUint32(h[0:], MagicNanos)
	le.PutUint16(h[4:], VersionMajor)
	le.PutUint16(h[6:], VersionMinor)
	le.PutUint32(h[8:], 0)  // thiszone: timestamps are UTC
	le.PutUint32(h[12:], 0) // sigfigs
	le.PutUint32(h[16:], uint32(snap))
	le.PutUint32(h[20:], LinkTypeEthernet)
}

// WriteFrame records one Ethernet frame seen at ts, cut to the snap length, with its
// true length. It allocates nothing and never fails: problems are counted.
func (w *Writer) WriteFrame(ts time.Time, frame []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	caplen := min(len(frame), w.opt.SnapLen)
	if !w.beginRecord(ts, len(frame), caplen) {
		return
	}
	w.w.Write(frame[:caplen])
	w.endRecord(caplen)
}

// WriteFrameV is WriteFrame for a frame of n bytes spread over segs, starting off bytes
// into them (a frame in guest memory, after its virtio-net header). Bytes the segments
// do not hold are not invented: the record is cut where they end.
func (w *Writer) WriteFrameV(ts time.Time, segs [][]byte, off, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	caplen := min(n, w.opt.SnapLen)
	have := -off
	for _, s := range segs {
		have += len(s)
	}
	caplen = max(min(caplen, have), 0)
	if !w.beginRecord(ts, n, caplen) {
		return
	}
	left := caplen
	for _, s := range segs {
		if left == 0 {
			break
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		k := min(len(s)-off, left)
		w.w.Write(s[off : off+k])
		off, left = 0, left-k
	}
	w.endRecord(caplen)
}

// beginRecord makes room for the record of a frame of length n of which c bytes are
// kept, and writes its record header; false if the frame is dropped (counted). Called
// with mu held.
func (w *Writer) beginRecord(ts time.Time, n, c int) bool {
	rec := int64(RecordHeaderLen + c)
	if w.err != nil {
		w.stats.Dropped.Add(1)
		return false
	}
	if w.opt.MaxBytes > 0 && w.size+rec > w.opt.MaxBytes && w.size > FileHeaderLen {
		if w.opt.Files == 0 {
			w.fail(ErrCapReached)
			w.stats.Dropped.Add(1)
			return false
		}
		if err := w.rotate(w.opt.Files); err != nil {
			w.fail(err)
			w.stats.Dropped.Add(1)
			return false
		}
	}
	le := binary.LittleEndian
	ns := ts.UnixNano()
	le.PutUint32(w.scratch[0:], uint32(ns/1e9))
	le.PutUint32(w.scratch[4:], uint32(ns%1e9))
	le.PutUint32(w.scratch[8:], uint32(c))
	le.PutUint32(w.scratch[12:], uint32(n))
	w.w.Write(w.scratch[:])
	return true
}

// endRecord accounts a record whose frame bytes were written to the buffer. bufio's
// error is sticky, so one check here covers every Write of the record: after a failure
// the file is in an unknown state and the Writer is disabled. Called with mu held.
func (w *Writer) endRecord(caplen int) {
	if _, err := w.w.Write(nil); err != nil { // returns bufio's sticky error, if any
		w.fail(fmt.Errorf("pcap %s: %w", w.path, err))
		w.stats.Dropped.Add(1)
		return
	}
	w.size += int64(RecordHeaderLen + caplen)
	w.stats.Frames.Add(1)
	w.stats.Bytes.Add(uint64(caplen))
}

// fail disables the Writer. Called with mu held.
func (w *Writer) fail(err error) {
	w.err = err
	w.stats.Errors.Add(1)
}

// rotate closes the current file, shifts PATH.i to PATH.i+1 (up to PATH.n), moves PATH
// to PATH.1 and opens a fresh PATH. Called with mu held.
func (w *Writer) rotate(n int) error {
	if err := w.closeFile(); err != nil {
		return err
	}
	for i := n - 1; i >= 1; i-- {
		if err := os.Rename(w.names[i-1], w.names[i]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pcap rotate: %w", err)
		}
	}
	if err := os.Rename(w.path, w.names[0]); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pcap rotate: %w", err)
	}
	w.stats.Rotations.Add(1)
	return w.openFresh()
}

// closeFile flushes and closes the current file, if any. Called with mu held.
func (w *Writer) closeFile() error {
	if w.f == nil {
		return nil
	}
	err := w.w.Flush()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.f = nil
	w.w.Reset(nil)
	if err != nil {
		return fmt.Errorf("pcap %s: %w", w.path, err)
	}
	return nil
}

// Flush writes buffered records to the file.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil || w.f == nil {
		return nil
	}
	if err := w.w.Flush(); err != nil {
		w.fail(fmt.Errorf("pcap %s: %w", w.path, err))
		return w.err
	}
	return nil
}

func (w *Writer) flusher() {
	defer close(w.done)
	t := time.NewTicker(w.opt.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.Flush()
		}
	}
}

// Reopen is for SIGHUP. When PATH is still the open file it is rotated to PATH.1 (at
// least one rotated file is kept, even with Files = 0), so the operator gets a complete
// file to read; when PATH was moved or removed (logrotate), a fresh PATH is started and
// the moved file is left alone. It clears an earlier failure, so it also restarts a
// capture that stopped at the cap or on a full disk.
func (w *Writer) Reopen() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == errClosed {
		return errClosed
	}
	// moved: PATH is no longer the open file (logrotate moved it, or it was removed).
	moved := false
	if w.f != nil {
		var a, b syscall.Stat_t
		if syscall.Fstat(int(w.f.Fd()), &a) == nil {
			moved = syscall.Stat(w.path, &b) != nil || a.Dev != b.Dev || a.Ino != b.Ino
		}
	}
	if w.err != nil && w.f != nil {
		// A failed file: what is still buffered cannot be written, and flushing
		// would only fail again.
		w.f.Close()
		w.f = nil
		w.w.Reset(nil)
	}
	var err error
	if moved {
		if err = w.closeFile(); err == nil {
			err = w.openFresh()
		}
	} else {
		err = w.rotate(max(w.opt.Files, 1))
	}
	if err != nil {
		w.fail(err)
		return err
	}
	w.err = nil
	return nil
}

// Close flushes and closes the file; later frames are counted as dropped.
func (w *Writer) Close() error {
	w.mu.Lock()
	if w.err == errClosed {
		w.mu.Unlock()
		return nil
	}
	w.err = errClosed
	err := w.closeFile()
	w.mu.Unlock()
	close(w.stop)
	<-w.done
	return err
}
