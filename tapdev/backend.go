package tapdev

import (
	"fmt"

	"tapgro/vnethdr"
)

// The methods below make a Device a port.Backend (QEMU's backend offload model, the
// NetClientInfo callbacks of include/net/net.h, as net/tap.c implements them for a TAP):
// the TAP always carries a header (it is opened with IFF_VNET_HDR), its read offloads
// are TUNSETOFFLOAD, and on write it accepts partial checksums and GSO whatever
// TUNSETOFFLOAD says (drivers/net/tun.c tun_get_user hands the header to
// virtio_net_hdr_to_skb, which never consults the offload mask).

// HasVnetHdrLen reports whether this package can run the TAP with an n-byte header: 10
// or 12 (TUNSETVNETHDRSZ takes any n ≥ 10, drivers/net/tun.c __tun_chr_ioctl, but the
// datapath knows these two).
func (d *Device) HasVnetHdrLen(n int) bool { return n == vnethdr.Len || n == vnethdr.LenMrgRxbuf }

// Accepts is what the TAP may be handed on write: partial checksums and TCP GSO always
// (virtio_net_hdr_to_skb validates them and never consults TUNSETOFFLOAD), UDP_L4 GSO
// only on kernels that know VIRTIO_NET_HDR_GSO_UDP_L4, which a successful USO probe
// shows (Linux 6.2+).
func (d *Device) Accepts() vnethdr.Offloads {
	return vnethdr.OffloadCSUM | vnethdr.OffloadTSO4 | vnethdr.OffloadTSO6 | vnethdr.OffloadTSOECN |
		d.ProbeOffloads()&vnethdr.OffloadUSO
}

// State is "tap(vnet-hdr 10, offloads csum,tso4,tso6)": the header length and the read
// offloads set now.
func (d *Device) State() string {
	return fmt.Sprintf("tap(vnet-hdr %d, offloads %s)", d.VnetHdrLen(), d.Offloads())
}
