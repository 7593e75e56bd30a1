package sockport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/port"
	"tapgro/port/porttest"
	"tapgro/vnethdr"
)

// shmPorts is vnetPorts over AF_UNIX with shared memory offered by a and b as given. It
// also returns a's raw connection, for writing bytes no port would send.
func shmPorts(t *testing.T, shmA, shmB bool) (a, b *StreamPort, rawA *net.UnixConn) {
	t.Helper()
	ca, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	a, b = helloBoth(t, ca, cb, VnetStreamAccepts, VnetStreamAccepts, shmA, shmB)
	return a, b, ca
}

// Shared memory is set up only when both ends offer it, and only over AF_UNIX.
func TestShmNegotiation(t *testing.T) {
	porttest.CheckLeaks(t)
	for _, c := range []struct{ a, b, want bool }{{true, true, true}, {true, false, false}, {false, true, false}} {
		a, b, _ := shmPorts(t, c.a, c.b)
		if a.ShmActive() != c.want || b.ShmActive() != c.want {
			t.Errorf("offered %v/%v: active %v/%v, want %v", c.a, c.b, a.ShmActive(), b.ShmActive(), c.want)
		}
		// Ordinary records cross either way.
		rec := append(make([]byte, VnetStreamHdrLen), porttest.Frame(100, 1)...)
		go a.WriteBatch([][]byte{rec})
		bufs, sizes := porttest.Buffers(4, port.MaxFrame+VnetStreamHdrLen)
		if n, err := b.ReadBatch(bufs, sizes); err != nil || n != 1 || !bytes.Equal(bufs[0][:sizes[0]], rec) {
			t.Fatalf("record over offered %v/%v: n=%d err=%v", c.a, c.b, n, err)
		}
	}
	// TCP cannot carry a memfd: nothing is offered, whatever was asked.
	a, b := vnetPorts(t, "tcp", VnetStreamAccepts, VnetStreamAccepts)
	if a.ShmActive() || b.ShmActive() {
		t.Error("shared memory over TCP")
	}
}

// sendLent plays the TAP→port pipeline: it reads (copies) each packet into a free slot
// as a TAP read would, and returns the descriptor records naming them.
func sendLent(t *testing.T, a *StreamPort, pkts [][]byte) [][]byte {
	t.Helper()
	slots := make([][]byte, len(pkts))
	n := a.TxSlots(slots, VnetStreamHdrLen)
	if n != len(pkts) {
		t.Fatalf("TxSlots gave %d slots, want %d", n, len(pkts))
	}
	defer a.TxDone()
	recs := make([][]byte, n)
	for i, p := range pkts {
		copy(slots[i], p)
		rec := make([]byte, VnetStreamHdrLen+ShmDescLen)
		copy(rec, p[:VnetStreamHdrLen])
		a.PutShmDesc(rec[VnetStreamHdrLen:], i, len(p)-VnetStreamHdrLen)
		recs[i] = rec
	}
	return recs
}

func vnetRecord(n int, tag byte) []byte {
	h := vnethdr.Hdr{Flags: vnethdr.FlagNeedsCsum, GSOType: vnethdr.GSOTCPv4, HdrLen: 54, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}
	rec := make([]byte, VnetStreamHdrLen+n)
	h.Encode(rec, VnetStreamHdrLen)
	copy(rec[VnetStreamHdrLen:], porttest.Frame(n, tag))
	return rec
}

