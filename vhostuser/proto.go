//go:build linux

package vhostuser

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/vhostuser/vuproto"
)

// The request codes, as the back-end's API names them: Stats.Messages is indexed by
// them and Handler.Unknown reports one. They are vuproto's (the wire format's), which
// also holds the header flags, the protocol feature bits and the payload layouts.
const (
	ReqGetFeatures         = vuproto.ReqGetFeatures
	ReqSetFeatures         = vuproto.ReqSetFeatures
	ReqSetOwner            = vuproto.ReqSetOwner
	ReqResetOwner          = vuproto.ReqResetOwner
	ReqSetMemTable         = vuproto.ReqSetMemTable
	ReqSetLogBase          = vuproto.ReqSetLogBase
	ReqSetLogFd            = vuproto.ReqSetLogFd
	ReqSetVringNum         = vuproto.ReqSetVringNum
	ReqSetVringAddr        = vuproto.ReqSetVringAddr
	ReqSetVringBase        = vuproto.ReqSetVringBase
	ReqGetVringBase        = vuproto.ReqGetVringBase
	ReqSetVringKick        = vuproto.ReqSetVringKick
	ReqSetVringCall        = vuproto.ReqSetVringCall
	ReqSetVringErr         = vuproto.ReqSetVringErr
	ReqGetProtocolFeatures = vuproto.ReqGetProtocolFeatures
	ReqSetProtocolFeatures = vuproto.ReqSetProtocolFeatures
	ReqGetQueueNum         = vuproto.ReqGetQueueNum
	ReqSetVringEnable      = vuproto.ReqSetVringEnable
	ReqSendRARP            = vuproto.ReqSendRARP
	ReqNetSetMTU           = vuproto.ReqNetSetMTU

	// MaxRequest bounds the per-type message counters; higher IDs share the last slot.
	MaxRequest = 64
)

const (
	// maxPayload is sizeof(VhostUserPayload) in QEMU 7.2 on x86_64 (its largest member is
	// VhostUserCryptoSession): QEMU itself refuses larger replies in vhost_user_read, so a
	// larger size can only be a broken or hostile front-end. Net requests need at most
	// 8+8·32 = 264 bytes (SET_MEM_TABLE with VHOST_MEMORY_BASELINE_NREGIONS regions).
	maxPayload = 632
	// maxFds matches libvhost-user's VHOST_MEMORY_BASELINE_NREGIONS-sized control buffer
	// (subprojects/libvhost-user/libvhost-user.c vu_message_read_default).
	maxFds = 8

	// oobSize is CMSG_SPACE(8*sizeof(int)) on 64-bit Linux: room for exactly maxFds, so
	// a message with more fds comes back with MSG_CTRUNC and is refused.
	oobSize = 48
)

// ErrProtocol marks a malformed message. It ends the session: after a framing error the
// byte stream cannot be trusted to be in step any more.
var ErrProtocol = errors.New("vhost-user: protocol error")

func protoErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrProtocol, fmt.Sprintf(format, a...))
}

// message is one request as read off the socket. fds are owned by the message until a
// handler takes them (setting the slot to -1); closeFds closes the rest.
type message struct {
	req     uint32
	flags   uint32
	size    uint32
	payload [maxPayload]byte
	fds     [maxFds]int
	nfds    int
}

func (m *message) body() []byte { return m.payload[:m.size] }

func (m *message) needReply() bool { return m.flags&vuproto.FlagNeedReply != 0 }

// takeFd hands fd i to the caller, who then owns it.
func (m *message) takeFd(i int) int {
	fd := m.fds[i]
	m.fds[i] = -1
	return fd
}

func (m *message) closeFds() {
	for i := 0; i < m.nfds; i++ {
		if m.fds[i] >= 0 {
			unix.Close(m.fds[i])
			m.fds[i] = -1
		}
	}
	m.nfds = 0
}

// parseHeader checks the 12-byte header. QEMU 7.2 sends flags 0x1, or 0x9 when it wants
// a REPLY_ACK (vhost_user_write; vhost-user.rst "Message Specification"). A REPLY bit or
// unknown bits in a request mean the peer is not speaking this protocol.
func parseHeader(h []byte) (req, flags, size uint32, err error) {
	req = binary.LittleEndian.Uint32(h[0:])
	flags = binary.LittleEndian.Uint32(h[4:])
	size = binary.LittleEndian.Uint32(h[8:])
	if flags&vuproto.FlagVersionMask != vuproto.FlagVersion {
		return 0, 0, 0, protoErr("version %d in flags %#x", flags&vuproto.FlagVersionMask, flags)
	}
	if flags&^(vuproto.FlagVersionMask|vuproto.FlagNeedReply) != 0 {
		return 0, 0, 0, protoErr("unexpected flags %#x in request %d", flags, req)
	}
	if size > maxPayload {
		return 0, 0, 0, protoErr("request %d size %d > %d", req, size, maxPayload)
	}
	return req, flags, size, nil
}

