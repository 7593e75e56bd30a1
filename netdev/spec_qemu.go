package netdev

import (
	"net/netip"
	"strconv"
	"strings"

	"tapgro/netmapio"
)

// The QEMU side of a Spec: what to give QEMU so that it meets tapgro, for the hint
// tapgro logs at start-up and for the integration tests that start a QEMU. Each is the
// spec's mirror image (tapgro server means QEMU client).

// QEMUOptionFor is QEMUOption for QEMU release v: a stream client (tapgro the server)
// also gets the option that makes QEMU connect again when tapgro restarts
// (v.StreamReconnect, from 8.0), so that either side may restart.
func (s Spec) QEMUOptionFor(id string, v QEMUVersion) string {
	o := s.QEMUOption(id)
	if r := v.StreamReconnect(); o != "" && r != "" && s.Backend == BackendStream && s.Role == RoleServer && !s.VnetHdr {
		o += "," + r
	}
	return o
}

// QEMUOption is the -netdev value to give QEMU so it meets this spec: the mirror image
// (tapgro server means QEMU client, datagram local and remote swap). A wildcard listening
// host becomes loopback, since QEMU must dial a concrete address. vnet-hdr has no QEMU
// counterpart and is left out. For netmap it is QEMU's own port on the same VALE switch
// (named after id), or the other end of a pipe; a NIC has no counterpart (""). vhost-user
// needs a -chardev as well: QEMUVhostUser.
func (s Spec) QEMUOption(id string) string {
	if s.Backend == BackendVhostUser {
		return ""
	}
	if s.Backend == BackendNetmap {
		ifn := netmapio.QEMUIfname(s.IfName, id)
		if ifn == "" {
			return ""
		}
		return "netmap,id=" + esc(id) + ",ifname=" + esc(ifn)
	}
	if s.Local.Type == AddrFD || s.Remote.Type == AddrFD {
		// Only the endpoint knows what an inherited socket is bound to (SpecOf).
		return ""
	}
	m := s
	switch s.Role {
	case RoleServer:
		m.Role, m.Local, m.Remote = RoleClient, Addr{}, dialable(s.Local)
	case RoleClient:
		m.Role, m.Local, m.Remote = RoleServer, s.Remote, Addr{}
	case RoleDatagram:
		m.Local, m.Remote = s.Remote, dialable(s.Local)
	}
	m.VnetHdr, m.NoShm = false, false
	c := m.String()
	// Insert id= right after the backend name, where QEMU's documentation puts it.
	name, rest, _ := strings.Cut(c, ",")
	return name + ",id=" + esc(id) + "," + rest
}

// QEMUVhostUser is the -chardev and -netdev values QEMU release v needs to meet a
// vhost-user spec: a socket chardev chardevID, and the netdev netdevID on it. With
// server=on the chardev connects to tapgro's path and reconnects every second if tapgro
// restarts (v.ChardevReconnect: reconnect=1, or reconnect-ms=1000 from 9.2). With server=off it listens on the path (server=on) and wait=off keeps
// the chardev itself from blocking QEMU's start; -netdev vhost-user still waits there
// until a back-end has connected (net/vhost-user.c net_vhost_user_init loops on
// qemu_chr_fe_wait_connected until the first vhost_user_start), and after tapgro goes
// away QEMU accepts the next connection (chardev/char-socket.c
// tcp_chr_disconnect_locked re-arms the listener). With more than one queue pair the
// netdev says queues=N, which QEMU checks against GET_QUEUE_NUM (net/vhost-user.c
// vhost_user_start); the NIC needs mq=on as well (QEMUVhostUserDevice). Both are "" for
// other backends.
func (s Spec) QEMUVhostUser(netdevID, chardevID string, v QEMUVersion) (chardev, netdev string) {
	if s.Backend != BackendVhostUser {
		return "", ""
	}
	nd := "vhost-user,id=" + esc(netdevID) + ",chardev=" + esc(chardevID)
	if s.Queues > 1 {
		nd += ",queues=" + strconv.Itoa(s.Queues)
	}
	if s.Role == RoleClient {
		return "socket,id=" + esc(chardevID) + ",path=" + esc(s.Remote.Path) + ",server=on,wait=off", nd
	}
	return "socket,id=" + esc(chardevID) + ",path=" + esc(s.Local.Path) + "," + v.ChardevReconnect(), nd
}

// QEMUVhostUserDevice is the -device value for the NIC on netdev netdevID: a
// virtio-net-pci, with mq=on when the spec has more than one queue pair (without it
// QEMU's virtio-net offers the guest no VIRTIO_NET_F_MQ and uses pair 0 only,
// hw/net/virtio-net.c virtio_net_device_realize). "" for other backends.
func (s Spec) QEMUVhostUserDevice(netdevID string) string {
	if s.Backend != BackendVhostUser {
		return ""
	}
	d := "virtio-net-pci,netdev=" + esc(netdevID)
	if s.Queues > 1 {
		d += ",mq=on"
	}
	return d
}

// dialable turns a wildcard bind address into the loopback address of the same family.
func dialable(a Addr) Addr {
	if a.Type != AddrInet {
		return a
	}
	if ip, err := netip.ParseAddr(a.Host); err == nil && ip.IsUnspecified() {
		if ip.Is4() {
			a.Host = "127.0.0.1"
		} else {
			a.Host = "::1"
		}
	}
	return a
}
