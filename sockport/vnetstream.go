package sockport

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"tapgro/port"
	"tapgro/vnethdr"
)

// The vnet-hdr=on stream is tapgro's own extension of QEMU's stream framing, for a link
// between two tapgro instances: every record is [4-byte BE length][12-byte
// virtio_net_hdr, LE][Ethernet frame], the length covering header and frame, so 64 KiB
// GSO frames and partial checksums cross the link whole instead of being segmented on
// one side and coalesced again on the other.
//
// It opens with a hello in both directions, before any record:
//
//	off size
//	0   7    magic "TAPGRO\x00"
//	7   1    protocol version (1)
//	8   1    vnet header length of the records (12)
//	9   1    reserved, 0
//	10  2    flags, LE: bit 0 (HelloShm) offers shared-memory rings (shm.go); others 0
//	12  4    offloads this end accepts, LE, TUN_F_* bits (vnethdr.Offloads)
//
// When both ends set HelloShm, each then sends a 16-byte ring announcement carrying its
// ring's memfd (shm.go) before any record.
//
// The magic is chosen so that a QEMU stream backend, which reads a 4-byte big-endian
// length first (net/net.c net_fill_rstate), sees "TAPG" = 1413566535 > NET_BUFSIZE (69632)
// and drops the connection at once, and so that a plain tapgro stream port reports the same
// bad length with a hint (port.FrameError). In the other direction, a record from QEMU or a
// plain tapgro starts with a small length, never the magic, and the hello fails at once
// with an error naming the bytes received.

const (
	// VnetStreamHdrLen is the virtio_net_hdr carried by every vnet-hdr=on record: the
	// 12-byte virtio_net_hdr_v1 layout (include/uapi/linux/virtio_net.h), explicit
	// little-endian.
	VnetStreamHdrLen = vnethdr.LenMrgRxbuf

	// VnetStreamVersion is the hello's protocol version.
	VnetStreamVersion = 1

	// HelloLen is the size of the hello each end sends.
	HelloLen = 16

	// HelloTimeout bounds the hello: a peer that says nothing for this long is not a
	// tapgro speaking vnet-hdr=on (a QEMU with an idle guest sends nothing at all).
	HelloTimeout = 5 * time.Second
)

// vnetFraming is what the vnet-hdr=on extension adds to a StreamPort: the header length
// every record carries, what the peer said it accepts, and what this end told the peer
// it accepts (so what the peer may send). All zero on a QEMU-framed stream.
type vnetFraming struct {
	hdrLen  int
	accepts vnethdr.Offloads
	emits   vnethdr.Offloads
}

// HelloShm is the hello flag offering shared-memory rings. Only an AF_UNIX stream can
// pass the memfd, so only such a stream offers it.
const HelloShm = 1 << 0

// helloMagic opens the hello; see the layout above.
var helloMagic = [7]byte{'T', 'A', 'P', 'G', 'R', 'O', 0}

// helloPrefixLen is what a QEMU-framed reader takes for a record length when it reads a
// hello: the magic's first four bytes, big-endian.
var helloPrefixLen = uint64(binary.BigEndian.Uint32(helloMagic[:4]))

// helloHint is the FrameError.Hint a QEMU-framed reader gives for helloPrefixLen.
const helloHint = "the peer opened with tapgro's vnet-hdr=on hello; set vnet-hdr=on on this end too"

// VnetStreamAccepts is what a tapgro accepts on a vnet-hdr=on stream: every offload its
// port→TAP path can finish, by handing the frame to the TAP whole where the kernel takes
// it and by segmenting or checksumming in software where it does not. UFO is not
// included: no current kernel produces it and tapgro cannot segment it.
const VnetStreamAccepts = vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 |
	vnethdr.OffloadTSOECN | vnethdr.OffloadUSO

// ErrNotVnetPeer is wrapped by every hello failure that shows the peer does not speak the
// vnet-hdr=on stream (QEMU, a plain tapgro, anything else).
var ErrNotVnetPeer = errors.New("peer is not a tapgro speaking vnet-hdr=on")

// HelloError is a failed hello: who, and what went wrong, with the bytes received.
type HelloError struct {
	Peer string
	Got  []byte // the bytes received before the failure (up to HelloLen)
	Err  error  // wraps ErrNotVnetPeer for a peer of the wrong kind
}

func (e *HelloError) Error() string {
	if len(e.Got) > 0 {
		return fmt.Sprintf("sockport: hello with %s: %v (got %s)", e.Peer, e.Err, hex.EncodeToString(e.Got))
	}
	return fmt.Sprintf("sockport: hello with %s: %v", e.Peer, e.Err)
}

func (e *HelloError) Unwrap() error { return e.Err }

// encodeHello builds this end's hello.
func encodeHello(accepts vnethdr.Offloads, flags uint16) [HelloLen]byte {
	var h [HelloLen]byte
	copy(h[:], helloMagic[:])
	h[7] = VnetStreamVersion
	h[8] = VnetStreamHdrLen
	binary.LittleEndian.PutUint16(h[10:], flags)
	binary.LittleEndian.PutUint32(h[12:], uint32(accepts))
	return h
}