// sizeRule says what payload size a known request must carry: exact (>= 0), or -1 for
// SET_MEM_TABLE whose size depends on its region count, or -2 for unknown requests.
func sizeRule(req uint32) int {
	switch req {
	case ReqGetFeatures, ReqSetOwner, ReqResetOwner, ReqGetProtocolFeatures, ReqGetQueueNum:
		return 0
	case ReqSetFeatures, ReqSetProtocolFeatures, ReqSetVringKick, ReqSetVringCall, ReqSetVringErr,
		ReqNetSetMTU, ReqSendRARP:
		return 8 // u64
	case ReqSetVringNum, ReqSetVringBase, ReqGetVringBase, ReqSetVringEnable:
		return 8 // struct vhost_vring_state
	case ReqSetVringAddr:
		return 40 // struct vhost_vring_addr
	case ReqSetLogBase:
		return 16 // VhostUserLog {mmap_size, mmap_offset}, with PROTOCOL_F_LOG_SHMFD
	case ReqSetMemTable:
		return -1
	}
	return -2
}

// fdRule is how many fds a known request carries, given its payload (vhost-user.rst
// "Communication": which messages have ancillary data). -1 = unknown request.
func fdRule(req uint32, p []byte) int {
	switch req {
	case ReqSetMemTable:
		return int(binary.LittleEndian.Uint32(p))
	case ReqSetVringKick, ReqSetVringCall, ReqSetVringErr:
		if binary.LittleEndian.Uint64(p)&vuproto.VringNoFd != 0 {
			return 0
		}
		return 1
	case ReqSetLogBase:
		return 1 // the log's memfd
	}
	if sizeRule(req) == -2 {
		return -1
	}
	return 0
}

// validate checks a complete known message's size and fd count.
func validate(req uint32, p []byte, nfds int) error {
	switch r := sizeRule(req); r {
	case -2:
		return nil
	case -1:
		if len(p) < 8 {
			return protoErr("SET_MEM_TABLE size %d", len(p))
		}
		n := binary.LittleEndian.Uint32(p)
		if n == 0 || n > vuproto.MaxRegions || len(p) != 8+32*int(n) {
			return protoErr("SET_MEM_TABLE with %d regions in %d bytes", n, len(p))
		}
	default:
		if len(p) != r {
			return protoErr("request %d size %d, want %d", req, len(p), r)
		}
	}
	if want := fdRule(req, p); want != nfds {
		return protoErr("request %d carries %d fds, want %d", req, nfds, want)
	}
	return nil
}

func decodeU64(p []byte) (uint64, error) {
	if len(p) != 8 {
		return 0, protoErr("u64 payload of %d bytes", len(p))
	}
	return binary.LittleEndian.Uint64(p), nil
}

func decodeState(p []byte) (vuproto.VringState, error) {
	if len(p) != 8 {
		return vuproto.VringState{}, protoErr("vring state of %d bytes", len(p))
	}
	return vuproto.VringState{Index: binary.LittleEndian.Uint32(p), Num: binary.LittleEndian.Uint32(p[4:])}, nil
}

func decodeAddr(p []byte) (vuproto.VringAddr, error) {
	if len(p) != 40 {
		return vuproto.VringAddr{}, protoErr("vring addr of %d bytes", len(p))
	}
	le := binary.LittleEndian
	return vuproto.VringAddr{Index: le.Uint32(p), Flags: le.Uint32(p[4:]), Desc: le.Uint64(p[8:]),
		Used: le.Uint64(p[16:]), Avail: le.Uint64(p[24:]), Log: le.Uint64(p[32:])}, nil
}

func decodeMemTable(p []byte) (vuproto.MemTable, error) {
	var t vuproto.MemTable
	if len(p) < 8 {
		return t, protoErr("memory table of %d bytes", len(p))
	}
	n := binary.LittleEndian.Uint32(p)
	if n == 0 || n > vuproto.MaxRegions || len(p) != 8+32*int(n) {
		return t, protoErr("memory table with %d regions in %d bytes", n, len(p))
	}
	t.N = int(n)
	le := binary.LittleEndian
	for i := 0; i < t.N; i++ {
		r := p[8+32*i:]
		t.Regions[i] = vuproto.MemRegion{GPA: le.Uint64(r), Size: le.Uint64(r[8:]), UserAddr: le.Uint64(r[16:]),
			MmapOffset: le.Uint64(r[24:])}
	}
	return t, nil
}

// conn is the back-end end of the socket. Reads go through the runtime poller
// (SyscallConn), so a session costs a parked goroutine, not a blocked thread.
type conn struct {
	uc  *net.UnixConn
	raw syscall.RawConn
	oob [oobSize]byte
	out [vuproto.HeaderSize + 8]byte
}

func newConn(uc *net.UnixConn) (*conn, error) {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &conn{uc: uc, raw: raw}, nil
}

