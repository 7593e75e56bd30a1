package netmapio

import (
	"fmt"
	"strings"
)

// netmap register modes (nmreq_register.nr_mode, NR_REG_* in netmap sys/net/netmap.h).
const (
	nrRegAllNIC = 1 // every NIC ring (a VALE port's or pipe's own rings)
	nrRegSW     = 2 // the host stack rings ("^")
	nrRegNICSW  = 3 // both ("*")
)

// Name is an ifname= value decoded the way libnetmap decodes a port spec (netmap
// libnetmap/nmreq.c nmreq_header_decode):
// "netmap:" is dropped, "valeX:Y" is kept whole, a trailing "^" or "*" picks the host
// rings or all rings. One-ring suffixes ("-NN") are not supported: Linux interface names
// may themselves contain "-NN".
type Name struct {
	kernel string // nmreq_header.nr_name
	mode   uint32
	vale   bool
	bridge string // VALE switch ("vale0") when vale
	port   string // VALE port ("1") when vale
}

// VALE reports whether the name is a VALE switch port, the only kind that can carry a
// virtio-net header (NETMAP_REQ_PORT_HDR_SET, netmap sys/dev/netmap/netmap.c).
func (n Name) VALE() bool { return n.vale }

// nmNameMax: nr_name is 64 bytes including the terminating NUL.
const nmNameMax = 63

// ParseName checks and decodes an ifname= value; the spec parser calls it so a bad name
// fails at start-up, Open to find the kernel name and register mode.
func ParseName(s string) (Name, error) {
	if s == "" {
		return Name{}, fmt.Errorf("netdev: netmap needs key \"ifname\"")
	}
	if strings.HasPrefix(s, "vale") {
		b, p, ok := strings.Cut(s, ":")
		switch {
		case !ok || p == "":
			return Name{}, fmt.Errorf("netdev: bad value %q for key \"ifname\": a VALE port is valeSWITCH:PORT", s)
		case !isIdent(b) || len(b) > 15:
			return Name{}, fmt.Errorf("netdev: bad value %q for key \"ifname\": the switch name %q must be at most 15 letters, digits or '_'", s, b)
		case !isIdent(p) || len(p) > 15:
			return Name{}, fmt.Errorf("netdev: bad value %q for key \"ifname\": the port name %q must be at most 15 letters, digits or '_'", s, p)
		}
		return Name{kernel: s, mode: nrRegAllNIC, vale: true, bridge: b, port: p}, nil
	}
	k := strings.TrimPrefix(s, "netmap:")
	mode := uint32(nrRegAllNIC)
	switch {
	case strings.HasSuffix(k, "^"):
		k, mode = k[:len(k)-1], nrRegSW
	case strings.HasSuffix(k, "*"):
		k, mode = k[:len(k)-1], nrRegNICSW
	}
	if k == "" || len(k) > nmNameMax || strings.ContainsAny(k, " \t/,:@^*\x00") {
		return Name{}, fmt.Errorf("netdev: bad value %q for key \"ifname\": want netmap:IFNAME[^|*], valeX:Y or a pipe netmap:NAME{N / NAME}N", s)
	}
	return Name{kernel: k, mode: mode}, nil
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// QEMUIfname is the ifname QEMU should open to meet this port: another port on the
// same VALE switch (named after the netdev id when that is a valid port name), or the
// other end of a pipe. A NIC has no counterpart: QEMU cannot share it ("").
func QEMUIfname(ifname, id string) string {
	n, err := ParseName(ifname)
	if err != nil {
		return ""
	}
	if n.vale {
		p := id
		if !isIdent(p) || len(p) > 15 {
			p = "qemu"
		}
		if p == n.port {
			p += "_q"
		}
		return n.bridge + ":" + p
	}
	if i := strings.IndexAny(n.kernel, "{}"); i >= 0 && n.mode == nrRegAllNIC {
		other := byte('}')
		if n.kernel[i] == '}' {
			other = '{'
		}
		return "netmap:" + n.kernel[:i] + string(other) + n.kernel[i+1:]
	}
	return ""
}

// DevicePath is netmap's control device; it exists only while the module is loaded.
const DevicePath = "/dev/netmap"
