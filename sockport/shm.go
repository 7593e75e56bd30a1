package sockport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"tapgro/port"
)

// Shared-memory rings for the vnet-hdr=on stream between two tapgro on one host.
//
// Every byte a 64 KiB GSO frame crosses costs a copy, and on a host link the socket adds
// two of them (sender's write, receiver's read) to the TAP's own two (read and write).
// When both ends of a vnet-hdr=on stream are on the same host (the stream is AF_UNIX),
// and both offered it in the hello, each end also creates a sealed memfd of frame slots,
// its TX ring, and passes it to the other with SCM_RIGHTS right after the hello. From
// then on the sender reads TAP frames straight into free slots, and for a frame of
// ShmMinFrame bytes or more sends a 20-byte descriptor record on the stream instead of
// the frame: [12-byte vnet header][slot sequence, u32 LE][frame length, u32 LE]. The
// receiver writes the frame to its TAP straight from the slot. A frame so crosses with
// two copies, as through a single process relaying between two TAPs.
//
// Descriptors travel in the stream among ordinary records, so frame order is the
// stream's order, and the socket stays the doorbell: a reader blocks in the netpoller as
// before. The receiver hands slots back through a completion ring in the area's control
// page (slot numbers, and a producer count it stores last), and the sender keeps its free
// slots on a stack: the slot it reads the next frame into is the one freed last, whose
// cache lines are still warm, where walking a 9 MiB ring would miss the cache on every
// frame. The sender never waits for a slot: when none is free it reads the TAP into its
// own buffers and sends frames inline, and the socket's own backpressure applies as on
// any stream.
//
// The peer is another tapgro that passed the socket's access checks, but its memory is
// still checked like wire input: the memfd must be sealed against shrinking and growing
// (so the mapping cannot fault), its size must match what the peer announced, every
// descriptor must name a slot ahead of the last one and a length the slot holds, and
// the counter the peer writes is only believed when it moves forward within what was
// handed out. A peer that scribbles on a slot it was lent can only spoil its own frames;
// the TAP validates what it is given as it does for every write.

const (
	// ShmMinFrame is the smallest frame sent through the ring: below it a copy is
	// cheaper than a slot, and ACKs and MTU frames stay inline.
	ShmMinFrame = 2048

	// ShmDescLen is a descriptor record's body after the vnet header: slot number and
	// frame length, u32 LE each. Ordinary records are at least VnetStreamHdrLen+port.MinFrame
	// = 26 bytes, so a 20-byte record can only be a descriptor.
	ShmDescLen = 8

	shmSlots     = 128   // 9 MiB; in the benchmarks the ring never filled
	shmSlotSize  = 73728 // 18 pages: port.ShmHeadroom + the TAP's vnet header + port.MaxFrame, rounded up
	shmCtrlSize  = 4096  // the control page: the completion ring
	shmFreedProd = 64    // u32: completions the receiver has produced, stored after them
	shmFreed     = 256   // u32[slots]: the completion ring, slot numbers handed back
	shmMsgLen    = 16    // the ring announcement sent with the memfd
	shmMaxSlots  = (shmCtrlSize - shmFreed) / 4
	shmMaxSlotSz = 1 << 20
	shmSeals     = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
)

var shmMagic = [6]byte{'T', 'G', 'S', 'H', 'M', 0}

// shmArea is one mapped ring. It is unmapped when the last reference is released: the
// port holds one until Close, and a pipeline holds one while it uses slot memory, so a
// Close from the other goroutine never pulls memory out from under a read or write.
type shmArea struct {
	mem      []byte
	slots    int
	slotSize int
	refs     atomic.Int32
}

func (a *shmArea) size() int { return shmCtrlSize + a.slots*a.slotSize }

// word is the u32 at off in the control page, which both processes access atomically.
func (a *shmArea) word(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&a.mem[off]))
}

// freedProd counts the completions the receiver of this ring has produced; entry i of
// the completion ring is freed(i % slots).
func (a *shmArea) freedProd() *atomic.Uint32 { return a.word(shmFreedProd) }

func (a *shmArea) freed(i uint32) *atomic.Uint32 {
	return a.word(shmFreed + 4*int(i%uint32(a.slots)))
}

// slot returns slot i (i < a.slots) whole.
func (a *shmArea) slot(i uint32) []byte {
	off := shmCtrlSize + int(i)*a.slotSize
	return a.mem[off : off+a.slotSize : off+a.slotSize]
}

// acquire takes a reference unless the area is already gone.
func (a *shmArea) acquire() bool {
	for {
		r := a.refs.Load()
		if r <= 0 {
			return false
		}
		if a.refs.CompareAndSwap(r, r+1) {
			return true
		}
	}
}

func (a *shmArea) release() {
	if a.refs.Add(-1) == 0 {
		_ = unix.Munmap(a.mem)
		a.mem = nil
	}
}