// recv is one recvmsg(2) with MSG_CMSG_CLOEXEC, so a received fd never leaks into a
// child process. It returns the fds of any SCM_RIGHTS message; the caller owns them.
func (c *conn) recv(p []byte, fds *[maxFds]int, nfds *int) (int, error) {
	var n, oobn, rflags int
	var err error
	rerr := c.raw.Read(func(fd uintptr) bool {
		n, oobn, rflags, _, err = unix.Recvmsg(int(fd), p, c.oob[:], unix.MSG_CMSG_CLOEXEC)
		return err != unix.EAGAIN
	})
	if rerr != nil {
		// The poller's error (a deadline that passed, the socket closed) wins over the
		// EAGAIN the last attempt saw.
		err = rerr
	}
	if err != nil {
		return 0, err
	}
	var got []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(c.oob[:oobn])
		for i := range msgs {
			if r, e := unix.ParseUnixRights(&msgs[i]); e == nil {
				got = append(got, r...)
			}
		}
		if perr != nil && len(got) == 0 {
			err = protoErr("control message: %v", perr)
		}
	}
	// Keep what fits, close the rest: an fd we do not keep must never stay open.
	for _, fd := range got {
		if *nfds < maxFds {
			fds[*nfds] = fd
			*nfds++
		} else {
			unix.Close(fd)
			err = protoErr("more than %d fds", maxFds)
		}
	}
	if rflags&unix.MSG_CTRUNC != 0 {
		// The kernel dropped fds that did not fit: the message is incomplete and
		// cannot be processed (libvhost-user vu_message_read_default treats it so).
		err = protoErr("control data truncated (MSG_CTRUNC)")
	}
	return n, err
}

// errIdle is readMsg's answer when the read deadline passed before the first byte of a
// message: nothing is lost, and the caller decides whether waiting on is right.
var errIdle = errors.New("vhost-user: no message before the deadline")

// msgTimeout bounds a message once its first byte has arrived, and every reply: a
// front-end sends each message with one sendmsg (QEMU vhost_user_write) and reads
// each reply at once, so a message left half sent, or a reply left unread, is a peer
// that would otherwise hold the session, and the socket, for as long as it likes.
const msgTimeout = 5 * time.Second

// readMsg reads exactly one message: the 12-byte header (fds arrive with its first byte,
// QEMU vhost_user_write sends fds and bytes in one sendmsg), then exactly size bytes.
// io.EOF means the peer closed the socket between messages; errIdle that the read
// deadline the caller set passed before the message began. Once it has begun the rest
// must come within msgTimeout.
func (c *conn) readMsg(m *message) error {
	m.nfds = 0
	var hdr [vuproto.HeaderSize]byte
	got := 0
	for got < vuproto.HeaderSize {
		before := m.nfds
		n, err := c.recv(hdr[got:], &m.fds, &m.nfds)
		if err == nil && got > 0 && m.nfds != before {
			err = protoErr("fds in the middle of a header")
		}
		if err == nil && n == 0 {
			if got == 0 && m.nfds == 0 {
				return io.EOF
			}
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			m.closeFds()
			return c.timeoutErr(err, got == 0 && m.nfds == 0)
		}
		if got == 0 {
			c.uc.SetReadDeadline(time.Now().Add(msgTimeout))
		}
		got += n
	}
	req, flags, size, err := parseHeader(hdr[:])
	if err != nil {
		m.closeFds()
		return err
	}
	m.req, m.flags, m.size = req, flags, size
	for got = 0; got < int(size); {
		before := m.nfds
		n, err := c.recv(m.payload[got:size], &m.fds, &m.nfds)
		if err == nil && m.nfds != before {
			err = protoErr("fds inside a payload")
		}
		if err == nil && n == 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			m.closeFds()
			return c.timeoutErr(err, false)
		}
		got += n
	}
	return nil
}

// timeoutErr turns a deadline that passed into errIdle (nothing of a message read yet)
// or into a protocol error (a message begun and not finished within msgTimeout).
func (c *conn) timeoutErr(err error, idle bool) error {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	if idle {
		return errIdle
	}
	return protoErr("a message begun was not finished within %v", msgTimeout)
}

// reply sends {req, flags 0x5, size, payload}. QEMU's vhost_user_read_header and
// process_message_reply reject any other flags, another request type, or another size.
func (c *conn) reply(req uint32, payload []byte) error {
	n := vuproto.HeaderSize + len(payload)
	b := c.out[:n]
	binary.LittleEndian.PutUint32(b[0:], req)
	binary.LittleEndian.PutUint32(b[4:], vuproto.ReplyFlags)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	copy(b[vuproto.HeaderSize:], payload)
	c.uc.SetWriteDeadline(time.Now().Add(msgTimeout))
	_, err := c.uc.Write(b)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = protoErr("the front-end did not read a reply within %v", msgTimeout)
	}
	return err
}

func (c *conn) replyU64(req uint32, v uint64) error {
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], v)
	return c.reply(req, p[:])
}

func (c *conn) replyState(req uint32, s vuproto.VringState) error {
	var p [8]byte
	binary.LittleEndian.PutUint32(p[:], s.Index)
	binary.LittleEndian.PutUint32(p[4:], s.Num)
	return c.reply(req, p[:])
}
