package port

import "sync/atomic"

// Stats counts what an endpoint and the Ports it hands out did, as every transport
// counts it; what only one transport has (netmap's rings, the vnet-hdr=on stream's
// hello and shared memory) is that transport's own, a port.CounterSource. The packet path never
// logs; the caller reads these (e.g. for /metrics). One Stats is shared by every Port of
// an endpoint, so the totals survive reconnects. It lives here, below every transport
// and the endpoint code, because the transports add to it and the endpoint owns it.
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
}
