package netdev

import (
	"context"
	"fmt"
	"io/fs"
	"net"

	"tapgro/port"
	"tapgro/sockport"
)

// datagram is the bound role (socket udp=, dgram): Open binds, Next returns that socket
// at once, and after it is closed binds a fresh one at the same address.
type datagram struct {
	*core
	gate   gate
	first  *sockport.DgramPort // under core.mu: bound by Open, not yet handed out
	remote net.Addr            // resolved by the first bind; only Next's goroutine uses it
}

func openDatagram(c *core) (*datagram, error) {
	d := &datagram{core: c, gate: newGate()}
	p, err := d.bind()
	if err != nil {
		return nil, err
	}
	d.first = p
	return d, nil
}

func (d *datagram) Close() error {
	d.shutdown(func() {
		d.mu.Lock()
		first := d.first
		d.first = nil
		d.mu.Unlock()
		if first != nil {
			first.Close()
		}
	})
	return nil
}

// bind binds the local address and returns a fresh port. The first call resolves the
// remote and pins a port-0 local address to the port the kernel chose, so a rebind after
// Close keeps the address QEMU was told about.
func (d *datagram) bind() (*sockport.DgramPort, error) {
	d.mu.Lock()
	l, r := d.spec.Local, d.spec.Remote
	d.mu.Unlock()
	var c net.Conn
	var fi fs.FileInfo
	if l.Type == AddrUnix {
		if d.remote == nil {
			d.remote = &net.UnixAddr{Net: "unixgram", Name: r.Path}
		}
		uc, info, err := bindUnixgram(l.Path, d.opt)
		if err != nil {
			return nil, err
		}
		c, fi = uc, info
	} else {
		if d.remote == nil {
			ra, err := net.ResolveUDPAddr("udp", r.dialAddr())
			if err != nil {
				return nil, fmt.Errorf("netdev: remote %s: %w", r, err)
			}
			d.remote = ra
		}
		// Bind the remote's family, so the sockaddr in every sendmmsg matches the socket.
		network := "udp6"
		if d.remote.(*net.UDPAddr).IP.To4() != nil {
			network = "udp4"
		}
		la, err := net.ResolveUDPAddr(network, l.dialAddr())
		if err != nil {
			return nil, fmt.Errorf("netdev: local %s: %w", l, err)
		}
		uc, err := net.ListenUDP(network, la)
		if err != nil {
			return nil, fmt.Errorf("netdev: %w", err)
		}
		l.Port = uint16(uc.LocalAddr().(*net.UDPAddr).Port)
		c = uc
	}
	p, err := sockport.NewDgramPort(c, d.remote, &d.stats)
	if err != nil {
		c.Close()
		if fi != nil {
			removeOurs(l.Path, fi)
		}
		return nil, err
	}
	if fi != nil {
		p.SetCleanup(func() { removeOurs(l.Path, fi) })
	}
	d.mu.Lock()
	d.spec.Local = l
	d.addr = l.String()
	if fi != nil {
		d.path, d.pathFI = l.Path, fi
	}
	d.mu.Unlock()
	return p, nil
}

func (d *datagram) Next(ctx context.Context) (port.Port, error) {
	if err := d.gate.acquire(ctx, d.ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	p := d.first
	d.first = nil
	d.mu.Unlock()
	if p == nil {
		var err error
		if p, err = d.bind(); err != nil {
			d.gate.release()
			return nil, err
		}
	}
	return d.adopt(p, &p.Base, d.gate.release)
}
