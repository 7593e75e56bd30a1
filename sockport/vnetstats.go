package sockport

import (
	"sync/atomic"

	"tapgro/port"
)

// VnetStats are the counters only the vnet-hdr=on stream has: its hello and its
// shared-memory rings. One VnetStats is shared by every connection of an endpoint, so
// the totals survive reconnects; they reach the operator surfaces as port.Counters
// (port.CounterSource), so nothing above the transport knows their names.
type VnetStats struct {
	HelloFailures atomic.Uint64 // peers that failed the hello (wrong kind of peer or version)
	ShmConnects   atomic.Uint64 // connections that set up shared-memory rings
	ShmFramesOut  atomic.Uint64 // frames sent as a descriptor to a slot of this end's ring
	ShmFramesIn   atomic.Uint64 // frames received as a descriptor to a slot of the peer's ring
	ShmRingFull   atomic.Uint64 // TAP read batches that found this end's ring full (frames went inline)
}

// Counters are s as the series tapgro exports.
func (s *VnetStats) Counters() []port.Counter {
	const framesHelp = "Frames that crossed in a shared-memory ring slot instead of the socket (tap_to_port: read into this end's ring; port_to_tap: written from the peer's)."
	return []port.Counter{
		{Name: "tapgro_port_hello_failures_total", Help: "vnet-hdr=on peers that failed the hello (QEMU, a plain tapgro, another protocol version); each connection was closed.", Value: s.HelloFailures.Load},
		{Name: "tapgro_shm_connects_total", Help: "vnet-hdr=on connections over AF_UNIX that set up shared-memory rings with their peer.", Value: s.ShmConnects.Load},
		{Name: "tapgro_shm_frames_total", Help: framesHelp, Labels: map[string]string{"direction": "tap_to_port"}, Value: s.ShmFramesOut.Load},
		{Name: "tapgro_shm_frames_total", Help: framesHelp, Labels: map[string]string{"direction": "port_to_tap"}, Value: s.ShmFramesIn.Load},
		{Name: "tapgro_shm_ring_full_total", Help: "TAP read batches that found this end's shared-memory ring full: their frames crossed the socket instead.", Value: s.ShmRingFull.Load},
	}
}