// newShmArea creates this end's TX ring: a memfd sealed against resizing, mapped shared.
// The returned file is for passing to the peer; the caller closes it.
func newShmArea(slots, slotSize int) (*shmArea, *os.File, error) {
	fd, err := unix.MemfdCreate("tapgro-vnet-ring", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, fmt.Errorf("sockport: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "tapgro-vnet-ring")
	a := &shmArea{slots: slots, slotSize: slotSize}
	if err := unix.Ftruncate(fd, int64(a.size())); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sockport: sizing the shared ring: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shmSeals); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sockport: sealing the shared ring: %w", err)
	}
	if a.mem, err = unix.Mmap(fd, 0, a.size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sockport: mapping the shared ring: %w", err)
	}
	a.refs.Store(1)
	return a, f, nil
}

// mapPeerArea maps the peer's TX ring after checking that it is what the peer
// announced and cannot change size under us. It does not close fd.
func mapPeerArea(fd, slots, slotSize int) (*shmArea, error) {
	a := &shmArea{slots: slots, slotSize: slotSize}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("sockport: peer's shared ring: %w", err)
	}
	if st.Size != int64(a.size()) {
		return nil, fmt.Errorf("sockport: peer's shared ring is %d bytes, announced %d slots of %d (%d bytes)",
			st.Size, slots, slotSize, a.size())
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return nil, fmt.Errorf("sockport: peer's shared ring is not sealed against resizing (seals %#x, %v)", seals, err)
	}
	if a.mem, err = unix.Mmap(fd, 0, a.size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("sockport: mapping the peer's shared ring: %w", err)
	}
	a.refs.Store(1)
	return a, nil
}

// shmExchange creates this end's ring, sends it to the peer and maps the peer's, within
// timeout. It runs right after a hello in which both ends offered shared memory, before
// any record, so the 16-byte announcements cannot be confused with records.
func shmExchange(c *net.UnixConn, timeout time.Duration) (tx, rx *shmArea, err error) {
	peer := PeerString(c)
	mine, f, err := newShmArea(shmSlots, shmSlotSize)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	defer func() {
		if err != nil {
			mine.release()
		}
	}()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, nil, err
	}
	var msg [shmMsgLen]byte
	copy(msg[:], shmMagic[:])
	msg[6] = 1 // version
	binary.LittleEndian.PutUint32(msg[8:], shmSlots)
	binary.LittleEndian.PutUint32(msg[12:], shmSlotSize)
	if _, _, err := c.WriteMsgUnix(msg[:], unix.UnixRights(int(f.Fd())), nil); err != nil {
		return nil, nil, fmt.Errorf("sockport: sending the shared ring to %s: %w", peer, err)
	}
	var got [shmMsgLen]byte
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for a few fds, so extras are seen and closed
	n, oobn, _, _, err := c.ReadMsgUnix(got[:], oob)
	if err != nil {
		return nil, nil, fmt.Errorf("sockport: receiving %s's shared ring: %w", peer, err)
	}
	fds, err := rightsOf(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("sockport: %s's shared ring announcement: %w", peer, err)
	case n != shmMsgLen || [6]byte(got[:6]) != shmMagic || got[6] != 1:
		return nil, nil, fmt.Errorf("sockport: %s sent a bad shared ring announcement (%d bytes: %x)", peer, n, got[:n])
	case len(fds) != 1:
		return nil, nil, fmt.Errorf("sockport: %s's shared ring announcement carried %d file descriptors, want 1", peer, len(fds))
	}
	slots := int(binary.LittleEndian.Uint32(got[8:]))
	slotSize := int(binary.LittleEndian.Uint32(got[12:]))
	if slots < 1 || slots > shmMaxSlots || slotSize < port.ShmHeadroom+VnetStreamHdrLen+port.MaxFrame ||
		slotSize > shmMaxSlotSz || slotSize%4096 != 0 {
		return nil, nil, fmt.Errorf("sockport: %s announced a shared ring of %d slots of %d bytes", peer, slots, slotSize)
	}
	if rx, err = mapPeerArea(fds[0], slots, slotSize); err != nil {
		return nil, nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		rx.release()
		return nil, nil, err
	}
	return mine, rx, nil
}

// rightsOf returns the file descriptors in SCM_RIGHTS control messages.
func rightsOf(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level == unix.SOL_SOCKET && msgs[i].Header.Type == unix.SCM_RIGHTS {
			f, err := unix.ParseUnixRights(&msgs[i])
			if err != nil {
				return fds, err
			}
			fds = append(fds, f...)
		}
	}
	return fds, nil
}

var (
	_ port.ShmSender = (*StreamPort)(nil)
	_ port.Lender    = (*StreamPort)(nil)
)

