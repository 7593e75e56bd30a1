package netdev

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"tapgro/onoff"
	"tapgro/sockport"
)

// Backend names the QEMU netdev family a Spec mirrors.
type Backend uint8

const (
	BackendStream Backend = iota + 1 // -netdev stream (QEMU >= 7.2, net/stream.c)
	BackendSocket                    // -netdev socket (legacy, IPv4 only, net/socket.c)
	BackendDgram                     // -netdev dgram (QEMU >= 7.2, net/dgram.c)
	BackendNetmap                    // -netdev netmap (QEMU built with CONFIG_NETMAP, net/netmap.c)
	// BackendVhostUser is -netdev vhost-user (net/vhost-user.c): tapgro is the vhost-user
	// back-end on a UNIX socket, either listening (server=on, Local) with QEMU connecting
	// (-chardev socket,reconnect=1), or dialling (server=off, Remote) a QEMU that listens
	// (-chardev socket,server=on,wait=off). It is no Endpoint (Open refuses it): package
	// vhostnet serves it, moving frames between the TAP and guest memory without the GRO
	// engine.
	BackendVhostUser
)

func (b Backend) String() string {
	switch b {
	case BackendStream:
		return "stream"
	case BackendSocket:
		return "socket"
	case BackendDgram:
		return "dgram"
	case BackendNetmap:
		return "netmap"
	case BackendVhostUser:
		return "vhost-user"
	}
	return "Backend(" + strconv.Itoa(int(b)) + ")"
}

// Role is the part tapgro plays on the link.
type Role uint8

const (
	RoleServer   Role = iota + 1 // listen on Local, serve one client at a time
	RoleClient                   // dial Remote, retrying with backoff
	RoleDatagram                 // bind Local, send to Remote, receive from anyone
	RoleAttach                   // netmap: register the port IfName; no connection to make
)

func (r Role) String() string {
	switch r {
	case RoleServer:
		return "server"
	case RoleClient:
		return "client"
	case RoleDatagram:
		return "datagram"
	case RoleAttach:
		return "attach"
	}
	return "Role(" + strconv.Itoa(int(r)) + ")"
}

// Address types, spelled as QEMU spells addr.type / local.type.
const (
	AddrInet = "inet"
	AddrUnix = "unix"
	// AddrFD is a socket a supervisor passed in (QEMU's addr.type=fd, addr.str=N): a
	// listening socket for a server, a connected one for a client (inherit.go).
	AddrFD = "fd"
)

// Addr is one socket address: Type AddrInet uses Host and Port, AddrUnix uses Path,
// AddrFD uses FD.
type Addr struct {
	Type string
	Host string
	Port uint16
	Path string
	FD   int
}

// String is "unix:PATH" or "HOST:PORT" (brackets around IPv6 literals).
func (a Addr) String() string {
	if a.Type == AddrUnix {
		return "unix:" + a.Path
	}
	if a.Type == AddrFD {
		return "fd:" + strconv.Itoa(a.FD)
	}
	return net.JoinHostPort(a.Host, strconv.Itoa(int(a.Port)))
}

// network is the Go network name to listen or dial on.
func (a Addr) network() string {
	if a.Type == AddrUnix {
		return "unix"
	}
	return "tcp"
}

// dialAddr is the address string net.Dial and net.Listen take.
func (a Addr) dialAddr() string {
	if a.Type == AddrUnix {
		return a.Path
	}
	return net.JoinHostPort(a.Host, strconv.Itoa(int(a.Port)))
}

