package pcapio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// record is one record read back from a file.
type record struct {
	sec, nsec, caplen, origlen uint32
	data                       []byte
}

// readFile parses a file this package wrote, checking the file header byte for byte.
func readFile(t *testing.T, path string, snap int) []record {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{
		0x4d, 0x3c, 0xb2, 0xa1, // magic 0xa1b23c4d, little-endian
		2, 0, 4, 0, // version 2.4
		0, 0, 0, 0, 0, 0, 0, 0, // thiszone, sigfigs
		byte(snap), byte(snap >> 8), byte(snap >> 16), byte(snap >> 24),
		1, 0, 0, 0, // LINKTYPE_ETHERNET
	}
	if len(b) < FileHeaderLen || !bytes.Equal(b[:FileHeaderLen], want) {
		t.Fatalf("%s: file header % x, want % x", path, b[:min(len(b), FileHeaderLen)], want)
	}
	var recs []record
	le := binary.LittleEndian
	for off := FileHeaderLen; off < len(b); {
		if len(b)-off < RecordHeaderLen {
			t.Fatalf("%s: %d stray bytes at %d", path, len(b)-off, off)
		}
		r := record{sec: le.Uint32(b[off:]), nsec: le.Uint32(b[off+4:]), caplen: le.Uint32(b[off+8:]), origlen: le.Uint32(b[off+12:])}
		off += RecordHeaderLen
		if int(r.caplen) > len(b)-off {
			t.Fatalf("%s: record caplen %d with %d bytes left", path, r.caplen, len(b)-off)
		}
		r.data = b[off : off+int(r.caplen)]
		off += int(r.caplen)
		recs = append(recs, r)
	}
	return recs
}

func frame(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }

func TestHeaderAndRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.pcap")
	var st Stats
	w, err := Create(path, Options{}, &st)
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1700000000, 123456789)
	w.WriteFrame(ts, frame(60, 1))
	w.WriteFrame(ts, frame(65550, 2)) // a GSO super-frame: recorded whole
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readFile(t, path, DefaultSnapLen)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for i, want := range []int{60, 65550} {
		r := recs[i]
		if r.sec != 1700000000 || r.nsec != 123456789 {
			t.Errorf("record %d: time %d.%09d", i, r.sec, r.nsec)
		}
		if int(r.caplen) != want || int(r.origlen) != want || !bytes.Equal(r.data, frame(want, byte(i+1))) {
			t.Errorf("record %d: caplen %d len %d, want %d both", i, r.caplen, r.origlen, want)
		}
	}
	if st.Frames.Load() != 2 || st.Bytes.Load() != 60+65550 || st.Dropped.Load() != 0 {
		t.Errorf("stats frames %d bytes %d dropped %d", st.Frames.Load(), st.Bytes.Load(), st.Dropped.Load())
	}
	// Frames after Close are counted, not written.
	w.WriteFrame(ts, frame(60, 3))
	if st.Dropped.Load() != 1 {
		t.Errorf("dropped %d after a write to a closed Writer, want 1", st.Dropped.Load())
	}
}

func TestSnapLen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.pcap")
	var st Stats
	w, err := Create(path, Options{SnapLen: 128}, &st)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteFrame(time.Unix(1, 0), frame(1514, 7))
	w.Close()
	recs := readFile(t, path, 128)
	if len(recs) != 1 || recs[0].caplen != 128 || recs[0].origlen != 1514 {
		t.Fatalf("records %+v, want one with caplen 128, len 1514", recs)
	}
}

