//go:build !linux

package tapdev

import (
	"net"
	"net/netip"
	"time"

	"tapgro/vnethdr"
)

// MTU limits of a Linux tun/tap netdev, kept so callers validate the same way everywhere.
const (
	MinMTU = 68
	MaxMTU = 65521
)

// Device is a TAP queue; on this platform it cannot be opened.
type Device struct{}

// Open returns ErrUnsupported: TAP with IFF_VNET_HDR is Linux-only.
func Open(cfg Config) (*Device, error) { return nil, ErrUnsupported }

// Name returns "".
func (d *Device) Name() string { return "" }

// VnetHdrLen returns 0.
func (d *Device) VnetHdrLen() int { return 0 }

// Stats returns zero counters.
func (d *Device) Stats() *Stats { return new(Stats) }

// ProbeOffloads returns no offloads.
func (d *Device) ProbeOffloads() vnethdr.Offloads { return 0 }

// SetOffloads returns ErrUnsupported.
func (d *Device) SetOffloads(want vnethdr.Offloads) (vnethdr.Offloads, error) {
	return 0, ErrUnsupported
}

// Offloads returns no offloads.
func (d *Device) Offloads() vnethdr.Offloads { return 0 }

// ReadBatch returns ErrUnsupported.
func (d *Device) ReadBatch(bufs [][]byte, sizes []int, offset int) (int, error) {
	return 0, ErrUnsupported
}

// Write returns ErrUnsupported.
func (d *Device) Write(pkt []byte) (int, error) { return 0, ErrUnsupported }

// SetReadDeadline returns ErrUnsupported.
func (d *Device) SetReadDeadline(t time.Time) error { return ErrUnsupported }

// ConfigureLink returns ErrUnsupported.
func (d *Device) ConfigureLink(lc LinkConfig) error { return ErrUnsupported }

// LinkInfo returns ErrUnsupported.
func (d *Device) LinkInfo() (net.HardwareAddr, []netip.Prefix, error) {
	return nil, nil, ErrUnsupported
}

// Close returns ErrUnsupported.
func (d *Device) Close() error { return ErrUnsupported }

// SetVnetHdrLen returns ErrUnsupported.
func (d *Device) SetVnetHdrLen(n int) error { return ErrUnsupported }

// Adopt returns ErrUnsupported.
func Adopt(fd, vnetHdrLen int) (*Device, error) { return nil, ErrUnsupported }

// NameOf returns ErrUnsupported.
func NameOf(fd int) (string, error) { return "", ErrUnsupported }