// Spec is a parsed --netdev value: which QEMU backend tapgro speaks and from which side.
// Local is what tapgro listens on or binds (server and datagram roles); Remote is what it
// dials (client) or sends datagrams to (datagram).
type Spec struct {
	Backend Backend
	Role    Role
	Local   Addr
	Remote  Addr
	// VnetHdr asks for a virtio_net_hdr in front of each frame on a stream link
	// (tapgro-to-tapgro only; QEMU's stream backend never carries one: net/stream.c has no
	// has_vnet_hdr). It makes the endpoint run the hello and hand out vnet-hdr StreamPorts
	// (sockport/vnetstream.go).
	VnetHdr bool
	// NoShm (shm=off) keeps a vnet-hdr=on stream over AF_UNIX from setting up
	// shared-memory rings with its peer (sockport/shm.go): every frame then crosses the socket.
	NoShm bool
	// IfName is the netmap port (netmap:eth0, vale0:1, a pipe) and HdrLen its
	// virtio_net_hdr length (0, 10 or 12; non-zero only on VALE ports, the only ones
	// NETMAP_REQ_PORT_HDR_SET accepts, netmap sys/dev/netmap/netmap.c).
	IfName string
	HdrLen int
	// Queues is the vhost-user queue pairs offered (queues=N; 0 means one):
	// with N > 1 the TAP is opened with IFF_MULTI_QUEUE, one queue per pair, and QEMU
	// is given -netdev vhost-user,…,queues=N and the NIC mq=on.
	Queues int
}

// MaxVhostQueues is the most queue pairs vhost-user takes: 2·N rings must fit the
// 8-bit ring index of SET_VRING_KICK/CALL/ERR (vhost-user.rst), and N TAP queues
// MAX_TAP_QUEUES (256, drivers/net/tun.c).
const MaxVhostQueues = 128

// QueuePairs is the number of vhost-user queue pairs: Queues, at least 1.
func (s Spec) QueuePairs() int { return max(1, s.Queues) }

// specKeys are the keys each backend accepts; anything else is rejected by name.
var specKeys = map[Backend][]string{
	BackendStream: {"id", "server", "addr.type", "addr.path", "addr.host", "addr.port", "addr.str", "vnet-hdr", "shm"},
	BackendSocket: {"id", "listen", "connect", "udp", "localaddr", "fd"},
	BackendDgram: {"id", "local.type", "local.host", "local.port", "local.path",
		"remote.type", "remote.host", "remote.port", "remote.path"},
	BackendNetmap:    {"id", "ifname", "vnet-hdr"},
	BackendVhostUser: {"id", "path", "server", "queues"},
}

