//go:build !linux

package tapdev

// OpenQueues returns ErrUnsupported.
func OpenQueues(cfg Config, n int) ([]*Device, error) { return nil, ErrUnsupported }

// SetQueueEnabled returns ErrUnsupported.
func (d *Device) SetQueueEnabled(on bool) error { return ErrUnsupported }
