package netdev

import (
	"fmt"

	"tapgro/port"
	"tapgro/sockport"
	"tapgro/vnethdr"
)

// PortCaps is what the spec's ports will be able to do, before any peer connected: the
// engine negotiates the TAP's read offloads with it at start, and again with each
// connected port's own Backend. Only a vnet-hdr=on stream and a netmap port with a
// header carry offloads; a vnet-hdr=on stream's are what tapgro offers in its hello,
// which the peer's answer may narrow.
func (s Spec) PortCaps() port.Caps {
	kind := s.Backend.String()
	switch {
	case s.Backend == BackendStream && s.VnetHdr:
		a := sockport.VnetStreamAccepts
		return port.Caps{State: fmt.Sprintf("%s(vnet-hdr %d, accepts %s; until the peer's hello)", kind, sockport.VnetStreamHdrLen, a),
			HdrLen: sockport.VnetStreamHdrLen, Accepts: a, Emits: a}
	case s.Backend == BackendNetmap && s.HdrLen > 0:
		// What NetmapPort.Accepts reports for a VALE port with a header.
		a := vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN | vnethdr.OffloadUFO
		return port.Caps{State: fmt.Sprintf("%s(vnet-hdr %d, accepts %s)", kind, s.HdrLen, a), HdrLen: s.HdrLen, Accepts: a, Emits: a}
	}
	return port.Caps{State: kind + "(plain)"}
}
