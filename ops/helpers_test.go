package ops

import "tapgro/vnethdr"

// Shorthands for the offload bits the tests name.
const (
	oCSUM = vnethdr.OffloadCSUM
	oTSO4 = vnethdr.OffloadTSO4
	oTSO6 = vnethdr.OffloadTSO6
	oECN  = vnethdr.OffloadTSOECN
	oUSO  = vnethdr.OffloadUSO
)