// Rotation happens before a record would take the file past the cap; the oldest
// rotated file is overwritten, and every file is a valid capture on its own.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.pcap")
	var st Stats
	const capBytes = MinMaxBytes
	w, err := Create(path, Options{MaxBytes: capBytes, Files: 2}, &st)
	if err != nil {
		t.Fatal(err)
	}
	// 10000-byte frames: 6 records (24 + 6*10016 = 60120) fit, the 7th rotates.
	perFile := (capBytes - FileHeaderLen) / (RecordHeaderLen + 10000)
	total := 4*perFile + 1
	for i := 0; i < total; i++ {
		w.WriteFrame(time.Unix(int64(i), 0), frame(10000, byte(i)))
	}
	w.Close()
	if st.Rotations.Load() != 4 || st.Frames.Load() != uint64(total) {
		t.Fatalf("rotations %d frames %d, want 4 and %d", st.Rotations.Load(), st.Frames.Load(), total)
	}
	// Newest first: PATH has the last frame, PATH.1 and PATH.2 the full files before.
	for i, c := range []struct {
		name  string
		n     int
		first int
	}{{path, 1, 4 * perFile}, {path + ".1", perFile, 3 * perFile}, {path + ".2", perFile, 2 * perFile}} {
		recs := readFile(t, c.name, DefaultSnapLen)
		if len(recs) != c.n || int(recs[0].sec) != c.first {
			t.Errorf("file %d (%s): %d records from t=%d, want %d from t=%d", i, c.name, len(recs), recs[0].sec, c.n, c.first)
		}
		fi, _ := os.Stat(c.name)
		if fi.Size() > capBytes {
			t.Errorf("%s is %d bytes, over the %d cap", c.name, fi.Size(), capBytes)
		}
	}
	if _, err := os.Stat(path + ".3"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s.3 exists; only 2 rotated files are kept", path)
	}
}

func TestCapWithoutRotationStops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.pcap")
	var st Stats
	w, err := Create(path, Options{MaxBytes: MinMaxBytes}, &st)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		w.WriteFrame(time.Unix(0, 0), frame(10000, 1))
	}
	if !errors.Is(w.Err(), ErrCapReached) {
		t.Errorf("Err() = %v, want ErrCapReached", w.Err())
	}
	w.Close()
	if n := len(readFile(t, path, DefaultSnapLen)); n != 6 || st.Dropped.Load() != 4 {
		t.Errorf("%d records, %d dropped; want 6 and 4", n, st.Dropped.Load())
	}
}

// Reopen rotates in place while PATH is the open file, and starts afresh when it was
// moved away (logrotate), leaving the moved file complete.
func TestReopen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.pcap")
	var st Stats
	w, err := Create(path, Options{}, &st)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteFrame(time.Unix(1, 0), frame(100, 1))
	if err := w.Reopen(); err != nil {
		t.Fatal(err)
	}
	w.WriteFrame(time.Unix(2, 0), frame(100, 2))
	moved := filepath.Join(dir, "moved.pcap")
	w.Flush()
	if err := os.Rename(path, moved); err != nil {
		t.Fatal(err)
	}
	if err := w.Reopen(); err != nil {
		t.Fatal(err)
	}
	w.WriteFrame(time.Unix(3, 0), frame(100, 3))
	w.Close()
	for name, sec := range map[string]uint32{path + ".1": 1, moved: 2, path: 3} {
		recs := readFile(t, name, DefaultSnapLen)
		if len(recs) != 1 || recs[0].sec != sec {
			t.Errorf("%s: %d records, want 1 from t=%d", name, len(recs), sec)
		}
	}
}

// A failing file disables the Writer without a panic; frames are counted as dropped.
func TestWriteFailureDisables(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	var st Stats
	w, err := Create("/dev/full", Options{}, &st)
	if err != nil {
		t.Skipf("cannot open /dev/full: %v", err)
	}
	defer w.Close()
	for i := 0; i < 100; i++ { // 100 * 65 KB overflows the 256 KiB buffer
		w.WriteFrame(time.Unix(0, 0), frame(65000, 1))
	}
	if w.Err() == nil || st.Dropped.Load() == 0 || st.Errors.Load() != 1 {
		t.Errorf("err %v, dropped %d, errors %d; want a failure, drops and one error", w.Err(), st.Dropped.Load(), st.Errors.Load())
	}
}

