//go:build linux

package vhostusertest

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
	"tapgro/virtio"
)

// QEMU's side of a live migration's dirty log (hw/virtio/vhost.c): the log it shares
// with the back-end, how it turns logging on and off on running rings, and how it
// collects the marked pages.

// LogPage is the log's unit (VHOST_LOG_PAGE).
const LogPage = 4096

// Log is a dirty log as QEMU allocates it (vhost_log_alloc with a shared memfd): one bit
// per LogPage of guest-physical memory.
type Log struct {
	FD  int
	Mem []byte
}

// logSize is vhost_get_log_size: the bitmap, in bytes (whole unsigned longs), covering
// every region's last byte.
func logSize(g *Guest) int {
	var chunks uint64
	for _, r := range g.Regions {
		last := r.GPA + r.Size - 1
		chunks = max(chunks, last/(LogPage*64)+1)
	}
	return int(chunks * 8)
}

// StartLog does what QEMU does when a migration starts (vhost_migration_log →
// vhost_dev_log_resize, vhost_dev_set_log): SET_LOG_BASE with a memfd holding the
// bitmap, then SET_FEATURES with VHOST_F_LOG_ALL and SET_VRING_ADDR with
// VHOST_VRING_F_LOG on every ring, running or not, each waiting for the back-end's
// REPLY_ACK as QEMU does for these (vhost_user_set_features and
// vhost_user_set_vring_addr wait when logging is enabled).
func (s *Session) StartLog() *Log {
	s.tb.Helper()
	n := logSize(s.G)
	fd, err := unix.MemfdCreate("vhost-log", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		s.tb.Fatal(err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		s.tb.Fatal(err)
	}
	// QEMU seals its log (qemu_memfd_alloc with F_SEAL_GROW|F_SEAL_SHRINK|F_SEAL_SEAL).
	unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL)
	m, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		s.tb.Fatal(err)
	}
	l := &Log{FD: fd, Mem: m}
	s.tb.Cleanup(func() { unix.Munmap(m); unix.Close(fd) })
	p := binary.LittleEndian.AppendUint64(nil, uint64(n))
	p = binary.LittleEndian.AppendUint64(p, 0)
	s.FE.Send(vuproto.ReqSetLogBase, vuproto.FlagVersion, p, fd)
	s.FE.Reply(vuproto.ReqSetLogBase, 0)
	s.setLogging(true)
	return l
}

// StopLog turns logging off again (vhost_dev_set_log(dev, false)): SET_FEATURES
// without LOG_ALL, SET_VRING_ADDR without the flag.
func (s *Session) StopLog() { s.setLogging(false) }

func (s *Session) setLogging(on bool) {
	s.tb.Helper()
	f := s.Acked &^ (1 << virtio.LogAll)
	if on {
		f |= 1 << virtio.LogAll
	}
	if r := s.FE.Ack(vuproto.ReqSetFeatures, U64(f)); r != 0 {
		s.tb.Fatalf("SET_FEATURES %#x ack %d", f, r)
	}
	for _, r := range s.Rings {
		p := AddrPayload(r)
		if on {
			binary.LittleEndian.PutUint32(p[4:], 1) // VHOST_VRING_F_LOG
		}
		if a := s.FE.Ack(vuproto.ReqSetVringAddr, p); a != 0 {
			s.tb.Fatalf("SET_VRING_ADDR (log %v) ring %d ack %d", on, r.Idx, a)
		}
	}
}

// Collect returns the guest-physical page numbers marked since the last Collect and
// clears them, as QEMU's vhost_log_sync does (an atomic exchange per word).
func (l *Log) Collect() []uint64 {
	var pages []uint64
	for w := 0; w+8 <= len(l.Mem); w += 8 {
		p := (*uint64)(unsafe.Pointer(&l.Mem[w]))
		v := atomic.SwapUint64(p, 0)
		for v != 0 {
			b := bits.TrailingZeros64(v)
			v &^= 1 << b
			pages = append(pages, uint64(w)*8+uint64(b))
		}
	}
	return pages
}
