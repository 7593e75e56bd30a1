package netmapio

import (
	"tapgro/port"
	"tapgro/vnethdr"
)

var (
	_ port.Backend = (*StreamPort)(nil)
	_ port.Backend = (*DgramPort)(nil)
	_ port.Backend = (*NetmapPort)(nil)
)

// BackendOf is port.BackendOf.
func BackendOf(p Port) port.Backend { return port.BackendOf(p) }

// ---- StreamPort ----

// SetOffloads: a QEMU-framed peer hands only plain frames (0). On a vnet-hdr=on stream
// the hello already told the peer what it may send; the result is that set, narrowed to
// o (the peer is not told again: tapgro finishes in software whatever it advertised).
func (s *StreamPort) SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error) {
	return s.emits & o, nil
}

// State implements VnetBackend.
func (s *StreamPort) State() string {
	d := port.Describe("stream", s.hdrLen, s.accepts)
	if s.shmTx != nil {
		d = d[:len(d)-1] + ", shared memory)"
	}
	return d
}

// ---- DgramPort ----

// SetOffloads: the peer hands plain frames only.
func (p *DgramPort) SetOffloads(vnethdr.Offloads) (vnethdr.Offloads, error) { return 0, nil }

// State implements VnetBackend.
func (p *DgramPort) State() string { return port.Describe("dgram", 0, 0) }

// ---- NetmapPort ----

// SetOffloads: a VALE peer with the same header length may hand us what it accepts, and
// one without a header gets frames VALE segmented for it (netmap
// sys/dev/netmap/netmap_vale.c bdg_mismatch_datapath; QEMU's net/netmap.c
// netmap_set_offload likewise ignores the individual flags), so there is nothing to set;
// the result is what may arrive.
func (p *NetmapPort) SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error) {
	return p.Accepts() & o, nil
}

// State implements VnetBackend.
func (p *NetmapPort) State() string { return port.Describe("netmap", p.hdrLen, p.Accepts()) }
