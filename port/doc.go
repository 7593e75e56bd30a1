// Package port is the contract between tapgro's engine and the transports that carry
// frames to and from a peer: a QEMU socket-family netdev, another tapgro, a netmap port.
// It holds the interfaces, limits and the errors both sides test for, and the
// bookkeeping every transport shares (Stats, Base, FrameError), so that the engine, the
// TAP→port receive pool (package rxpool), the endpoint code (package netdev) and every
// transport (sockport, netmapio) can depend on it without depending on each other.
//
// # Theory of operation
//
// A Port is one live connection. It moves Ethernet frames in batches, each optionally
// preceded by a virtio_net_hdr (VnetHdrLen() bytes; 0 for QEMU's socket-family
// backends, which never carry one). Exactly two goroutines use a Port: one reads, one
// writes; each owns its half of the port's state, so the data path takes no lock.
//
// Beyond the core Port, a transport may offer optional capabilities, discovered with a
// type assertion where the engine sets a connection up (never per frame):
//
//   - BatchSender: non-blocking batched writes with explicit backpressure
//     (ErrWouldBlock, WaitWritable, Room), what the receive pool's delayed flush needs;
//   - VecSender: BatchSender for frames in two pieces (Vec: headers built for the
//     frame, then a payload left where it was read), sent as iovec pairs, so the
//     TAP→port pipeline copies no payload;
//   - Lender: received frames lent in place from the transport's own buffer instead of
//     copied out;
//   - ShmSender: frames sent through a shared-memory ring the receiver maps, so only a
//     descriptor crosses the socket. The ring's layout stays the transport's: the port
//     itself reports the two sizes the engine stages by (ShmMinFrame, ShmDescLen).
//
// Backend is QEMU's generic backend offload model reduced to what the engine calls:
// what a side carries (VnetHdrLen), what it may be handed (Accepts), what it may deliver
// (SetOffloads) and one line for logs (State). In QEMU these are NetClientInfo's
// has_vnet_hdr/set_offload callbacks (include/net/net.h), through which virtio-net asks
// its peer what it can take; tapgro's engine plays virtio-net's part between the TAP and
// the port. BackendOf gives every Port one, so negotiation has a single shape, and Caps
// is its summary as negotiation records it (taken from a spec, netdev.Spec.PortCaps,
// before any peer has connected).
//
// The contract is held by tests, not only stated: package port/porttest checks a
// connected pair of any transport's ports against it (Port and each optional
// capability the pair has), and every transport's own tests run it over their ports.
package port
