package datapath

import (
	"testing"

	"tapgro/port"
	"tapgro/sockport"
	"tapgro/vnethdr"
)

const (
	oCSUM = vnethdr.OffloadCSUM
	oTSO4 = vnethdr.OffloadTSO4
	oTSO6 = vnethdr.OffloadTSO6
	oECN  = vnethdr.OffloadTSOECN
	oUFO  = vnethdr.OffloadUFO
	oUSO  = vnethdr.OffloadUSO
)

// The negotiation table: (TAP probed set, --offload choice) × (port capabilities) ×
// (GRO switches) → (TUNSETOFFLOAD mask, steps per direction). Each row is one mismatch
// (or match) the datapath must handle.
func TestNegotiate(t *testing.T) {
	probedAll := oCSUM | oTSO4 | oTSO6 | oECN | oUFO | oUSO // 6.2+
	probed61 := oCSUM | oTSO4 | oTSO6 | oECN | oUFO         // 6.1: no USO
	write := oCSUM | oTSO4 | oTSO6 | oECN | oUSO
	write61 := oCSUM | oTSO4 | oTSO6 | oECN
	auto := vnethdr.Choice{Auto: true}

	plain := port.Caps{State: "stream(plain)"}
	vnet := port.Caps{State: "stream(vnet)", HdrLen: 12, Accepts: sockport.VnetStreamAccepts, Emits: sockport.VnetStreamAccepts}
	vnetCsum := port.Caps{State: "stream(vnet)", HdrLen: 12, Accepts: oCSUM, Emits: sockport.VnetStreamAccepts}
	vale10 := port.Caps{State: "netmap", HdrLen: 10, Accepts: oCSUM | oTSO4 | oTSO6 | oECN | oUFO, Emits: oCSUM | oTSO4 | oTSO6 | oECN | oUFO}
	noECN := port.Caps{State: "noecn", HdrLen: 10, Accepts: oCSUM | oTSO4 | oTSO6, Emits: oCSUM | oTSO4 | oTSO6}

	cases := []struct {
		name     string
		probed   vnethdr.Offloads
		write    vnethdr.Offloads
		tapHdr   int
		choice   vnethdr.Choice
		port     port.Caps
		gro, udp bool
		tap      vnethdr.Offloads
		t2p, p2t string
	}{
		{"plain port: split and checksum what the TAP emits, coalesce", probedAll, write, 10, auto, plain, true, true,
			oCSUM | oTSO4 | oTSO6 | oECN | oUSO, "split+csum", "gro+udp_gro"},
		{"plain port, GRO off", probedAll, write, 10, auto, plain, false, true,
			oCSUM | oTSO4 | oTSO6 | oECN | oUSO, "split+csum", "plain"},
		{"plain port, 6.1 kernel: no USO read, no UDP GRO", probed61, write61, 10, auto, plain, true, true,
			oCSUM | oTSO4 | oTSO6 | oECN, "split+csum", "gro"},
		{"plain port, offload off", probedAll, write, 10, vnethdr.Choice{}, plain, true, true,
			0, "plain", "gro+udp_gro"},
		{"plain port, csum only", probedAll, write, 10, vnethdr.Choice{Set: oCSUM}, plain, true, false,
			oCSUM, "csum", "gro"},
		{"plain port, TAP without offloads at all", 0, write61, 10, auto, plain, true, true,
			0, "plain", "gro"},
		{"explicit list beyond the kernel", oCSUM, write61, 10, vnethdr.Choice{Set: oCSUM | oTSO4 | oUSO}, plain, true, true,
			oCSUM, "csum", "gro"},
		{"vnet peer, same header: everything passes", probedAll, write, 12, auto, vnet, true, true,
			oCSUM | oTSO4 | oTSO6 | oECN | oUSO, "passthrough", "passthrough+gro+udp_gro"},
		{"vnet peer, TAP header 10: convert", probedAll, write, 10, auto, vnet, true, true,
			oCSUM | oTSO4 | oTSO6 | oECN | oUSO, "passthrough+hdr_convert", "passthrough+hdr_convert+gro+udp_gro"},
		{"vnet peer, 6.1 kernel: its USO frames are split before the TAP", probed61, write61, 12, auto, vnet, true, true,
			oCSUM | oTSO4 | oTSO6 | oECN, "passthrough", "passthrough+split+gro"},
		{"vnet peer, offload off: TAP frames plain, peer's GSO still passes", probedAll, write, 12, vnethdr.Choice{}, vnet, false, false,
			0, "plain", "passthrough"},
		{"vnet peer accepting csum only: GSO split, partial checksums pass", probedAll, write, 12, auto, vnetCsum, true, true,
			oCSUM | oTSO4 | oTSO6 | oECN | oUSO, "passthrough+split", "passthrough+gro+udp_gro"},
		{"VALE with header 10: no USO there, UFO from it is split", probedAll, write, 10, auto, vale10, true, true,
			oCSUM | oTSO4 | oTSO6 | oECN | oUSO, "passthrough+split", "passthrough+split+gro+udp_gro"},
		{"port with TSO but no ECN: no TSO_ECN on the TAP", probedAll, write, 10, auto, noECN, true, true,
			oCSUM | oTSO4 | oTSO6 | oUSO, "passthrough+split", "passthrough+gro+udp_gro"},
		{"port with TSO but no ECN, explicit ecn dropped", probed61, write61, 10, vnethdr.Choice{Set: oCSUM | oTSO4 | oECN}, noECN, true, true,
			oCSUM | oTSO4, "passthrough", "passthrough+gro"},
		{"ECN without TSO is dropped", probedAll, write, 10, vnethdr.Choice{Set: oCSUM | oECN}, plain, true, true,
			oCSUM, "csum", "gro+udp_gro"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := negotiate(negInput{TapProbed: c.probed, TapHdrLen: c.tapHdr, TapWrite: c.write, Choice: c.choice,
				Port: c.port, GRO: c.gro, UDPGRO: c.udp})
			if n.TapOffloads != c.tap {
				t.Errorf("TAP offloads %s, want %s", n.TapOffloads, c.tap)
			}
			if n.T2P.String() != c.t2p {
				t.Errorf("tap->port %s, want %s", n.T2P, c.t2p)
			}
			if n.P2T.String() != c.p2t {
				t.Errorf("port->tap %s, want %s", n.P2T, c.p2t)
			}
			// Whatever was decided, the kernel must accept the mask (drivers/net/tun.c set_offload).
			if n.TapOffloads != n.TapOffloads.Normalize() || n.TapOffloads&^c.probed != 0 || n.TapOffloads&oUFO != 0 {
				t.Errorf("TAP mask %s is not one the kernel accepts (probed %s)", n.TapOffloads, c.probed)
			}
		})
	}
}

func TestNegotiationString(t *testing.T) {
	n := negotiate(negInput{TapProbed: oCSUM | oTSO4 | oTSO6, TapHdrLen: 12, TapWrite: oCSUM | oTSO4 | oTSO6 | oECN,
		Choice: vnethdr.Choice{Auto: true}, GRO: true,
		Port: port.Caps{State: "stream(vnet-hdr 12, accepts csum,tso4,tso6)", HdrLen: 12, Accepts: oCSUM | oTSO4 | oTSO6, Emits: oCSUM | oTSO4 | oTSO6}})
	want := "tap offloads=csum,tso4,tso6 port=stream(vnet-hdr 12, accepts csum,tso4,tso6) tap->port=passthrough port->tap=passthrough+gro"
	if got := n.String(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}