// Frames named by descriptors arrive lent in place from the ring, among inline records
// (lent from the read buffer) and in stream order; their slots go back to the sender on
// ReleaseLent. A plain ReadBatch copies them
// out instead and hands the slot back at once.
func TestShmLendRoundTrip(t *testing.T) {
	porttest.CheckLeaks(t)
	a, b, _ := shmPorts(t, true, true)
	big := [][]byte{vnetRecord(65000, 1), vnetRecord(ShmMinFrame, 2), vnetRecord(port.MaxFrame, 3)}
	descs := sendLent(t, a, big)
	small := vnetRecord(60, 4)
	want := [][]byte{big[0], small, big[1], big[2]}
	if _, err := a.WriteBatch([][]byte{descs[0], small, descs[1], descs[2]}); err != nil {
		t.Fatal(err)
	}
	bufs, sizes := porttest.Buffers(8, port.MaxFrame+VnetStreamHdrLen)
	lent := make([][]byte, 8)
	got := 0
	for got < len(want) {
		n, err := b.ReadBatchLent(bufs[got:], sizes[got:], lent[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	for i, w := range want {
		var rec []byte
		if lent[i] != nil {
			rec = lent[i][port.ShmHeadroom-VnetStreamHdrLen : port.ShmHeadroom-VnetStreamHdrLen+sizes[i]]
		} else {
			rec = bufs[i][:sizes[i]]
		}
		if lent[i] == nil {
			// Descriptors from the ring, the inline record from the read buffer.
			t.Errorf("record %d was copied, not lent", i)
		}
		if !bytes.Equal(rec, w) {
			t.Fatalf("record %d: %d bytes differ from the %d sent", i, len(rec), len(w))
		}
	}
	// The sender sees its slots in flight until the receiver is done with them.
	free := make([][]byte, shmSlots)
	if n := a.TxSlots(free, VnetStreamHdrLen); n != shmSlots-3 {
		t.Fatalf("%d slots free with 3 lent, want %d", n, shmSlots-3)
	}
	a.TxDone()
	b.ReleaseLent()
	if n := a.TxSlots(free, VnetStreamHdrLen); n != shmSlots {
		t.Fatalf("%d slots free after ReleaseLent, want %d", n, shmSlots)
	}
	// The slot freed last comes first: the frame at the front of the next read lands
	// where the previous one was, in warm cache.
	if !bytes.Equal(free[0][:len(big[2])], big[2]) {
		t.Error("the most recently freed slot is not handed out first")
	}
	a.TxDone()

	// ReadBatch copies a lent frame out.
	descs = sendLent(t, a, big[:1])
	if _, err := a.WriteBatch(descs); err != nil {
		t.Fatal(err)
	}
	if n, err := b.ReadBatch(bufs, sizes); err != nil || n != 1 || !bytes.Equal(bufs[0][:sizes[0]], big[0]) {
		t.Fatalf("ReadBatch of a descriptor: n=%d err=%v", n, err)
	}
	if n := a.TxSlots(free, VnetStreamHdrLen); n != shmSlots {
		t.Fatalf("%d slots free after a copying ReadBatch, want %d", n, shmSlots)
	}
	a.TxDone()
	if st := a.VnetStats(); st.ShmFramesOut.Load() != 4 {
		t.Errorf("ShmFramesOut = %d, want 4", st.ShmFramesOut.Load())
	}
	if st := b.VnetStats(); st.ShmFramesIn.Load() != 4 {
		t.Errorf("ShmFramesIn = %d, want 4", st.ShmFramesIn.Load())
	}
}

// A full ring hands out nothing (the pipeline then sends inline) and counts it; slots
// come back only as the peer hands them back, and a completion naming a slot that is not
// lent out is ignored.
func TestShmRingFull(t *testing.T) {
	a, _, _ := shmPorts(t, true, true)
	slots := make([][]byte, shmSlots+1)
	n := a.TxSlots(slots, VnetStreamHdrLen)
	if n != shmSlots {
		t.Fatalf("TxSlots = %d, want the whole ring (%d)", n, shmSlots)
	}
	for i := 0; i < n; i++ {
		a.PutShmDesc(make([]byte, ShmDescLen), i, 100)
	}
	a.TxDone()
	if n := a.TxSlots(slots, VnetStreamHdrLen); n != 0 {
		t.Fatalf("TxSlots on a full ring = %d", n)
	}
	if a.VnetStats().ShmRingFull.Load() != 1 {
		t.Fatalf("ShmRingFull = %d, want 1", a.VnetStats().ShmRingFull.Load())
	}
	// The peer hands back slot 5 twice and a slot that does not exist: one comes back.
	r := a.shm.send.area
	r.freed(0).Store(5)
	r.freed(1).Store(5)
	r.freed(2).Store(shmSlots + 9)
	r.freedProd().Store(3)
	if n := a.TxSlots(slots, VnetStreamHdrLen); n != 1 || &slots[0][0] != &r.slot(5)[port.ShmHeadroom-VnetStreamHdrLen] {
		t.Fatalf("TxSlots after a confused peer = %d, want slot 5 alone", n)
	}
	a.TxDone()
}

// A bad descriptor, or a record too short to be a frame, ends that connection with a
// clear error; the receiver never touches memory outside the ring.
func TestShmBadDescriptors(t *testing.T) {
	porttest.CheckLeaks(t)
	for _, c := range []struct {
		name string
		rec  func() []byte
		want string
	}{
		{"slot beyond the ring", func() []byte { return desc(shmSlots, 1000) }, "slot 128 of a 128-slot ring"},
		{"slot far beyond", func() []byte { return desc(^uint32(0), 1000) }, "-slot ring"},
		{"frame longer than a slot", func() []byte { return desc(0, shmSlotSize) }, "-byte frame"},
		{"frame shorter than Ethernet", func() []byte { return desc(0, port.MinFrame-1) }, "-byte frame"},
		{"short record", func() []byte { return make([]byte, VnetStreamHdrLen+ShmDescLen+1) }, "length"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, b, raw := shmPorts(t, true, true)
			rec := c.rec()
			wire := binary.BigEndian.AppendUint32(nil, uint32(len(rec)))
			if _, err := raw.Write(append(wire, rec...)); err != nil {
				t.Fatal(err)
			}
			bufs, sizes := porttest.Buffers(4, port.MaxFrame+VnetStreamHdrLen)
			_, err := b.ReadBatchLent(bufs, sizes, make([][]byte, 4))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, c.want)
			}
			if b.Stats().BadLength.Load() != 1 {
				t.Errorf("BadLength = %d, want 1", b.Stats().BadLength.Load())
			}
		})
	}
}

