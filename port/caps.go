package port

import "tapgro/vnethdr"

// Caps is a port's Backend reduced to what the engine's offload negotiation needs: what
// the port carries, what it may be handed and what it may hand over. The engine reads
// it from a connected port (its Backend) and, before any peer has connected, takes it
// from the endpoint's spec (netdev.Spec.PortCaps), since the TAP's read offloads are set
// before the first connection.
type Caps struct {
	State   string           // Backend.State, e.g. "stream(vnet-hdr 12, accepts csum,tso4)"
	HdrLen  int              // vnet header length of each frame; 0 = plain frames
	Accepts vnethdr.Offloads // what the port may be handed
	Emits   vnethdr.Offloads // what the port may hand us
}
