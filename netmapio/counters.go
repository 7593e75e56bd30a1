package netmapio

import "tapgro/port"

// Counters is the netmap port's own series for the operator surfaces (port.CounterSource):
// docs/metrics.md lists them under tapgro_netmap_*.
func (s *NetmapStats) Counters() []port.Counter {
	c := []port.Counter{
		{Name: "tapgro_netmap_slots_total", Help: "netmap ring slots used, by direction.", Labels: map[string]string{"direction": "rx"}, Value: s.RxSlots.Load},
		{Name: "tapgro_netmap_slots_total", Help: "netmap ring slots used, by direction.", Labels: map[string]string{"direction": "tx"}, Value: s.TxSlots.Load},
		{Name: "tapgro_netmap_tx_full_total", Help: "Times the netmap TX ring had no room for the next whole frame.", Value: s.TxFull.Load},
	}
	for _, r := range []struct {
		reason string
		v      func() uint64
	}{
		{"bad_slot", s.BadSlot.Load}, {"bad_chain", s.BadChain.Load}, {"short_frame", s.ShortFrame.Load},
		{"long_frame", s.LongFrame.Load}, {"tx_too_big", s.TxTooBig.Load}, {"bad_ring", s.BadRing.Load}, {"stale", s.Stale.Load},
	} {
		c = append(c, port.Counter{Name: "tapgro_netmap_errors_total", Help: "Bad input from the netmap ring and frames it could not carry, by reason.",
			Labels: map[string]string{"reason": r.reason}, Value: r.v})
	}
	return c
}