// ParseSpec parses a --netdev value written the way QEMU's -netdev is written, but from
// tapgro's side of the link:
//
//	stream,server=on|off,addr.type=unix,addr.path=P
//	stream,server=on|off,addr.type=inet,addr.host=H,addr.port=N
//	stream,server=on|off,addr.type=fd,addr.str=N
//	socket,listen=[H]:P | socket,connect=H:P | socket,udp=H:P,localaddr=[H]:P | socket,fd=N
//	dgram,local.type=inet,local.host=H,local.port=N,remote.type=inet,remote.host=H,remote.port=N
//	dgram,local.type=unix,local.path=P,remote.type=unix,remote.path=P
//	netmap,ifname=NAME[,vnet-hdr=0|10|12]
//	vhost-user,path=P[,server=on|off][,queues=N]
//
// id= is accepted and ignored; stream also takes vnet-hdr=on|off. A comma inside a value is
// written ",," as QEMU does. server defaults to off as in QEMU. For socket, an empty host
// in listen= or localaddr= means 127.0.0.1 (QEMU would take all addresses): tapgro never
// listens beyond loopback unless told to. Port 0 on an address tapgro binds picks a free
// port (Endpoint.Addr reports it). netmap's NAME is netmap:IFNAME (a NIC; "^" after it
// means its host rings, "*" both), valeSWITCH:PORT or a pipe (netmap:NAME{N, NAME}N);
// vnet-hdr (default 0) is the VALE port's virtio_net_hdr length. addr.type=fd and
// socket,fd= name an inherited socket (a listening one for server=on, a connected stream
// otherwise), as QEMU's own options do; N is a decimal descriptor >= 3. vhost-user
// listens on the UNIX socket P (server defaults to on here: tapgro is the socket server
// and QEMU its client, -chardev socket,path=P,reconnect=1); with server=off tapgro dials
// P, where QEMU listens (-chardev socket,path=P,server=on,wait=off), and dials again
// whenever the session ends. queues=N (1..128, default 1) offers N queue pairs, each on
// its own queue of a multiqueue TAP, as QEMU's -netdev vhost-user,queues=N.
func ParseSpec(s string) (Spec, error) {
	parts := splitOpts(s)
	if len(parts) == 0 || parts[0] == "" {
		return Spec{}, fmt.Errorf("netdev: empty spec (want stream, socket, dgram, netmap or vhost-user)")
	}
	var sp Spec
	switch parts[0] {
	case "stream":
		sp.Backend = BackendStream
	case "socket":
		sp.Backend = BackendSocket
	case "dgram":
		sp.Backend = BackendDgram
	case "netmap":
		sp.Backend = BackendNetmap
	case "vhost-user":
		sp.Backend = BackendVhostUser
	default:
		return Spec{}, fmt.Errorf("netdev: unknown backend %q (want stream, socket, dgram, netmap or vhost-user)", parts[0])
	}
	kv := make(map[string]string, len(parts)-1)
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return Spec{}, fmt.Errorf("netdev: %q is not key=value", p)
		}
		if !contains(specKeys[sp.Backend], k) {
			return Spec{}, fmt.Errorf("netdev: unknown key %q for %s", k, sp.Backend)
		}
		if _, dup := kv[k]; dup {
			return Spec{}, fmt.Errorf("netdev: key %q given twice", k)
		}
		kv[k] = v
	}
	var err error
	switch sp.Backend {
	case BackendStream:
		err = sp.parseStream(kv)
	case BackendSocket:
		err = sp.parseSocket(kv)
	case BackendDgram:
		err = sp.parseDgram(kv)
	case BackendNetmap:
		err = sp.parseNetmap(kv)
	case BackendVhostUser:
		err = sp.parseVhostUser(kv)
	}
	if err != nil {
		return Spec{}, err
	}
	return sp, nil
}

func (sp *Spec) parseStream(kv map[string]string) error {
	server, err := boolKey(kv, "server")
	if err != nil {
		return err
	}
	if sp.VnetHdr, err = boolKey(kv, "vnet-hdr"); err != nil {
		return err
	}
	if v, ok := kv["shm"]; ok {
		if !sp.VnetHdr {
			return fmt.Errorf("netdev: stream: shm=%s needs vnet-hdr=on (shared-memory rings are a tapgro-to-tapgro extension)", v)
		}
		shm, err := boolKey(kv, "shm")
		if err != nil {
			return err
		}
		sp.NoShm = !shm
	}
	a, err := addrKeys(kv, "addr", server, BackendStream)
	if err != nil {
		return err
	}
	if server {
		sp.Role, sp.Local = RoleServer, a
	} else {
		sp.Role, sp.Remote = RoleClient, a
	}
	return nil
}

// parseVhostUser reads path= and server=: tapgro listens on the UNIX socket path
// (server=on, the default) or dials it (server=off).
func (sp *Spec) parseVhostUser(kv map[string]string) error {
	server := true
	if has(kv, "server") {
		var err error
		if server, err = boolKey(kv, "server"); err != nil {
			return err
		}
	}
	p, ok := kv["path"]
	if !ok {
		return fmt.Errorf("netdev: vhost-user needs key \"path\"")
	}
	if err := checkPath("path", p); err != nil {
		return err
	}
	if v, ok := kv["queues"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxVhostQueues {
			return fmt.Errorf("netdev: vhost-user queues=%s: want a number of queue pairs, 1..%d", v, MaxVhostQueues)
		}
		if n > 1 { // one pair is the default, kept as 0 so that String round-trips
			sp.Queues = n
		}
	}
	a := Addr{Type: AddrUnix, Path: p}
	if server {
		sp.Role, sp.Local = RoleServer, a
	} else {
		sp.Role, sp.Remote = RoleClient, a
	}
	return nil
}

