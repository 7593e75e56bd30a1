package vnethdr

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Header lengths a TAP or peer may use (include/uapi/linux/virtio_net.h).
const (
	// Len is the legacy struct virtio_net_hdr.
	Len = 10
	// LenMrgRxbuf is virtio_net_hdr_mrg_rxbuf / virtio_net_hdr_v1: Len plus num_buffers.
	LenMrgRxbuf = 12
)

// Flags (VIRTIO_NET_HDR_F_*, include/uapi/linux/virtio_net.h).
const (
	FlagNeedsCsum = 0x01
	FlagDataValid = 0x02
	FlagRSCInfo   = 0x04
)

// GSO types (VIRTIO_NET_HDR_GSO_*, include/uapi/linux/virtio_net.h).
const (
	GSONone  = 0
	GSOTCPv4 = 1
	GSOUDP   = 3 // UFO: IP fragmentation, never produced by current kernels.
	GSOTCPv6 = 4
	GSOUDPL4 = 5 // USO: one UDP header per segment.
	GSOECN   = 0x80
)

// ErrShortHeader is returned when a buffer is shorter than the header it should hold.
var ErrShortHeader = errors.New("vnethdr: buffer shorter than virtio_net_hdr")

// Hdr is a decoded virtio_net_hdr. All multi-byte fields are little-endian on the wire
// (virtio 1.0, and the TAP's legacy host order on x86_64, drivers/net/tun_vnet.h
// tun_vnet_is_little_endian); encoding is explicit so the code is correct whatever the host
// byte order.
type Hdr struct {
	Flags      uint8
	GSOType    uint8
	HdrLen     uint16 // a hint only: never trusted, re-derived from the headers.
	GSOSize    uint16
	CsumStart  uint16
	CsumOffset uint16
	NumBuffers uint16 // only carried by 12-byte headers.
}

// Decode fills h from the first n bytes of b, where n is 10 or 12 (bytes 10..n-1 beyond
// num_buffers are ignored). It allocates nothing.
func (h *Hdr) Decode(b []byte, n int) error {
	if n < Len || len(b) < n {
		return ErrShortHeader
	}
	h.Flags = b[0]
	h.GSOType = b[1]
	h.HdrLen = binary.LittleEndian.Uint16(b[2:])
	h.GSOSize = binary.LittleEndian.Uint16(b[4:])
	h.CsumStart = binary.LittleEndian.Uint16(b[6:])
	h.CsumOffset = binary.LittleEndian.Uint16(b[8:])
	h.NumBuffers = 0
	if n >= LenMrgRxbuf {
		h.NumBuffers = binary.LittleEndian.Uint16(b[10:])
	}
	return nil
}

// Encode writes h into the first n bytes of b (n ≥ 10); bytes past num_buffers (past the
// 10-byte header when n < 12) are zeroed so no stale state ever reaches the kernel or a
// peer.
func (h *Hdr) Encode(b []byte, n int) error {
	if n < Len || len(b) < n {
		return ErrShortHeader
	}
	b[0] = h.Flags
	b[1] = h.GSOType
	binary.LittleEndian.PutUint16(b[2:], h.HdrLen)
	binary.LittleEndian.PutUint16(b[4:], h.GSOSize)
	binary.LittleEndian.PutUint16(b[6:], h.CsumStart)
	binary.LittleEndian.PutUint16(b[8:], h.CsumOffset)
	clear(b[Len:n]) // also covers an odd n == 11, where num_buffers does not fit
	if n >= LenMrgRxbuf {
		binary.LittleEndian.PutUint16(b[10:], h.NumBuffers)
	}
	return nil
}

// Zero writes an all-zero header (plain, fully checksummed frame) into b[:n].
func Zero(b []byte, n int) { clear(b[:n]) }

// IsGSO reports whether the header describes a GSO super-frame.
func (h *Hdr) IsGSO() bool { return h.GSOType&^GSOECN != GSONone }

func (h Hdr) String() string {
	return fmt.Sprintf("flags=%#x gso_type=%#x hdr_len=%d gso_size=%d csum_start=%d csum_offset=%d num_buffers=%d",
		h.Flags, h.GSOType, h.HdrLen, h.GSOSize, h.CsumStart, h.CsumOffset, h.NumBuffers)
}