// A peer that names slots more often than its ring holds, without the receiver handing
// any back, is cut off rather than believed.
func TestShmTooManyLent(t *testing.T) {
	_, b, raw := shmPorts(t, true, true)
	var wire []byte
	for i := 0; i <= shmSlots; i++ {
		wire = binary.BigEndian.AppendUint32(wire, VnetStreamHdrLen+ShmDescLen)
		wire = append(wire, desc(0, 1000)...)
	}
	go raw.Write(wire)
	bufs, sizes := porttest.Buffers(shmSlots+1, 64)
	lent := make([][]byte, shmSlots+1)
	got := 0
	for {
		n, err := b.ReadBatchLent(bufs[got:], sizes[got:], lent[got:])
		got += n
		if err != nil {
			if !errors.Is(err, errBadDesc) || got != shmSlots {
				t.Fatalf("after %d lent: err = %v, want errBadDesc after %d", got, err, shmSlots)
			}
			return
		}
	}
}

func desc(slot uint32, n int) []byte {
	rec := make([]byte, VnetStreamHdrLen+ShmDescLen)
	binary.LittleEndian.PutUint32(rec[VnetStreamHdrLen:], slot)
	binary.LittleEndian.PutUint32(rec[VnetStreamHdrLen+4:], uint32(n))
	return rec
}