func (sp *Spec) parseSocket(kv map[string]string) error {
	n := 0
	for _, k := range []string{"listen", "connect", "udp", "fd"} {
		if _, ok := kv[k]; ok {
			n++
		}
	}
	switch {
	case n == 0:
		return fmt.Errorf("netdev: socket needs one of listen=, connect=, udp= or fd=")
	case n > 1:
		return fmt.Errorf("netdev: socket takes only one of listen=, connect=, udp= or fd=")
	}
	_, hasLocal := kv["localaddr"]
	var err error
	switch {
	case has(kv, "fd"):
		// QEMU's socket,fd= is a connected socket (net/socket.c net_init_socket); tapgro
		// takes streams.
		sp.Role = RoleClient
		sp.Remote, err = fdValue("fd", kv["fd"])
	case has(kv, "listen"):
		sp.Role = RoleServer
		sp.Local, err = hostPortKey(kv, "listen", true)
	case has(kv, "connect"):
		sp.Role = RoleClient
		sp.Remote, err = hostPortKey(kv, "connect", false)
	default:
		sp.Role = RoleDatagram
		if !hasLocal {
			// QEMU makes localaddr mandatory with udp= (net/socket.c net_init_socket); so do we.
			return fmt.Errorf("netdev: socket udp= needs key \"localaddr\"")
		}
		if sp.Remote, err = hostPortKey(kv, "udp", false); err != nil {
			return err
		}
		sp.Local, err = hostPortKey(kv, "localaddr", true)
		return err
	}
	if err == nil && hasLocal {
		return fmt.Errorf("netdev: key \"localaddr\" only goes with udp= for socket")
	}
	return err
}

func (sp *Spec) parseDgram(kv map[string]string) error {
	sp.Role = RoleDatagram
	var err error
	if sp.Local, err = addrKeys(kv, "local", true, BackendDgram); err != nil {
		return err
	}
	if sp.Remote, err = addrKeys(kv, "remote", false, BackendDgram); err != nil {
		return err
	}
	if sp.Local.Type != sp.Remote.Type {
		return fmt.Errorf("netdev: local.type=%s and remote.type=%s differ", sp.Local.Type, sp.Remote.Type)
	}
	if sp.Remote.Type == AddrInet {
		if ip, err := netip.ParseAddr(sp.Remote.Host); err == nil && ip.IsMulticast() {
			return fmt.Errorf("netdev: bad value %q for key \"remote.host\": multicast is not supported", sp.Remote.Host)
		}
	}
	return nil
}

