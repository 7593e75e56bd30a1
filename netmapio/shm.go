package netmapio

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
// before. The receiver hands slots back by storing, in the ring's control page, the
// sequence after the last slot it has finished with (slots are taken in sequence, so
// one counter frees every earlier one). The sender never waits for a slot: when the
// ring is full it reads the TAP into its own buffers and sends frames inline, and the
// socket's own backpressure applies as on any stream.
//
// The peer is another tapgro that passed the socket's access checks, but its memory is
// still checked like wire input: the memfd must be sealed against shrinking and growing
// (so the mapping cannot fault), its size must match what the peer announced, every
// descriptor must name a slot ahead of the last one and a length the slot holds, and
// the counter the peer writes is only believed when it moves forward within what was
// handed out. A peer that scribbles on a slot it was lent can only spoil its own frames;
// the TAP validates what it is given as it does for every write.

const (
	// ShmHeadroom is where a frame starts in its slot: room in front for either end's
	// TAP vnet header (10 or 12 bytes), so both the sender's TAP read and the receiver's
	// TAP write see [header][frame] contiguous.
	ShmHeadroom = 16

	// ShmMinFrame is the smallest frame sent through the ring: below it a copy is
	// cheaper than a slot, and ACKs and MTU frames stay inline.
	ShmMinFrame = 2048

	// ShmDescLen is a descriptor record's body after the vnet header. Ordinary records
	// are at least VnetStreamHdrLen+MinFrame = 26 bytes, so a 20-byte record can only
	// be a descriptor.
	ShmDescLen = 8

	shmSlots     = 128   // 9 MiB; in the benchmarks the ring never filled
	shmSlotSize  = 73728 // 18 pages: ShmHeadroom + the TAP's vnet header + MaxFrame, rounded up
	shmCtrlSize  = 4096  // the control page: the consumed counter
	shmConsumed  = 64    // offset of the u32 consumed counter in the control page
	shmMsgLen    = 16    // the ring announcement sent with the memfd
	shmMaxSlots  = 4096
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

// consumed is the counter the receiver of this ring writes and its owner reads.
func (a *shmArea) consumed() *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&a.mem[shmConsumed]))
}

