package netmapio

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Stats counts what an Endpoint and the Ports it hands out did. The packet path never
// logs; the caller reads these (e.g. for /metrics). One Stats is shared by every Port of
// an Endpoint, so the totals survive reconnects.
type Stats struct {
	FramesIn  atomic.Uint64 // frames handed to ReadBatch callers
	FramesOut atomic.Uint64 // frames fully handed to the kernel by WriteBatch
	BytesIn   atomic.Uint64 // frame bytes in (prefixes excluded)
	BytesOut  atomic.Uint64 // frame bytes out (prefixes excluded)

	ReadCalls  atomic.Uint64 // read/recvmmsg system calls, including ones that found nothing
	WriteCalls atomic.Uint64 // writev/sendmmsg system calls
	WriteWaits atomic.Uint64 // times a write met EAGAIN/ENOBUFS and waited for the socket

	BadLength        atomic.Uint64 // stream length prefixes outside [MinFrame, MaxFrame]; each ends a connection
	Truncated        atomic.Uint64 // stream connections that ended inside a record (length prefix or frame), by EOF or reset
	ShortDatagram    atomic.Uint64 // datagrams shorter than MinFrame, dropped
	OversizeDatagram atomic.Uint64 // datagrams longer than MaxFrame (or the buffer), dropped
	SendDrops        atomic.Uint64 // datagrams the kernel refused (no listener yet, ENOBUFS, full for too long), dropped

	Connects    atomic.Uint64 // ports handed out by Next
	Disconnects atomic.Uint64 // ports closed
	Rejects     atomic.Uint64 // extra clients turned away by a server endpoint
	Retries     atomic.Uint64 // failed dial attempts or accept errors, each followed by a wait

	HelloFailures atomic.Uint64 // vnet-hdr=on peers that failed the hello (wrong kind of peer or version)

	ShmConnects  atomic.Uint64 // vnet-hdr=on connections that set up shared-memory rings
	ShmFramesOut atomic.Uint64 // frames sent as a descriptor to a slot of this end's ring
	ShmFramesIn  atomic.Uint64 // frames received as a descriptor to a slot of the peer's ring
	ShmRingFull  atomic.Uint64 // TAP read batches that found this end's ring full (frames went inline)
}

// portBase is what every Port shares: identity, counters and close bookkeeping.
type portBase struct {
	peer  string
	stats *Stats

	closeOnce sync.Once
	closed    atomic.Bool

	mu      sync.Mutex
	lastErr error       // first error ReadBatch/WriteBatch returned, for OnDisconnect
	onClose func(error) // set by the Endpoint; releases its slot and reports
	cleanup func()      // extra teardown after the socket is closed (unlink a path)
	release func()      // the port's own teardown after the socket is closed (shared rings)
	closer  interface{ Close() error }
}

func newPortBase(c interface{ Close() error }, peer string, st *Stats) portBase {
	if st == nil {
		st = new(Stats)
	}
	return portBase{peer: peer, stats: st, closer: c}
}

// fail remembers the first error that ended the port and returns err unchanged.
func (p *portBase) fail(err error) error {
	p.mu.Lock()
	if p.lastErr == nil && !p.closed.Load() {
		p.lastErr = err
	}
	p.mu.Unlock()
	return err
}

func (p *portBase) Peer() string { return p.peer }

// Stats is the counters this port adds to (its Endpoint's, or its own).
func (p *portBase) Stats() *Stats { return p.stats }

func (p *portBase) Close() error {
	var err error
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		err = p.closer.Close()
		if p.release != nil {
			p.release()
		}
		if p.cleanup != nil {
			p.cleanup()
		}
		p.mu.Lock()
		last, hook := p.lastErr, p.onClose
		p.mu.Unlock()
		if hook != nil {
			hook(last)
		}
	})
	return err
}

// setBuffers raises the socket buffers; the kernel caps the request at
// net.core.{r,w}mem_max, and a smaller buffer only costs throughput, so errors are ignored.
func setBuffers(c any) {
	const size = 4 << 20
	if b, ok := c.(interface {
		SetReadBuffer(int) error
		SetWriteBuffer(int) error
	}); ok {
		_ = b.SetReadBuffer(size)
		_ = b.SetWriteBuffer(size)
	}
}

// peerString describes the far end of a connection: the address for TCP, the SO_PEERCRED
// credentials for UNIX (an accepted UNIX socket has no useful address; passt logs the PID
// for the same reason, in tap.c tap_listen_handler).
func peerString(c net.Conn) string {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return c.RemoteAddr().String()
	}
	name := ""
	if a, ok := c.LocalAddr().(*net.UnixAddr); ok && a.Name != "" {
		name = a.Name
	} else if a, ok := c.RemoteAddr().(*net.UnixAddr); ok {
		name = a.Name
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return "unix:" + name
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return "unix:" + name
	}
	return "unix:" + name + " pid=" + strconv.Itoa(int(cred.Pid)) + " uid=" + strconv.Itoa(int(cred.Uid)) + " gid=" + strconv.Itoa(int(cred.Gid))
}

// rawConn returns the syscall.RawConn of a socket-backed net.Conn.
func rawConn(c any) (syscall.RawConn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, errNotSocket
	}
	return sc.SyscallConn()
}
