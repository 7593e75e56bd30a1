package datapath

import (
	"errors"
	"fmt"

	"tapgro/port"
	"tapgro/vnethdr"
)

// Runtime offload control: the hooks the control socket (`tapgro ctl`) drives, and the
// renegotiation the supervisor runs on every (re)connect. None of them touches the
// packet path directly: they change atomics and the TAP's TUNSETOFFLOAD mask, and the
// port→TAP goroutine picks the GRO settings up between two read batches (SetConfig
// flushes what the engine holds first), so no frame is lost and the port connection
// stays up.

// offloadTap is what renegotiation needs of the TAP (*tapdev.Device).
type offloadTap interface {
	SetOffloads(vnethdr.Offloads) (vnethdr.Offloads, error)
}

// errNoTapControl is returned when the TAP cannot change its offloads (in-memory TAPs
// in tests).
var errNoTapControl = errors.New("the TAP does not support changing offloads")

// initNegotiation records the start-up negotiation's inputs and result (New has set
// the TAP's mask already) and the callback that logs each later one.
func (b *bridge) initNegotiation(in negInput, n Negotiation, onNegotiated func(*Negotiation)) {
	b.negMu.Lock()
	defer b.negMu.Unlock()
	if b.groKilled.Load() && in.GRO {
		// The start-up GSO probe failed after n was computed.
		in.GRO = false
		set := n.TapOffloads
		n = negotiate(in)
		n.TapOffloads = set
	}
	b.negIn = in
	b.onNegotiated = onNegotiated
	b.neg.Store(&n)
	if onNegotiated != nil {
		onNegotiated(&n)
	}
}

// renegotiate applies mod to the inputs, negotiates, sets the TAP's read offloads when
// they changed, and publishes the result. On a TUNSETOFFLOAD failure the previous mask
// stays in force and is what the published result reports.
func (b *bridge) renegotiate(mod func(*negInput)) (*Negotiation, error) {
	b.negMu.Lock()
	defer b.negMu.Unlock()
	in := b.negIn
	if mod != nil {
		mod(&in)
	}
	in.TapWrite = b.tapWrite()
	in.GRO = b.groOn.Load() && !b.groKilled.Load()
	in.UDPGRO = b.udpGROOn.Load()
	n := negotiate(in)
	var err error
	prev := b.neg.Load()
	if prev == nil || prev.TapOffloads != n.TapOffloads {
		t, ok := b.tap.(offloadTap)
		switch {
		case !ok:
			err = errNoTapControl
		default:
			var set vnethdr.Offloads
			set, err = t.SetOffloads(n.TapOffloads)
			n.TapOffloads = set
		}
		if err != nil && prev != nil {
			n.TapOffloads = prev.TapOffloads
		}
	}
	b.negIn = in
	b.neg.Store(&n)
	if b.onNegotiated != nil {
		b.onNegotiated(&n)
	}
	return &n, err
}

// portConnected renegotiates for a peer that has just connected: its capabilities may
// differ from the previous peer's (a vnet-hdr=on tapgro after a plain one, another
// header length on a VALE port).
func (b *bridge) portConnected(p port.Port) (*Negotiation, error) {
	c := capsOf(p)
	return b.renegotiate(func(in *negInput) { in.Port = c })
}

// Negotiation is the last negotiation's result (nil before the first).
func (b *bridge) Negotiation() *Negotiation { return b.neg.Load() }

// SetGRO switches TCP coalescing (port→TAP) on or off at run time. A kernel that
// refused GSO keeps it off whatever is asked.
func (b *bridge) SetGRO(on bool) *Negotiation {
	b.groOn.Store(on)
	b.reconf.Add(1)
	n, _ := b.renegotiate(nil)
	return n
}

// SetUDPGRO switches UDP coalescing (port→TAP) on or off at run time; it also needs GRO
// on and a TAP that takes USO.
func (b *bridge) SetUDPGRO(on bool) *Negotiation {
	b.udpGROOn.Store(on)
	b.reconf.Add(1)
	n, _ := b.renegotiate(nil)
	return n
}

// SetTapOffloads replaces the --offload choice with an explicit set (0 = off) and
// renegotiates: the TAP's read offloads become o within what the kernel and the
// negotiation rules allow (e.g. no TSO_ECN for a port taking TSO but not ECN). It
// returns the mask now set. Frames the TAP queued under the old mask are still handled
// right: the TAP→port pipeline decides per frame.
func (b *bridge) SetTapOffloads(o vnethdr.Offloads) (vnethdr.Offloads, error) {
	if o != 0 && o&vnethdr.OffloadCSUM == 0 {
		return 0, fmt.Errorf("offloads %s: %w", o, vnethdr.ErrNeedsCsum)
	}
	return b.SetTapOffloadChoice(vnethdr.Choice{Set: o})
}

// SetTapOffloadChoice is SetTapOffloads for any --offload value, auto included.
func (b *bridge) SetTapOffloadChoice(c vnethdr.Choice) (vnethdr.Offloads, error) {
	n, err := b.renegotiate(func(in *negInput) { in.Choice = c })
	return n.TapOffloads, err
}