// shmLink is the shared-memory half of one vnet-hdr=on connection: this end's TX ring,
// which the peer maps and reads frames from, and the peer's ring, which this end maps
// and lends frames out of. send belongs to the TAP→port goroutine (the port's writer),
// recv to the port→TAP one (its reader), so neither takes a lock.
type shmLink struct {
	hdrLen int // the vnet header in front of every descriptor record
	stats  *VnetStats
	send   shmSend
	recv   shmRecv
}

// shmSend is the sending side's state over its own ring.
type shmSend struct {
	area  *shmArea
	free  []uint32 // free slots, the most recently freed last
	lent  []bool   // per slot: lent to the peer
	batch []uint32 // the slots the last TxSlots handed out
	n     int      // how many
	cons  uint32   // completions taken from the peer
}

// shmRecv is the receiving side's state over the peer's ring.
type shmRecv struct {
	area *shmArea
	lent []uint32 // slots lent to our caller since the last ReleaseLent
	prod uint32   // completions handed back to the peer
}

// VnetStats are the vnet-hdr=on counters this port adds to (nil: a QEMU-framed stream).
func (s *StreamPort) VnetStats() *VnetStats { return s.vnet }

// newShmLink adopts the two rings of a connection.
func newShmLink(tx, rx *shmArea, hdrLen int, st *VnetStats) *shmLink {
	l := &shmLink{hdrLen: hdrLen, stats: st}
	l.send = shmSend{
		area:  tx,
		lent:  make([]bool, tx.slots),
		batch: make([]uint32, tx.slots),
		free:  make([]uint32, 0, tx.slots),
	}
	for i := tx.slots - 1; i >= 0; i-- {
		l.send.free = append(l.send.free, uint32(i))
	}
	l.recv = shmRecv{area: rx, lent: make([]uint32, 0, rx.slots)}
	return l
}

// close drops the port's own references to both rings (the port's Close); a pipeline
// still holding slot memory keeps its ring mapped until it lets go.
func (l *shmLink) close() {
	l.send.area.release()
	l.recv.area.release()
}

// ---- sending side: the TAP→port goroutine ----

// The engine finds these by type assertion, so a method missing here would silently
// turn shared memory (or lending) off rather than fail to build.
var (
	_ port.ShmSender = (*StreamPort)(nil)
	_ port.Lender    = (*StreamPort)(nil)
)

// ShmActive reports whether frames may cross this port through shared memory.
func (s *StreamPort) ShmActive() bool { return s.shm != nil }

// ShmMinFrame is the package's ShmMinFrame: what the engine needs of the ring's layout
// without importing it (port.ShmSender).
func (s *StreamPort) ShmMinFrame() int { return ShmMinFrame }

// ShmDescLen is the package's ShmDescLen, the length PutShmDesc fills.
func (s *StreamPort) ShmDescLen() int { return ShmDescLen }

// TxSlots hands out up to len(slots) free slots of this end's ring for the next TAP
// read, the most recently freed first: slots[i] is laid out so that [hl-byte vnet
// header][frame] read into it puts the frame at port.ShmHeadroom of the slot. The ring
// stays mapped, even if the port is closed meanwhile, until TxDone, which must follow
// every TxSlots that returned n > 0 and returns the slots that no PutShmDesc named.
func (s *StreamPort) TxSlots(slots [][]byte, hl int) int {
	if s.shm == nil {
		return 0
	}
	return s.shm.txSlots(slots, hl)
}

// PutShmDesc fills rec[:ShmDescLen], the body of the descriptor record that follows the
// vnet header, for the frame of n bytes read into slots[i] of the last TxSlots, and lends
// that slot to the peer.
func (s *StreamPort) PutShmDesc(rec []byte, i int, n int) { s.shm.putDesc(rec, i, n) }

// TxDone ends the use of the slots the last TxSlots handed out.
func (s *StreamPort) TxDone() { s.shm.txDone() }

// TxFrame returns the frame a descriptor record (vnet header included) sent by this end
// names, for packet capture; nil for an ordinary record. The caller must hold the
// slots it got from TxSlots (descriptors name only those).
func (s *StreamPort) TxFrame(rec []byte) []byte {
	if s.shm == nil {
		return nil
	}
	return s.shm.txFrame(rec)
}

// ReleaseLent hands every slot lent since the last call back to the peer. The caller
// must be done with the frames ReadBatchLent lent; a port without shared memory does
// nothing (frames lent from its read buffer need no release).
func (s *StreamPort) ReleaseLent() {
	if s.shm != nil {
		s.shm.releaseLent()
	}
}

