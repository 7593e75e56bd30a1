//go:build linux

package vhostuser

import "sync/atomic"

// What a Backend tells its owner: its counters (Stats), the features a session acked,
// and the Handler calls a session makes.

// Stats are the back-end's counters, all atomic; one Stats may outlive many sessions.
type Stats struct {
	Messages [MaxRequest + 1]atomic.Uint64 // by request type; ≥ MaxRequest share the last slot
	Unknown  atomic.Uint64                 // requests not handled (also in Messages)
	Failed   atomic.Uint64                 // requests answered with a failure
	Rejected [NumReasons]atomic.Uint64     // rejected chains / rings, by reason
	Kicks    atomic.Uint64                 // kick eventfd reads that returned a count
	Calls    atomic.Uint64                 // call eventfd signals
	// CallsDropped counts calls the call eventfd refused (its counter at the limit,
	// EAGAIN): the count already in it signals the front-end, so none is lost.
	CallsDropped atomic.Uint64
	// CallsDeferred counts calls moderation postponed (Vring.SetCallModeration); each
	// was sent later, merged with the calls that followed, or found unneeded.
	CallsDeferred atomic.Uint64
	// PollHits counts the times a worker's poll window (Vring.SetPollWindow) saw the
	// driver post chains while it watched, so it took them with no kick and no sleep.
	PollHits atomic.Uint64
	Sessions atomic.Uint64 // connections whose front-end sent at least one message
	Ended    atomic.Uint64 // those sessions that have ended
	// Jammed counts sessions ended because a write to one of the front-end's eventfds
	// slept (the front-end filled its counter and made it blocking: signal.go).
	Jammed atomic.Uint64
	// Refused counts connections closed unserved because a session was running (one
	// front-end per socket; vhostnet.Net.Serve).
	Refused atomic.Uint64
	// PeerRefused counts connections closed unserved because the peer's credentials
	// were not on the allow-list (vhostnet.Peers).
	PeerRefused atomic.Uint64
	// Logging is true while the front-end has dirty logging on (VHOST_F_LOG_ALL acked
	// and a log mapped: a migration is running). LogPages counts the pages whose bit
	// this back-end set (0 → 1: pages dirtied since QEMU last collected them), LogBeyond
	// the pages it wrote past the end of the log (a log sized too small), log.go.
	Logging   atomic.Bool
	LogPages  atomic.Uint64
	LogBeyond atomic.Uint64
}

// Features is what SET_FEATURES acked.
type Features struct {
	Bits   uint64 // as acked, bit 30 included
	HdrLen int    // the device's header on every chain for these acks (Config.HeaderLen)
}

// Has reports whether virtio feature bit b was acked.
func (f Features) Has(b uint) bool { return f.Bits&(1<<b) != 0 }

// Handler is how a session reports to its owner. All methods are called from the
// session goroutine, synchronously: the session waits for them.
type Handler interface {
	// FeaturesAcked reports SET_FEATURES.
	FeaturesAcked(f Features)
	// RingStarted: the ring is running; the owner starts its worker, which loops on
	// Wait / Begin … End until they return ErrStopped or ErrBroken.
	RingStarted(q Queue)
	// RingStopping: GET_VRING_BASE is about to stop the running ring; the ring still
	// runs. The owner hands the guest what it holds for this ring while it can (frames
	// read but not delivered): after the stop nothing more can go in, and in a
	// migration what was not in guest memory by then is lost (vhost-user.rst
	// "Migration": the back-end must finish or flush its work before answering).
	RingStopping(q Queue)
	// RingStopped: the ring is stopped (GET_VRING_BASE, or the session ended). The
	// owner must not use q after returning; join the worker here (it is already
	// being woken with ErrStopped).
	RingStopped(q Queue)
	// VringEnabled reports SET_VRING_ENABLE for q (on: num 1), whether or not q is
	// running: QEMU sends it before the rings start and again whenever the guest
	// changes its number of queue pairs (hw/net/virtio-net.c peer_attach/peer_detach →
	// vhost_set_vring_enable). A started ring's Enabled follows it already; this is for
	// an owner that maps the state onto something outside the ring (a TAP queue).
	VringEnabled(q Queue, on bool)
	// SetMTU reports NET_SET_MTU (only sent if Config.NetMTU); an error refuses it.
	SetMTU(mtu int) error
	// Unknown reports a request this back-end does not handle; the session goes on.
	Unknown(req uint32, size int)
	// SessionEnded: the socket closed or broke (err nil on a clean close).
	SessionEnded(err error)
}

// NopHandler implements Handler with no-ops, for embedding.
type NopHandler struct{}

func (NopHandler) FeaturesAcked(Features)   {}
func (NopHandler) RingStarted(Queue)        {}
func (NopHandler) RingStopping(Queue)       {}
func (NopHandler) RingStopped(Queue)        {}
func (NopHandler) VringEnabled(Queue, bool) {}
func (NopHandler) SetMTU(int) error         { return nil }
func (NopHandler) Unknown(uint32, int)      {}
func (NopHandler) SessionEnded(error)       {}
