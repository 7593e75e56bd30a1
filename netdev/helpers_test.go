package netdev

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// setUmask sets the process umask and returns the old one (tests are not parallel).
func setUmask(m int) int { return unix.Umask(m) }

// prefixOnly is a bare QEMU stream length prefix.
func prefixOnly(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
