package sockport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"tapgro/port"
	"testing"
)

// record returns a length-prefixed frame of n bytes whose content identifies it.
func record(n int, tag byte) []byte {
	b := make([]byte, PrefixLen+n)
	binary.BigEndian.PutUint32(b, uint32(n))
	for i := range n {
		b[PrefixLen+i] = tag + byte(i)
	}
	return b
}

func prefixOnly(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

// refDeframe is the obvious whole-buffer parser the Deframer must agree with.
func refDeframe(data []byte, lo, hi int) (frames [][]byte, err error, rest int) {
	off := 0
	for len(data)-off >= PrefixLen {
		l := uint64(binary.BigEndian.Uint32(data[off:]))
		if err := port.CheckFrameLen(l, lo, hi); err != nil {
			return frames, err, len(data) - off
		}
		if uint64(len(data)-off-PrefixLen) < l {
			break
		}
		frames = append(frames, data[off+PrefixLen:off+PrefixLen+int(l)])
		off += PrefixLen + int(l)
	}
	return frames, nil, len(data) - off
}

// feed pushes data into d in chunks from chunk(), draining frames after each chunk.
func feed(t testing.TB, d *Deframer, data []byte, chunk func() int) (got [][]byte, err error) {
	off := 0
	for off < len(data) && err == nil {
		sp := d.Space()
		if len(sp) == 0 {
			t.Fatalf("Space is empty with %d bytes buffered and no frame complete", d.Buffered())
		}
		c := min(chunk(), len(sp), len(data)-off)
		copy(sp, data[off:off+c])
		d.Commit(c)
		off += c
		for {
			f, ferr := d.Next()
			if ferr != nil {
				err = ferr
				break
			}
			if f == nil {
				break
			}
			got = append(got, bytes.Clone(f))
		}
	}
	return got, err
}

func sameFrameErr(a, b error) bool {
	var fa, fb *port.FrameError
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return errors.As(a, &fa) && errors.As(b, &fb) && *fa == *fb
}

func TestDeframeChunked(t *testing.T) {
	var stream []byte
	for i, n := range []int{14, 1514, 9014, 65535 + 14, 60, port.MaxFrame} {
		stream = append(stream, record(n, byte(i))...)
	}
	stream = append(stream, record(100, 9)[:50]...) // trailing partial frame
	want, _, rest := refDeframe(stream, port.MinFrame, port.MaxFrame)
	for _, size := range []int{1, 3, 4, 5, 1000, 65536, 1 << 20} {
		d := NewDeframer(streamBufSize, port.MinFrame, port.MaxFrame)
		got, err := feed(t, d, stream, func() int { return size })
		if err != nil {
			t.Fatalf("chunk %d: %v", size, err)
		}
		if len(got) != len(want) {
			t.Fatalf("chunk %d: %d frames, want %d", size, len(got), len(want))
		}
		for i := range got {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("chunk %d: frame %d differs", size, i)
			}
		}
		if d.Buffered() != rest || d.Want() != PrefixLen+100 {
			t.Errorf("chunk %d: Buffered %d Want %d, want %d and %d", size, d.Buffered(), d.Want(), rest, PrefixLen+100)
		}
	}
}

func TestDeframeBadLength(t *testing.T) {
	for _, tt := range []struct {
		l     uint32
		limit int
	}{{0, port.MinFrame}, {13, port.MinFrame}, {port.MaxFrame + 1, port.MaxFrame}, {0xffffffff, port.MaxFrame}} {
		stream := append(record(60, 1), prefixOnly(tt.l)...)
		d := NewDeframer(0, port.MinFrame, port.MaxFrame)
		got, err := feed(t, d, stream, func() int { return 1 })
		var fe *port.FrameError
		if !errors.As(err, &fe) || fe.Length != uint64(tt.l) || fe.Limit != tt.limit {
			t.Fatalf("len %d: err = %v, want port.FrameError{%d, %d}", tt.l, err, tt.l, tt.limit)
		}
		if len(got) != 1 {
			t.Errorf("len %d: %d frames before the error, want 1", tt.l, len(got))
		}
		if _, err2 := d.Next(); err2 != err {
			t.Errorf("error is not sticky: %v then %v", err, err2)
		}
	}
}

func FuzzDeframe(f *testing.F) {
	var good []byte
	for i, n := range []int{14, 60, 200, 14, 299} {
		good = append(good, record(n, byte(i))...)
	}
	f.Add(good, uint64(0), uint16(300), uint16(0))
	f.Add(good, uint64(1), uint16(300), uint16(7))
	f.Add(good[:len(good)-3], uint64(2), uint16(0x8000), uint16(0))
	f.Add(append(record(20, 1), prefixOnly(3)...), uint64(3), uint16(100), uint16(1))
	f.Add(append(record(20, 1), prefixOnly(port.MaxFrame+1)...), uint64(4), uint16(0x8000), uint16(0))
	f.Add([]byte{}, uint64(5), uint16(0), uint16(0))
	f.Add([]byte{0, 0, 0}, uint64(6), uint16(0), uint16(0))

	f.Fuzz(func(t *testing.T, data []byte, seed uint64, hiSel, extra uint16) {
		// Small limits make random input contain valid frames; bit 15 picks the real ones.
		hi := port.MinFrame + int(hiSel%300)
		if hiSel&0x8000 != 0 {
			hi = port.MaxFrame
		}
		wantFrames, wantErr, rest := refDeframe(data, port.MinFrame, hi)

		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		maxChunk := 1 // seed%4 == 0: one byte at a time
		if seed%4 != 0 {
			maxChunk = 1 + int(seed>>2)%(2*hi)
		}
		d := NewDeframer(PrefixLen+hi+int(extra%512), port.MinFrame, hi)
		got, err := feed(t, d, data, func() int { return 1 + rng.IntN(maxChunk) })

		if !sameFrameErr(err, wantErr) {
			t.Fatalf("err = %v, reference says %v", err, wantErr)
		}
		if len(got) != len(wantFrames) {
			t.Fatalf("%d frames, reference says %d", len(got), len(wantFrames))
		}
		for i := range got {
			if !bytes.Equal(got[i], wantFrames[i]) {
				t.Fatalf("frame %d differs from the reference", i)
			}
			if len(got[i]) < port.MinFrame || len(got[i]) > hi {
				t.Fatalf("frame %d has length %d outside [%d, %d]", i, len(got[i]), port.MinFrame, hi)
			}
		}
		if err == nil && d.Buffered() != rest {
			t.Fatalf("Buffered = %d, reference leaves %d", d.Buffered(), rest)
		}
	})
}
