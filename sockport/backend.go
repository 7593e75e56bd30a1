package sockport

import (
	"tapgro/port"
	"tapgro/vnethdr"
)

var (
	_ port.Backend = (*StreamPort)(nil)
	_ port.Backend = (*DgramPort)(nil)
)

// ---- StreamPort ----

// SetOffloads: a QEMU-framed peer hands only plain frames (0). On a vnet-hdr=on stream
// the hello already told the peer what it may send; the result is that set, narrowed to
// o (the peer is not told again: tapgro finishes in software whatever it advertised).
func (s *StreamPort) SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error) {
	return s.emits & o, nil
}

// State implements port.Backend.
func (s *StreamPort) State() string {
	d := port.Describe("stream", s.hdrLen, s.accepts)
	if s.shm != nil {
		d = d[:len(d)-1] + ", shared memory)"
	}
	return d
}

// ---- DgramPort ----

// SetOffloads: the peer hands plain frames only.
func (p *DgramPort) SetOffloads(vnethdr.Offloads) (vnethdr.Offloads, error) { return 0, nil }

// State implements port.Backend.
func (p *DgramPort) State() string { return port.Describe("dgram", 0, 0) }
