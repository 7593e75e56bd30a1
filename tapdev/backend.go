package tapdev

import (
	"fmt"

	"tapgro/vnethdr"
)

// The methods below make a Device a netmapio.VnetBackend (QEMU's backend offload model,
// wire.md §5.3, TAP column): the TAP always carries a header (it is opened with
// IFF_VNET_HDR), its read offloads are TUNSETOFFLOAD, and on write it accepts partial
// checksums and GSO whatever TUNSETOFFLOAD says (wire.md §1.4).

// HasVnetHdr is true: every Device is opened with IFF_VNET_HDR.
func (d *Device) HasVnetHdr() bool { return true }

// HasVnetHdrLen reports whether this package can run the TAP with an n-byte header: 10
// or 12 (the kernel takes any n ≥ 10, wire.md §1.5, but the datapath knows these two).
func (d *Device) HasVnetHdrLen(n int) bool { return n == vnethdr.Len || n == vnethdr.LenMrgRxbuf }

// Accepts is what the TAP may be handed on write: partial checksums and TCP GSO always
// (the kernel validates, never consults TUNSETOFFLOAD, wire.md §1.4/§1.6), UDP_L4 GSO
// only on kernels that know it, which a successful USO probe shows (6.2+).
func (d *Device) Accepts() vnethdr.Offloads {
	return vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN |
		d.ProbeOffloads()&vnethdr.OffloadUSO
}

// State is "tap(vnet-hdr 10, offloads csum,tso4,tso6)": the header length and the read
// offloads set now.
func (d *Device) State() string {
	return fmt.Sprintf("tap(vnet-hdr %d, offloads %s)", d.VnetHdrLen(), d.Offloads())
}