func (l *shmLink) txSlots(slots [][]byte, hl int) int {
	t := &l.send
	a := t.area
	if hl > port.ShmHeadroom || !a.acquire() {
		return 0
	}
	l.reclaim()
	n := min(len(t.free), len(slots), len(t.batch))
	if n == 0 {
		a.release()
		l.stats.ShmRingFull.Add(1)
		return 0
	}
	for i := 0; i < n; i++ {
		idx := t.free[len(t.free)-1]
		t.free = t.free[:len(t.free)-1]
		t.batch[i] = idx
		slots[i] = a.slot(idx)[port.ShmHeadroom-hl:]
	}
	t.n = n
	return n
}

// reclaim moves the slots the peer handed back onto the free stack. Entries naming a
// slot that is not lent out are ignored: they can only come from a confused peer.
func (l *shmLink) reclaim() {
	t := &l.send
	a := t.area
	prod := a.freedProd().Load()
	avail := prod - t.cons
	if avail > uint32(a.slots) {
		avail = uint32(a.slots) // a peer running ahead: it overwrote its own entries
	}
	for i := prod - avail; i != prod; i++ {
		if idx := a.freed(i).Load(); idx < uint32(a.slots) && t.lent[idx] {
			t.lent[idx] = false
			t.free = append(t.free, idx)
		}
	}
	t.cons = prod
}

func (l *shmLink) putDesc(rec []byte, i int, n int) {
	t := &l.send
	idx := t.batch[i]
	binary.LittleEndian.PutUint32(rec[0:], idx)
	binary.LittleEndian.PutUint32(rec[4:], uint32(n))
	t.lent[idx] = true
	l.stats.ShmFramesOut.Add(1)
}

// txDone puts the slots not lent back on the free stack, in reverse so the next batch
// gets them in the same order, and drops the reference TxSlots took.
func (l *shmLink) txDone() {
	t := &l.send
	for i := t.n - 1; i >= 0; i-- {
		if idx := t.batch[i]; !t.lent[idx] {
			t.free = append(t.free, idx)
		}
	}
	t.n = 0
	t.area.release()
}

func (l *shmLink) txFrame(rec []byte) []byte {
	a := l.send.area
	if len(rec) != l.hdrLen+ShmDescLen {
		return nil
	}
	idx := binary.LittleEndian.Uint32(rec[l.hdrLen:])
	n := int(binary.LittleEndian.Uint32(rec[l.hdrLen+4:]))
	if idx >= uint32(a.slots) || n > a.slotSize-port.ShmHeadroom {
		return nil
	}
	return a.slot(idx)[port.ShmHeadroom : port.ShmHeadroom+n]
}

// ---- receiving side: the port→TAP goroutine ----

// isDesc reports whether a record read from the stream is a shared-memory descriptor:
// ordinary records are longer (ShmDescLen).
func (l *shmLink) isDesc(rec []byte) bool { return len(rec) == l.hdrLen+ShmDescLen }

// lend resolves the descriptor record rec (vnet header included) to the peer's slot.
// It returns the whole slot with the record's vnet header copied in front of the frame,
// at port.ShmHeadroom-hdrLen, and the frame's length. The slot is handed back by
// releaseLent.
func (l *shmLink) lend(rec []byte) ([]byte, int, error) {
	r := &l.recv
	a := r.area
	idx := binary.LittleEndian.Uint32(rec[l.hdrLen:])
	n := int(binary.LittleEndian.Uint32(rec[l.hdrLen+4:]))
	if idx >= uint32(a.slots) {
		return nil, 0, fmt.Errorf("%w: descriptor for slot %d of a %d-slot ring", errBadDesc, idx, a.slots)
	}
	if n < port.MinFrame || n > a.slotSize-port.ShmHeadroom {
		return nil, 0, fmt.Errorf("%w: descriptor for a %d-byte frame, want %d..%d",
			errBadDesc, n, port.MinFrame, a.slotSize-port.ShmHeadroom)
	}
	if len(r.lent) == cap(r.lent) {
		// More lent than a ring holds without a ReleaseLent: a peer naming slots twice.
		return nil, 0, fmt.Errorf("%w: more than %d frames lent at once", errBadDesc, cap(r.lent))
	}
	if len(r.lent) == 0 {
		if !a.acquire() {
			return nil, 0, port.ErrClosed
		}
	}
	sl := a.slot(idx)
	copy(sl[port.ShmHeadroom-l.hdrLen:port.ShmHeadroom], rec[:l.hdrLen])
	r.lent = append(r.lent, idx)
	l.stats.ShmFramesIn.Add(1)
	return sl, n, nil
}

var errBadDesc = errors.New("sockport: bad shared-memory descriptor")

func (l *shmLink) releaseLent() {
	r := &l.recv
	if len(r.lent) == 0 {
		return
	}
	a := r.area
	prod := r.prod
	for _, idx := range r.lent {
		a.freed(prod).Store(idx)
		prod++
	}
	// The count goes last: the peer reads no entry before it sees it.
	a.freedProd().Store(prod)
	r.prod = prod
	r.lent = r.lent[:0]
	a.release()
}
