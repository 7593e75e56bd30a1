//go:build linux

package netmapio

import (
	"testing"
	"unsafe"
)

// TestNetmapABI pins the request structs and ioctl numbers to netmap sys/net/netmap.h as
// laid out on x86_64.
func TestNetmapABI(t *testing.T) {
	var h nmreqHeader
	var r nmreqRegister
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof nmreq_header", unsafe.Sizeof(h), 88},
		{"nr_reqtype", unsafe.Offsetof(h.ReqType), 2},
		{"nr_name", unsafe.Offsetof(h.Name), 8},
		{"nr_options", unsafe.Offsetof(h.Options), 72},
		{"nr_body", unsafe.Offsetof(h.Body), 80},
		{"sizeof nmreq_register", unsafe.Sizeof(r), 56},
		{"nr_memsize", unsafe.Offsetof(r.MemSize), 8},
		{"nr_tx_slots", unsafe.Offsetof(r.TxSlots), 16},
		{"nr_rx_slots", unsafe.Offsetof(r.RxSlots), 20},
		{"nr_tx_rings", unsafe.Offsetof(r.TxRings), 24},
		{"nr_host_rx_rings", unsafe.Offsetof(r.HostRxRings), 30},
		{"nr_mem_id", unsafe.Offsetof(r.MemID), 32},
		{"nr_ringid", unsafe.Offsetof(r.RingID), 34},
		{"nr_mode", unsafe.Offsetof(r.Mode), 36},
		{"nr_extra_bufs", unsafe.Offsetof(r.ExtraBufs), 40},
		{"nr_flags", unsafe.Offsetof(r.Flags), 48},
		{"sizeof nmreq_port_hdr", unsafe.Sizeof(nmreqPortHdr{}), 8},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	ioc := func(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | 'i'<<8 | nr }
	if want := ioc(3, 151, unsafe.Sizeof(h)); nmIoctlCtrl != want {
		t.Errorf("NIOCCTRL %#x, want %#x", nmIoctlCtrl, want)
	}
	if nmIoctlTxSync != ioc(0, 148, 0) || nmIoctlRxSync != ioc(0, 149, 0) {
		t.Errorf("NIOCTXSYNC %#x NIOCRXSYNC %#x", nmIoctlTxSync, nmIoctlRxSync)
	}
}