func TestValidate(t *testing.T) {
	for _, o := range []Options{{SnapLen: 10}, {SnapLen: DefaultSnapLen + 1}, {MaxBytes: 100}, {Files: -1}, {Files: MaxFiles + 1}} {
		if o.Validate() == nil {
			t.Errorf("%+v accepted", o)
		}
	}
}

func TestWriteFrameAllocs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.pcap")
	var st Stats
	w, err := Create(path, Options{}, &st)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	f := frame(1514, 1)
	big := frame(65000, 2)
	ts := time.Now()
	if n := testing.AllocsPerRun(1000, func() {
		w.WriteFrame(ts, f)
		w.WriteFrame(ts, big)
	}); n != 0 {
		t.Errorf("WriteFrame allocates %v times per call", n)
	}
}

func BenchmarkWriteFrame(b *testing.B) {
	path := filepath.Join(b.TempDir(), "c.pcap")
	var st Stats
	w, err := Create(path, Options{MaxBytes: 64 << 20, Files: 1}, &st)
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	f := frame(1514, 1)
	b.SetBytes(int64(len(f)))
	b.ReportAllocs()
	ts := time.Now()
	for b.Loop() {
		w.WriteFrame(ts, f)
	}
}

// WriteFrameV records a frame spread over segments, from an offset (after a virtio-net
// header), exactly as WriteFrame records the same bytes contiguous; it cuts at the snap
// length and where the segments end.
func TestWriteFrameV(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.pcap")
	var st Stats
	w, err := Create(path, Options{SnapLen: 128}, &st)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 90)
	for i := range want {
		want[i] = byte(i)
	}
	hdr := []byte{0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee, 0xee}
	// 12-byte header, the frame starting inside the first segment.
	segs := [][]byte{append(hdr[:12:12], want[:5]...), want[5:40], {}, want[40:]}
	w.WriteFrameV(time.Unix(1, 0), segs, 12, len(want))
	w.WriteFrame(time.Unix(1, 0), want)
	// A reservation larger than the frame: only n bytes are recorded.
	w.WriteFrameV(time.Unix(2, 0), [][]byte{hdr, want, make([]byte, 500)}, 12, 30)
	// Longer than the snap length.
	big := frame(300, 9)
	w.WriteFrameV(time.Unix(3, 0), [][]byte{hdr, big[:150], big[150:]}, 12, 300)
	// Segments shorter than n (cannot happen in tapgro; never read past them).
	w.WriteFrameV(time.Unix(4, 0), [][]byte{hdr, want[:20]}, 12, 50)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	recs := readFile(t, path, 128)
	if len(recs) != 5 {
		t.Fatalf("%d records, want 5", len(recs))
	}
	for i, c := range []struct {
		data    []byte
		origlen uint32
	}{{want, 90}, {want, 90}, {want[:30], 30}, {big[:128], 300}, {want[:20], 50}} {
		if r := recs[i]; !bytes.Equal(r.data, c.data) || r.origlen != c.origlen || int(r.caplen) != len(c.data) {
			t.Errorf("record %d: caplen %d origlen %d data % x…, want caplen %d origlen %d", i, r.caplen, r.origlen, r.data[:min(8, len(r.data))], len(c.data), c.origlen)
		}
	}
	if st.Frames.Load() != 5 || st.Dropped.Load() != 0 {
		t.Errorf("frames %d dropped %d", st.Frames.Load(), st.Dropped.Load())
	}
}

// TestRefusesNonRegular: a capture path that is a symbolic link, a FIFO or a device is
// refused, and what the link points at is left as it was (tapgro may be root, the
// directory someone else's).
func TestRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.pcap")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.pcap")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, fifo, "/dev/null"} {
		var st Stats
		if w, err := Create(p, Options{}, &st); err == nil {
			w.Close()
			t.Errorf("%s: capture created", p)
		} else {
			t.Logf("%s: %v", p, err)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("the link's target was changed: %q", b)
	}
}
