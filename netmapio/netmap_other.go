//go:build !linux

package netmapio

import (
	"errors"

	"tapgro/port"
)

// ErrNoNetmap is returned on every system but Linux: tapgro speaks netmap's Linux ABI only.
var ErrNoNetmap = errors.New("netmapio: netmap ports are supported on Linux only")

// Open fails with ErrNoNetmap.
func Open(string, int, *port.Stats, *NetmapStats) (*NetmapPort, error) { return nil, ErrNoNetmap }
