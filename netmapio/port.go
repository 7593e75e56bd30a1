package netmapio

import "tapgro/port"

// The port contract lives in package port; these names keep netmapio's own code short
// while the transports are split out of this package.
type (
	Port        = port.Port
	BatchSender = port.BatchSender
	ShmSender   = port.ShmSender
	Lender      = port.Lender
	VnetBackend = port.Backend
)

const (
	MaxFrame = port.MaxFrame
	MinFrame = port.MinFrame
)

var (
	ErrClosed     = port.ErrClosed
	ErrWouldBlock = port.ErrWouldBlock
)