// addrKeys reads PREFIX.type and the keys that go with it. local says whether tapgro binds
// this address (empty host allowed for socket only, port 0 allowed).
func addrKeys(kv map[string]string, prefix string, local bool, b Backend) (Addr, error) {
	tk := prefix + ".type"
	typ, ok := kv[tk]
	if !ok {
		return Addr{}, fmt.Errorf("netdev: %s needs key %q", b, tk)
	}
	hk, pk, ak := prefix+".host", prefix+".port", prefix+".path"
	var a Addr
	switch typ {
	case AddrUnix:
		for _, k := range []string{hk, pk} {
			if has(kv, k) {
				return Addr{}, fmt.Errorf("netdev: key %q does not go with %s=unix", k, tk)
			}
		}
		p, ok := kv[ak]
		if !ok {
			return Addr{}, fmt.Errorf("netdev: %s=unix needs key %q", tk, ak)
		}
		if err := checkPath(ak, p); err != nil {
			return Addr{}, err
		}
		a = Addr{Type: AddrUnix, Path: p}
	case AddrInet:
		if has(kv, ak) {
			return Addr{}, fmt.Errorf("netdev: key %q does not go with %s=inet", ak, tk)
		}
		h, ok := kv[hk]
		if !ok {
			return Addr{}, fmt.Errorf("netdev: %s=inet needs key %q", tk, hk)
		}
		if err := checkHost(hk, h); err != nil {
			return Addr{}, err
		}
		ps, ok := kv[pk]
		if !ok {
			return Addr{}, fmt.Errorf("netdev: %s=inet needs key %q", tk, pk)
		}
		port, err := parsePort(pk, ps, local)
		if err != nil {
			return Addr{}, err
		}
		a = Addr{Type: AddrInet, Host: h, Port: port}
	case AddrFD:
		sk := prefix + ".str"
		if b != BackendStream {
			return Addr{}, fmt.Errorf("netdev: %s=fd is supported for stream only", tk)
		}
		for _, k := range []string{hk, pk, ak} {
			if has(kv, k) {
				return Addr{}, fmt.Errorf("netdev: key %q does not go with %s=fd", k, tk)
			}
		}
		v, ok := kv[sk]
		if !ok {
			return Addr{}, fmt.Errorf("netdev: %s=fd needs key %q", tk, sk)
		}
		return fdValue(sk, v)
	default:
		return Addr{}, fmt.Errorf("netdev: bad value %q for key %q (want inet, unix or fd)", typ, tk)
	}
	if has(kv, prefix+".str") {
		return Addr{}, fmt.Errorf("netdev: key %q goes with %s=fd only", prefix+".str", tk)
	}
	return a, nil
}

// fdValue parses an inherited descriptor number. 0..2 are stdio, never a socket a
// supervisor meant (systemd passes 3 onwards); QEMU's monitor fd names do not exist here.
func fdValue(k, v string) (Addr, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < 3 || n > 1<<20 {
		return Addr{}, fmt.Errorf("netdev: bad value %q for key %q: want a file descriptor number >= 3", v, k)
	}
	return Addr{Type: AddrFD, FD: n}, nil
}

// hostPortKey reads a legacy socket "[host]:port" value. The socket backend is IPv4 only
// in QEMU (net/socket.c), so IPv6 literals are refused rather than left to fail later.
func hostPortKey(kv map[string]string, k string, local bool) (Addr, error) {
	v := kv[k]
	h, ps, err := net.SplitHostPort(v)
	if err != nil {
		return Addr{}, fmt.Errorf("netdev: bad value %q for key %q (want host:port)", v, k)
	}
	if h == "" {
		if !local {
			return Addr{}, fmt.Errorf("netdev: bad value %q for key %q: host is required", v, k)
		}
		h = "127.0.0.1"
	}
	if ip, err := netip.ParseAddr(h); err == nil && !ip.Is4() {
		return Addr{}, fmt.Errorf("netdev: bad value %q for key %q: QEMU's socket backend is IPv4 only", v, k)
	}
	if err := checkHost(k, h); err != nil {
		return Addr{}, err
	}
	port, err := parsePort(k, ps, local)
	if err != nil {
		return Addr{}, err
	}
	return Addr{Type: AddrInet, Host: h, Port: port}, nil
}

func checkHost(k, h string) error {
	if h == "" {
		return fmt.Errorf("netdev: bad value %q for key %q: host is required", h, k)
	}
	if strings.ContainsAny(h, " \t/[]") {
		return fmt.Errorf("netdev: bad value %q for key %q: not a host name or IP address", h, k)
	}
	return nil
}

func checkPath(k, p string) error {
	switch {
	case p == "":
		return fmt.Errorf("netdev: bad value %q for key %q: empty path", p, k)
	case len(p) > sockport.MaxUnixPath:
		return fmt.Errorf("netdev: bad value for key %q: path is %d bytes, AF_UNIX allows at most %d", k, len(p), sockport.MaxUnixPath)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("netdev: bad value %q for key %q: NUL in path", p, k)
	}
	return nil
}

