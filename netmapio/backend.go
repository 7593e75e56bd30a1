package netmapio

import (
	"fmt"

	"tapgro/vnethdr"
)

// VnetBackend is QEMU's generic backend offload model (NetClientInfo's has_vnet_hdr,
// has_vnet_hdr_len, set_vnet_hdr_len, set_offload; wire.md §5.1, sketch in §5.3) as one
// small interface that both sides of tapgro implement: the TAP (tapdev.Device), every
// Port here, and the vnet-hdr=on stream. tapgro's core plays the part virtio-net plays
// in QEMU (wire.md §5.2): it asks each side what it can carry and accept, and decides
// per direction where frames pass whole and where software must segment, checksum or
// coalesce.
//
// (The name is not Backend because that already names the -netdev family of a Spec.)
type VnetBackend interface {
	// HasVnetHdr reports whether frames can carry a virtio_net_hdr at all.
	HasVnetHdr() bool
	// HasVnetHdrLen reports whether the header length could be switched to n (0 = none);
	// it changes nothing.
	HasVnetHdrLen(n int) bool
	// VnetHdrLen is the header length every frame carries now (0 = plain frames).
	VnetHdrLen() int
	// SetVnetHdrLen switches the header length; only before frames flow.
	SetVnetHdrLen(n int) error
	// Accepts is what this side may be handed: partial checksums and which GSO kinds.
	Accepts() vnethdr.Offloads
	// SetOffloads declares what this side may deliver to tapgro (like virtio-net's
	// guest offloads, or TUNSETOFFLOAD on the TAP) and returns what it will deliver.
	SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error)
	// State describes the current setting in one short line, for logs and `tapgro ctl`.
	State() string
}

var (
	_ VnetBackend = (*StreamPort)(nil)
	_ VnetBackend = (*DgramPort)(nil)
	_ VnetBackend = (*NetmapPort)(nil)
)

// BackendOf returns p's VnetBackend, or, for a Port that does not implement one, a fixed
// description built from its VnetHdrLen and Accepts.
func BackendOf(p Port) VnetBackend {
	if b, ok := p.(VnetBackend); ok {
		return b
	}
	return fixedBackend{p}
}

type fixedBackend struct{ p Port }

func (f fixedBackend) HasVnetHdr() bool          { return f.p.VnetHdrLen() > 0 }
func (f fixedBackend) HasVnetHdrLen(n int) bool  { return n == f.p.VnetHdrLen() }
func (f fixedBackend) VnetHdrLen() int           { return f.p.VnetHdrLen() }
func (f fixedBackend) Accepts() vnethdr.Offloads { return f.p.Accepts() }
func (f fixedBackend) SetVnetHdrLen(n int) error { return setFixedLen(f.p.Peer(), f.p.VnetHdrLen(), n) }
func (f fixedBackend) SetOffloads(vnethdr.Offloads) (vnethdr.Offloads, error) {
	if f.p.VnetHdrLen() == 0 {
		return 0, nil
	}
	return f.p.Accepts(), nil
}
func (f fixedBackend) State() string {
	return describe("port", f.p.VnetHdrLen(), f.p.Accepts())
}

// setFixedLen is SetVnetHdrLen for a port whose header length cannot change.
func setFixedLen(peer string, have, want int) error {
	if want == have {
		return nil
	}
	return fmt.Errorf("netmapio: %s carries a %d-byte vnet header and cannot switch to %d", peer, have, want)
}

// describe is the State line: "stream(plain)", "stream(vnet-hdr 12, accepts csum,tso4)".
func describe(kind string, hdrLen int, accepts vnethdr.Offloads) string {
	if hdrLen == 0 {
		return kind + "(plain)"
	}
	return fmt.Sprintf("%s(vnet-hdr %d, accepts %s)", kind, hdrLen, accepts)
}

// ---- StreamPort ----

// HasVnetHdr: QEMU framing never carries a header (wire.md §3.5); vnet-hdr=on does.
func (s *StreamPort) HasVnetHdr() bool { return s.hdrLen > 0 }

// HasVnetHdrLen: the framing is fixed by the spec (and, for vnet-hdr=on, the hello).
func (s *StreamPort) HasVnetHdrLen(n int) bool { return n == s.hdrLen }

// SetVnetHdrLen succeeds only for the length the port already has.
func (s *StreamPort) SetVnetHdrLen(n int) error { return setFixedLen(s.peer, s.hdrLen, n) }

// SetOffloads: a QEMU-framed peer hands only plain frames (0). On a vnet-hdr=on stream
// the hello already told the peer what it may send; the result is that set, narrowed to
// o (the peer is not told again: tapgro finishes in software whatever it advertised).
func (s *StreamPort) SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error) {
	return s.emits & o, nil
}

// State implements VnetBackend.
func (s *StreamPort) State() string {
	d := describe("stream", s.hdrLen, s.accepts)
	if s.shmTx != nil {
		d = d[:len(d)-1] + ", shared memory)"
	}
	return d
}

// ---- DgramPort ----

// HasVnetHdr is false: QEMU's dgram backend carries plain frames (wire.md §3.5).
func (p *DgramPort) HasVnetHdr() bool { return false }

// HasVnetHdrLen only for 0.
func (p *DgramPort) HasVnetHdrLen(n int) bool { return n == 0 }

// SetVnetHdrLen only to 0.
func (p *DgramPort) SetVnetHdrLen(n int) error { return setFixedLen(p.peer, 0, n) }

// SetOffloads: the peer hands plain frames only.
func (p *DgramPort) SetOffloads(vnethdr.Offloads) (vnethdr.Offloads, error) { return 0, nil }

// State implements VnetBackend.
func (p *DgramPort) State() string { return describe("dgram", 0, 0) }

// ---- NetmapPort ----

// SetOffloads: a VALE peer with the same header length may hand us what it accepts, and
// one without a header gets frames VALE segmented for it (wire.md §4.7, §5.3), so there
// is nothing to set; the result is what may arrive.
func (p *NetmapPort) SetOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error) {
	return p.Accepts() & o, nil
}

// State implements VnetBackend.
func (p *NetmapPort) State() string { return describe("netmap", p.hdrLen, p.Accepts()) }