// decodeHello checks a received hello and returns the offloads the peer accepts and its
// flags.
func decodeHello(h []byte) (vnethdr.Offloads, uint16, error) {
	if len(h) < HelloLen {
		return 0, 0, fmt.Errorf("%w: hello is %d bytes, want %d", ErrNotVnetPeer, len(h), HelloLen)
	}
	if [7]byte(h[:7]) != helloMagic {
		return 0, 0, fmt.Errorf("%w: no TAPGRO magic at the start of the stream", ErrNotVnetPeer)
	}
	if h[7] != VnetStreamVersion {
		return 0, 0, fmt.Errorf("peer speaks vnet-hdr stream protocol version %d, this tapgro speaks %d: run the same tapgro release on both ends", h[7], VnetStreamVersion)
	}
	if h[8] != VnetStreamHdrLen {
		return 0, 0, fmt.Errorf("peer carries a %d-byte vnet header, this tapgro %d", h[8], VnetStreamHdrLen)
	}
	flags := binary.LittleEndian.Uint16(h[10:])
	if flags&^HelloShm != 0 || h[9] != 0 {
		return 0, 0, fmt.Errorf("peer sets hello flags %#x/%#x this tapgro does not know", h[9], flags)
	}
	// Bits beyond what either side knows are dropped, not trusted.
	return vnethdr.Offloads(binary.LittleEndian.Uint32(h[12:])) & VnetStreamAccepts, flags, nil
}

// Hello runs the vnet-hdr=on hello on a freshly connected stream: it sends this end's
// hello, then reads the peer's, within timeout. It reads exactly HelloLen bytes, so the
// records that follow stay in the socket. It returns the offloads the peer accepts. The
// connection's deadlines are cleared again on success.
func Hello(c net.Conn, accepts vnethdr.Offloads, timeout time.Duration) (vnethdr.Offloads, error) {
	pa, _, err := hello(c, accepts, 0, timeout)
	return pa, err
}

// hello is Hello sending flags, and returning the peer's.
func hello(c net.Conn, accepts vnethdr.Offloads, flags uint16, timeout time.Duration) (vnethdr.Offloads, uint16, error) {
	peer := PeerString(c)
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return 0, 0, &HelloError{Peer: peer, Err: err}
	}
	// 16 bytes always fit in a fresh socket's buffer, so both ends writing first cannot
	// deadlock.
	h := encodeHello(accepts, flags)
	if _, err := c.Write(h[:]); err != nil {
		return 0, 0, &HelloError{Peer: peer, Err: fmt.Errorf("sending the hello: %w", err)}
	}
	var got [HelloLen]byte
	n, err := io.ReadFull(c, got[:])
	if err != nil {
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			err = fmt.Errorf("%w: no hello within %v", ErrNotVnetPeer, timeout)
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
			err = fmt.Errorf("%w: it closed the connection during the hello (QEMU and a plain tapgro close on it)", ErrNotVnetPeer)
		default:
			err = fmt.Errorf("%w: reading the hello: %w", ErrNotVnetPeer, err)
		}
		return 0, 0, &HelloError{Peer: peer, Got: got[:n], Err: err}
	}
	pa, pf, err := decodeHello(got[:])
	if err != nil {
		return 0, 0, &HelloError{Peer: peer, Got: got[:], Err: err}
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return 0, 0, &HelloError{Peer: peer, Err: err}
	}
	return pa, pf, nil
}

// NewVnetStreamPort runs the hello on c (see Hello) and wraps it as a port.Port whose frames
// carry a VnetStreamHdrLen-byte header. accepts is what this end advertises
// (VnetStreamAccepts for tapgro); the Port's Accepts is what the peer advertised. On
// failure c is left open for the caller to close.
//
// With shm set and c an AF_UNIX stream, it offers shared-memory rings (shm.go) and sets
// them up when the peer offered them too. st and vs are the endpoint's counters (nil: the
// port's own).
func NewVnetStreamPort(c net.Conn, st *port.Stats, vs *VnetStats, accepts vnethdr.Offloads, shm bool, timeout time.Duration) (*StreamPort, error) {
	uc, unixConn := c.(*net.UnixConn)
	var flags uint16
	if shm && unixConn {
		flags |= HelloShm
	}
	pa, pf, err := hello(c, accepts, flags, timeout)
	if err != nil {
		return nil, err
	}
	var tx, rx *shmArea
	if flags&pf&HelloShm != 0 {
		if tx, rx, err = shmExchange(uc, timeout); err != nil {
			return nil, &HelloError{Peer: PeerString(c), Err: err}
		}
	}
	s, err := newStreamPort(c, st, VnetStreamHdrLen)
	if err != nil {
		if tx != nil {
			tx.release()
			rx.release()
		}
		return nil, err
	}
	s.accepts, s.emits = pa, accepts
	if vs == nil {
		vs = new(VnetStats)
	}
	s.vnet = vs
	if tx != nil {
		s.shm = newShmLink(tx, rx, s.hdrLen, vs)
		// Descriptors are shorter than any frame record (shm.go): the deframer lets
		// them through and the reader tells the two apart (StreamPort.record).
		s.df.lo = s.hdrLen + ShmDescLen
		s.SetRelease(s.shm.close)
		vs.ShmConnects.Add(1)
	}
	return s, nil
}