func parsePort(k, s string, zeroOK bool) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("netdev: bad value %q for key %q: want a port number 0-65535", s, k)
	}
	if n == 0 && !zeroOK {
		return 0, fmt.Errorf("netdev: bad value %q for key %q: port 0 cannot be dialled", s, k)
	}
	return uint16(n), nil
}

// boolKey parses an optional QEMU boolean (on/off and the synonyms QEMU's parser takes).
func boolKey(kv map[string]string, k string) (bool, error) {
	v, ok := kv[k]
	if !ok {
		return false, nil
	}
	if on, ok := onoff.Parse(v); ok {
		return on, nil
	}
	return false, fmt.Errorf("netdev: bad value %q for key %q (want on or off)", v, k)
}

func has(kv map[string]string, k string) bool { _, ok := kv[k]; return ok }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// splitOpts splits on single commas; ",," is a literal comma inside a value (QEMU's rule).
func splitOpts(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != ',' {
			cur.WriteByte(s[i])
			continue
		}
		if i+1 < len(s) && s[i+1] == ',' {
			cur.WriteByte(',')
			i++
			continue
		}
		out = append(out, cur.String())
		cur.Reset()
	}
	return append(out, cur.String())
}

// esc doubles commas so a value survives QEMU's option parser.
func esc(v string) string { return strings.ReplaceAll(v, ",", ",,") }

// String is the canonical spec: defaults filled in, id dropped, keys in a fixed order.
// ParseSpec(s.String()) == s.
func (s Spec) String() string {
	var b strings.Builder
	b.WriteString(s.Backend.String())
	switch s.Backend {
	case BackendStream:
		a := s.Remote
		if s.Role == RoleServer {
			a = s.Local
		}
		b.WriteString(",server=" + onoff.String(s.Role == RoleServer))
		writeAddr(&b, "addr", a)
		if s.VnetHdr {
			b.WriteString(",vnet-hdr=on")
			if s.NoShm {
				b.WriteString(",shm=off")
			}
		}
	case BackendSocket:
		switch {
		case s.Remote.Type == AddrFD:
			b.WriteString(",fd=" + strconv.Itoa(s.Remote.FD))
		case s.Role == RoleServer:
			b.WriteString(",listen=" + esc(s.Local.String()))
		case s.Role == RoleClient:
			b.WriteString(",connect=" + esc(s.Remote.String()))
		default:
			b.WriteString(",udp=" + esc(s.Remote.String()) + ",localaddr=" + esc(s.Local.String()))
		}
	case BackendDgram:
		writeAddr(&b, "local", s.Local)
		writeAddr(&b, "remote", s.Remote)
	case BackendVhostUser:
		// server=on is the default and left out, so the spec users wrote most often
		// prints as they wrote it.
		switch {
		case s.Role == RoleClient:
			b.WriteString(",path=" + esc(s.Remote.Path) + ",server=off")
		case s.Local.Type == AddrFD:
			b.WriteString(",fd=" + strconv.Itoa(s.Local.FD)) // --fd; not a --netdev form
		default:
			b.WriteString(",path=" + esc(s.Local.Path))
		}
		if s.Queues > 1 {
			b.WriteString(",queues=" + strconv.Itoa(s.Queues))
		}
	case BackendNetmap:
		b.WriteString(",ifname=" + esc(s.IfName))
		if s.HdrLen != 0 {
			b.WriteString(",vnet-hdr=" + strconv.Itoa(s.HdrLen))
		}
	}
	return b.String()
}

func writeAddr(b *strings.Builder, prefix string, a Addr) {
	b.WriteString("," + prefix + ".type=" + a.Type)
	if a.Type == AddrFD {
		b.WriteString("," + prefix + ".str=" + strconv.Itoa(a.FD))
		return
	}
	if a.Type == AddrUnix {
		b.WriteString("," + prefix + ".path=" + esc(a.Path))
		return
	}
	b.WriteString("," + prefix + ".host=" + esc(a.Host) + "," + prefix + ".port=" + strconv.Itoa(int(a.Port)))
}