// Close from the other goroutine does not unmap memory still in use: lent frames and
// handed-out slots stay valid until ReleaseLent / TxDone, which then unmap.
func TestShmCloseWhileInUse(t *testing.T) {
	a, b, _ := shmPorts(t, true, true)
	rec := vnetRecord(65000, 7)
	descs := sendLent(t, a, [][]byte{rec})
	if _, err := a.WriteBatch(descs); err != nil {
		t.Fatal(err)
	}
	bufs, sizes := porttest.Buffers(1, port.MaxFrame+VnetStreamHdrLen)
	lent := make([][]byte, 1)
	if n, err := b.ReadBatchLent(bufs, sizes, lent); err != nil || n != 1 || lent[0] == nil {
		t.Fatalf("n=%d err=%v lent=%v", n, err, lent[0] != nil)
	}
	slots := make([][]byte, 2)
	if n := a.TxSlots(slots, VnetStreamHdrLen); n != 2 {
		t.Fatal("no slots")
	}
	a.Close()
	b.Close()
	// Both still mapped: these touch the memory.
	copy(slots[1], rec)
	if !bytes.Equal(lent[0][port.ShmHeadroom-VnetStreamHdrLen:port.ShmHeadroom-VnetStreamHdrLen+sizes[0]], rec) {
		t.Fatal("lent frame changed after Close")
	}
	a.TxDone()
	b.ReleaseLent()
	if a.shm.send.area.mem != nil || b.shm.recv.area.mem != nil || a.shm.recv.area.mem != nil || b.shm.send.area.mem != nil {
		t.Fatal("a ring is still mapped after the last user let go")
	}
	// And a closed port hands out no slots.
	if n := a.TxSlots(slots, VnetStreamHdrLen); n != 0 {
		t.Fatalf("TxSlots after Close = %d", n)
	}
}

// The peer's memfd must be sealed and of the announced size, or it is not mapped.
func TestShmPeerAreaChecks(t *testing.T) {
	fd, err := unix.MemfdCreate("test", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	size := shmCtrlSize + 2*shmSlotSize
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	if _, err := mapPeerArea(fd, 2, shmSlotSize); err == nil || !strings.Contains(err.Error(), "not sealed") {
		t.Fatalf("unsealed: err = %v", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shmSeals); err != nil {
		t.Fatal(err)
	}
	if _, err := mapPeerArea(fd, 3, shmSlotSize); err == nil || !strings.Contains(err.Error(), "announced") {
		t.Fatalf("wrong size: err = %v", err)
	}
	a, err := mapPeerArea(fd, 2, shmSlotSize)
	if err != nil {
		t.Fatal(err)
	}
	a.release()
}

// A peer that offers shared memory in the hello but then sends no memfd fails the
// connection with a HelloError, not a hang or a panic.
func TestShmAnnouncementWithoutFD(t *testing.T) {
	porttest.CheckLeaks(t)
	ca, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
	defer cb.Close()
	go func() {
		h := encodeHello(VnetStreamAccepts, HelloShm)
		cb.Write(h[:])
		var msg [shmMsgLen]byte
		copy(msg[:], shmMagic[:])
		msg[6] = 1
		cb.Write(msg[:])
	}()
	_, err := NewVnetStreamPort(ca, nil, nil, VnetStreamAccepts, true, time.Second)
	var he *HelloError
	if !errors.As(err, &he) || !strings.Contains(err.Error(), "file descriptors") {
		t.Fatalf("err = %v, want a HelloError about the missing descriptor", err)
	}
	ca.Close()
}

// ringMappings counts this process's mappings of tapgro ring memfds.
func ringMappings(t *testing.T) int {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	return bytes.Count(maps, []byte("memfd:tapgro-vnet-ring"))
}

// Rings are unmapped once both ports of a connection are closed and nothing holds a
// slot, however many connections come and go.
func TestShmNoMappingLeak(t *testing.T) {
	before := ringMappings(t)
	for i := 0; i < 20; i++ {
		ca, cb := porttest.UnixConnPair(t, unix.SOCK_STREAM)
		a, b := helloBoth(t, ca, cb, VnetStreamAccepts, VnetStreamAccepts, true, true)
		if got := ringMappings(t); got != before+4 {
			t.Fatalf("connection %d: %d ring mappings, want %d (two rings, each mapped by both ends)", i, got, before+4)
		}
		descs := sendLent(t, a, [][]byte{vnetRecord(65000, byte(i))})
		a.WriteBatch(descs)
		bufs, sizes := porttest.Buffers(1, port.MaxFrame+VnetStreamHdrLen)
		b.ReadBatchLent(bufs, sizes, make([][]byte, 1))
		a.Close()
		b.Close()
		b.ReleaseLent() // the lent slot kept the peer's ring mapped until now
	}
	if got := ringMappings(t); got != before {
		t.Fatalf("%d ring mappings left after all connections closed, want %d", got, before)
	}
}
