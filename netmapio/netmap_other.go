//go:build !linux

package netmapio

import "errors"

// ErrNoNetmap is returned on every system but Linux: tapgro speaks netmap's Linux ABI only.
var ErrNoNetmap = errors.New("netmapio: netmap ports are supported on Linux only")

func openNetmap(Spec, *Stats, *NetmapStats) (*NetmapPort, error) { return nil, ErrNoNetmap }
