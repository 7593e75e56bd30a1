package netmapio

import (
	"tapgro/port"
	"tapgro/vnethdr"
)

var _ port.Backend = (*NetmapPort)(nil)

// SetOffloads: a VALE peer with the same header length may hand us what it accepts, and
// one without a header gets frames VALE segmented for it (netmap
// sys/dev/netmap/netmap_vale.c bdg_mismatch_datapath; QEMU's net/netmap.c
// netmap_set_offload likewise ignores the individual flags), so there is nothing to set;
// the result is what may arrive.
func (p *NetmapPort) SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error) {
	return p.Accepts() & o, nil
}

// State implements port.Backend.
func (p *NetmapPort) State() string { return port.Describe("netmap", p.hdrLen, p.Accepts()) }