// slot returns the whole slot that sequence seq uses.
func (a *shmArea) slot(seq uint32) []byte {
	off := shmCtrlSize + int(seq%uint32(a.slots))*a.slotSize
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
		return nil, nil, fmt.Errorf("netmapio: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "tapgro-vnet-ring")
	a := &shmArea{slots: slots, slotSize: slotSize}
	if err := unix.Ftruncate(fd, int64(a.size())); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("netmapio: sizing the shared ring: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, shmSeals); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("netmapio: sealing the shared ring: %w", err)
	}
	if a.mem, err = unix.Mmap(fd, 0, a.size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("netmapio: mapping the shared ring: %w", err)
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
		return nil, fmt.Errorf("netmapio: peer's shared ring: %w", err)
	}
	if st.Size != int64(a.size()) {
		return nil, fmt.Errorf("netmapio: peer's shared ring is %d bytes, announced %d slots of %d (%d bytes)",
			st.Size, slots, slotSize, a.size())
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		return nil, fmt.Errorf("netmapio: peer's shared ring is not sealed against resizing (seals %#x, %v)", seals, err)
	}
	if a.mem, err = unix.Mmap(fd, 0, a.size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("netmapio: mapping the peer's shared ring: %w", err)
	}
	a.refs.Store(1)
	return a, nil
}

// shmExchange creates this end's ring, sends it to the peer and maps the peer's, within
// timeout. It runs right after a hello in which both ends offered shared memory, before
// any record, so the 16-byte announcements cannot be confused with records.
func shmExchange(c *net.UnixConn, timeout time.Duration) (tx, rx *shmArea, err error) {
	peer := peerString(c)
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
		return nil, nil, fmt.Errorf("netmapio: sending the shared ring to %s: %w", peer, err)
	}
	var got [shmMsgLen]byte
	oob := make([]byte, unix.CmsgSpace(4*4)) // room for a few fds, so extras are seen and closed
	n, oobn, _, _, err := c.ReadMsgUnix(got[:], oob)
	if err != nil {
		return nil, nil, fmt.Errorf("netmapio: receiving %s's shared ring: %w", peer, err)
	}
	fds, err := rightsOf(oob[:oobn])
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("netmapio: %s's shared ring announcement: %w", peer, err)
	case n != shmMsgLen || [6]byte(got[:6]) != shmMagic || got[6] != 1:
		return nil, nil, fmt.Errorf("netmapio: %s sent a bad shared ring announcement (%d bytes: %x)", peer, n, got[:n])
	case len(fds) != 1:
		return nil, nil, fmt.Errorf("netmapio: %s's shared ring announcement carried %d file descriptors, want 1", peer, len(fds))
	}
	slots := int(binary.LittleEndian.Uint32(got[8:]))
	slotSize := int(binary.LittleEndian.Uint32(got[12:]))
	if slots < 1 || slots > shmMaxSlots || slotSize < ShmHeadroom+VnetStreamHdrLen+MaxFrame ||
		slotSize > shmMaxSlotSz || slotSize%4096 != 0 {
		return nil, nil, fmt.Errorf("netmapio: %s announced a shared ring of %d slots of %d bytes", peer, slots, slotSize)
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

// ShmSender is a port that can send frames through its shared-memory ring
// (*StreamPort once shared memory is set up; see TxSlots).
type ShmSender interface {
	ShmActive() bool
	TxSlots(slots [][]byte, hl int) (n int, base uint32)
	PutShmDesc(rec []byte, seq uint32, n int)
	TxDone()
	TxFrame(rec []byte) []byte
}

// Lender is a port that can lend received frames in place (see ReadBatchLent).
type Lender interface {
	ReadBatchLent(bufs [][]byte, sizes []int, lent [][]byte) (int, error)
	ReleaseLent()
}

var (
	_ ShmSender = (*StreamPort)(nil)
	_ Lender    = (*StreamPort)(nil)
)

// ---- sending side: the TAP→port goroutine ----

// ShmActive reports whether frames may cross this port through shared memory.
func (s *StreamPort) ShmActive() bool { return s.shmTx != nil }

// TxSlots hands out up to len(slots) free slots of this end's ring for the next TAP
// read: slots[i] is laid out so that [hl-byte vnet header][frame] read into it puts the
// frame at ShmHeadroom of the slot, and frame i read into slots[i] has sequence base+i.
// The ring stays mapped, even if the port is closed meanwhile, until TxDone, which must
// follow every TxSlots that returned n > 0.
func (s *StreamPort) TxSlots(slots [][]byte, hl int) (n int, base uint32) {
	a := s.shmTx
	if a == nil || hl > ShmHeadroom || !a.acquire() {
		return 0, 0
	}
	// The peer's counter is only believed moving forward, within what was handed out.
	if c := a.consumed().Load(); int32(c-s.txConsumed) > 0 && int32(s.txHead-c) >= 0 {
		s.txConsumed = c
	}
	free := a.slots - int(s.txHead-s.txConsumed)
	if free <= 0 {
		a.release()
		s.stats.ShmRingFull.Add(1)
		return 0, 0
	}
	n = min(free, len(slots))
	for i := 0; i < n; i++ {
		slots[i] = a.slot(s.txHead + uint32(i))[ShmHeadroom-hl:]
	}
	return n, s.txHead
}

// PutShmDesc fills rec[:ShmDescLen], the body of the descriptor record that follows
// the vnet header, for the frame of n bytes read into the slot of sequence seq (from
// the last TxSlots), and marks that slot, and any unused one before it, in flight.
func (s *StreamPort) PutShmDesc(rec []byte, seq uint32, n int) {
	binary.LittleEndian.PutUint32(rec[0:], seq)
	binary.LittleEndian.PutUint32(rec[4:], uint32(n))
	s.txHead = seq + 1
	s.stats.ShmFramesOut.Add(1)
}

// TxDone ends the use of the slots the last TxSlots handed out.
func (s *StreamPort) TxDone() { s.shmTx.release() }

// TxFrame returns the frame a descriptor record (vnet header included) sent by this end
// names, for packet capture; nil for an ordinary record. The caller must hold the
// slots it got from TxSlots (descriptors name only those).
func (s *StreamPort) TxFrame(rec []byte) []byte {
	if s.shmTx == nil || len(rec) != s.hdrLen+ShmDescLen {
		return nil
	}
	seq := binary.LittleEndian.Uint32(rec[s.hdrLen:])
	n := int(binary.LittleEndian.Uint32(rec[s.hdrLen+4:]))
	if n > s.shmTx.slotSize-ShmHeadroom {
		return nil
	}
	return s.shmTx.slot(seq)[ShmHeadroom : ShmHeadroom+n]
}

// ---- receiving side: the port→TAP goroutine ----

// lend resolves the descriptor record rec (vnet header included) to the peer's slot.
// It returns the whole slot with the record's vnet header copied in front of the frame,
// at ShmHeadroom-hdrLen, and the frame's length.
func (s *StreamPort) lend(rec []byte) ([]byte, int, error) {
	a := s.shmRx
	seq := binary.LittleEndian.Uint32(rec[s.hdrLen:])
	n := int(binary.LittleEndian.Uint32(rec[s.hdrLen+4:]))
	if d := seq - s.rxNext; d >= uint32(a.slots) {
		return nil, 0, fmt.Errorf("%w: descriptor for slot sequence %d, expected %d..%d",
			errBadDesc, seq, s.rxNext, s.rxNext+uint32(a.slots)-1)
	}
	if n < MinFrame || n > a.slotSize-ShmHeadroom {
		return nil, 0, fmt.Errorf("%w: descriptor for a %d-byte frame, want %d..%d",
			errBadDesc, n, MinFrame, a.slotSize-ShmHeadroom)
	}
	if !s.rxHeld {
		if !a.acquire() {
			return nil, 0, ErrClosed
		}
		s.rxHeld = true
	}
	sl := a.slot(seq)
	copy(sl[ShmHeadroom-s.hdrLen:ShmHeadroom], rec[:s.hdrLen])
	s.rxNext = seq + 1
	s.stats.ShmFramesIn.Add(1)
	return sl, n, nil
}

var errBadDesc = errors.New("netmapio: bad shared-memory descriptor")

// ReleaseLent hands every slot lent since the last call back to the peer. The caller
// must be done with the frames ReadBatchLent lent; a port without shared memory does
// nothing.
func (s *StreamPort) ReleaseLent() {
	if !s.rxHeld {
		return
	}
	s.shmRx.consumed().Store(s.rxNext)
	s.rxHeld = false
	s.shmRx.release()
}

// isDesc reports whether a record read from the stream is a shared-memory descriptor.
func (s *StreamPort) isDesc(rec []byte) bool {
	return s.shmRx != nil && len(rec) == s.hdrLen+ShmDescLen
}

// releaseShm drops the port's own references on Close.
func (s *StreamPort) releaseShm() {
	if s.shmTx != nil {
		s.shmTx.release()
	}
	if s.shmRx != nil {
		s.shmRx.release()
	}
}
