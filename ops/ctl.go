package ops

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/datapath"
	"tapgro/vhostnet"
	"tapgro/virtio"
	"tapgro/vnethdr"
)

// The control socket lets an operator look at a running tapgro and switch offloads and
// GRO without a restart: when a kernel misbehaves with one TUN offload, turning that
// offload off must not cost the guest its connection.
//
// Protocol: a client connects to the UNIX stream socket, sends one request line of at
// most ctlMaxRequest bytes, and reads one JSON object (ctlResponse) and EOF. Requests:
//
//	status
//	offload auto | off | csum,tso4,...      replace the --offload choice
//	offload tso4=off csum=on ...            edit it one offload at a time
//	gro=on|off udp-gro=on|off               the port→TAP coalescing switches
//	pcap tap=FILE|off port=FILE|off         start, switch or stop capture
//
// Offload edits and switches may be combined in one request (`tso4=off gro=off`; the
// word "offload" is optional before per-offload edits). The whole request is validated
// before anything changes, so a bad request changes nothing.
//
// Changes go through the engine's switches (datapath.Engine): TUNSETOFFLOAD on the open
// TAP, and atomics the port→TAP goroutine reads between two read batches. Neither
// touches the port connection, and the datapath decides per frame, so frames already
// queued under the old setting are still handled right.
//
// The socket is 0600 and owned by tapgro's user (root before --user drops it), and each
// connection's SO_PEERCRED is checked as well: only root or that user may talk to it.
// Every connection has a deadline and at most ctlMaxConns are served at once, so a
// client that sends nothing, or many clients, cannot block tapgro or grow its memory.

const (
	MaxRequest = 1024
	Timeout    = 5 * time.Second
	MaxConns   = 8
	// ctlBusyTimeout bounds the time spent turning away a client beyond ctlMaxConns.
	busyTimeout = 100 * time.Millisecond
	// ctlMaxResponse bounds what the client reads; a status reply is about 1.5 KB.
	MaxResponse = 1 << 20
)

// ctlResponse is the one JSON object each request gets back.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Applied says what each change did, one readable sentence per change.
	Applied []string `json:"applied,omitempty"`
	Status  *Status  `json:"status,omitempty"`
}

// ctlStatus is the state after the request.
type Status struct {
	Version       string `json:"version"`
	Tap           string `json:"tap"`
	Listen        string `json:"listen"`
	PortConnected bool   `json:"port_connected"`
	Peer          string `json:"peer,omitempty"`

	// Negotiated is the "negotiated:" log line; the fields after it are its parts.
	Negotiated     string `json:"negotiated"`
	OffloadChoice  string `json:"offload_choice"`
	TapOffloads    string `json:"tap_offloads"`
	TapProbed      string `json:"tap_probed"`
	TapWrite       string `json:"tap_write"`
	PortState      string `json:"port_state"`
	PortAccepts    string `json:"port_accepts"`
	StepsTapToPort string `json:"steps_tap_to_port"`
	StepsPortToTap string `json:"steps_port_to_tap"`

	GRO            bool     `json:"gro"`             // the switch
	GROKilled      bool     `json:"gro_killed"`      // the kernel refused a GSO write
	GROActive      bool     `json:"gro_active"`      // TCP coalescing runs
	UDPGRO         bool     `json:"udp_gro"`         // the switch
	UDPGROActive   bool     `json:"udp_gro_active"`  // UDP coalescing runs
	OffloadsKilled string   `json:"offloads_killed"` // refused GSO kinds, split from now on
	PcapTap        string   `json:"pcap_tap"`        // the capture file and its counts, or "off"
	PcapPort       string   `json:"pcap_port"`
	Counters       Counters `json:"counters"`

	// Vhost is set for a vhost-user port, which has no engine: the fields above that
	// describe the engine's negotiation and GRO are then empty.
	Vhost *VhostStatus `json:"vhost,omitempty"`
}

// VhostStatus is a vhost-user port's state: the virtio features offered and acked, by
// name, and what they set on the TAP.
type VhostStatus struct {
	Offered     []string `json:"offered"`
	Acked       []string `json:"acked"` // empty until the guest's SET_FEATURES
	HdrLen      int      `json:"hdr_len"`
	TapOffloads string   `json:"tap_offloads"`
	GuestMTU    int      `json:"guest_mtu,omitempty"`
	Sessions    uint64   `json:"sessions"`
	Kicks       uint64   `json:"kicks"`
	Calls       uint64   `json:"calls"`
	RXStalls    uint64   `json:"rx_stalls"`
	Rejected    uint64   `json:"rejected"` // chains or rings the guest broke, all reasons
	GSOToTap    uint64   `json:"gso_port_to_tap"`
	GSOToGuest  uint64   `json:"gso_tap_to_port"`

	// QueuePairs offered (queues=N) and the pairs whose TAP queue is attached (the
	// guest enabled them).
	QueuePairs     int   `json:"queue_pairs"`
	QueuesAttached []int `json:"queues_attached"`
}

type DirCounters struct {
	Reads   uint64 `json:"reads"`   // frames read from the near side
	Frames  uint64 `json:"frames"`  // frames (GSO packets towards the TAP) delivered
	Bytes   uint64 `json:"bytes"`   // Ethernet bytes delivered
	Dropped uint64 `json:"dropped"` // every drop reason together (/metrics splits them)
}

type Counters struct {
	TapToPort        DirCounters `json:"tap_to_port"`
	PortToTap        DirCounters `json:"port_to_tap"`
	GROSegments      uint64      `json:"gro_segments"`
	GROPackets       uint64      `json:"gro_packets"`
	GSOSegmented     uint64      `json:"gso_segmented"`
	CsumCompleted    uint64      `json:"csum_completed"`
	GSOWriteFallback uint64      `json:"gso_write_fallback"`
}

// ctlRequest is a parsed request line.
type request struct {
	status bool
	// choice replaces the --offload choice (offload auto|off|LIST); nil keeps it.
	choice *vnethdr.Choice
	// on and off are per-offload edits, applied to choice (or the current one).
	on, off vnethdr.Offloads
	gro     *bool
	udpGRO  *bool
	// pcapTap and pcapPort switch capture: nil keeps it, "" stops it, else a file.
	pcapTap, pcapPort *string
}

func (r *request) editsOffloads() bool { return r.choice != nil || r.on|r.off != 0 }

const requestUsage = "want status, offload auto|off|csum,tso4,..., offload tso4=off ..., gro=on|off, udp-gro=on|off or pcap tap=FILE|off port=FILE|off"

// parseCtlRequest parses one request line. Errors quote what the client sent with %q,
// so whatever bytes it contains reach the client and the log escaped.
func ParseRequest(line string) (request, error) {
	var r request
	f := strings.Fields(line)
	if len(f) == 0 {
		return r, errors.New("empty request: " + requestUsage)
	}
	if f[0] == "status" {
		if len(f) > 1 {
			return r, fmt.Errorf("status takes no arguments, got %q", strings.Join(f[1:], " "))
		}
		r.status = true
		return r, nil
	}
	if f[0] == "pcap" {
		return parsePcap(f[1:])
	}
	if f[0] == "offload" {
		f = f[1:]
		if len(f) == 0 {
			return r, errors.New("offload: want auto, off, a list such as csum,tso4,tso6, or edits such as tso4=off")
		}
		if !strings.Contains(f[0], "=") {
			c, err := ParseOffloadList(f[0])
			if err != nil {
				return r, err
			}
			r.choice = &c
			f = f[1:]
		}
	}
	seen := map[string]bool{}
	for _, tok := range f {
		k, v, ok := strings.Cut(tok, "=")
		if !ok {
			return r, fmt.Errorf("%q: %s", tok, requestUsage)
		}
		if k == "udp_gro" {
			k = "udp-gro"
		}
		if k == "ecn" {
			k = "tso_ecn"
		}
		if seen[k] {
			return r, fmt.Errorf("%q is given twice", k)
		}
		seen[k] = true
		on, err := parseSwitch(k, v)
		if err != nil {
			return r, err
		}
		switch k {
		case "gro":
			r.gro = &on
		case "udp-gro":
			r.udpGRO = &on
		default:
			bit, ok := vnethdr.OffloadByName(k)
			if !ok {
				return r, fmt.Errorf("unknown switch %q: want gro, udp-gro, or an offload (csum, tso4, tso6, tso_ecn, uso, ufo)", k)
			}
			if on {
				r.on |= bit
			} else {
				r.off |= bit
			}
		}
	}
	return r, nil
}

// parseCtlPcap parses the arguments of a pcap request. Files must be absolute paths:
// a relative one would name a file in tapgro's working directory, not the client's.
func parsePcap(f []string) (request, error) {
	var r request
	if len(f) == 0 {
		return r, errors.New("pcap: want tap=FILE|off and/or port=FILE|off")
	}
	for _, tok := range f {
		k, v, ok := strings.Cut(tok, "=")
		if !ok || v == "" {
			return r, fmt.Errorf("pcap %q: want tap=FILE|off or port=FILE|off", tok)
		}
		path := ""
		if v != "off" {
			if !filepath.IsAbs(v) {
				return r, fmt.Errorf("pcap %s=%q: want an absolute path or off", k, v)
			}
			path = filepath.Clean(v)
		}
		var dst **string
		switch k {
		case "tap":
			dst = &r.pcapTap
		case "port":
			dst = &r.pcapPort
		default:
			return r, fmt.Errorf("pcap: unknown side %q (want tap or port)", k)
		}
		if *dst != nil {
			return r, fmt.Errorf("pcap: %q is given twice", k)
		}
		*dst = &path
	}
	if r.pcapTap != nil && r.pcapPort != nil && *r.pcapTap != "" && *r.pcapTap == *r.pcapPort {
		return r, fmt.Errorf("pcap: tap and port are both %q; each side needs its own file", *r.pcapTap)
	}
	return r, nil
}

func parseSwitch(k, v string) (bool, error) {
	switch v {
	case "on", "true", "1", "yes":
		return true, nil
	case "off", "false", "0", "no":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q: want on or off", k, v)
}

// parseCtlOffloadList is --offload's syntax (vnethdr.ParseChoice) with the request's
// words in its errors.
func ParseOffloadList(s string) (vnethdr.Choice, error) {
	c, err := vnethdr.ParseChoice(s)
	if err != nil {
		return c, fmt.Errorf("offload %q: %w", s, err)
	}
	return c, nil
}

// engine is what the control socket steers: datapath.Engine's switches and Snapshot.
type Engine interface {
	Snapshotter
	SetGRO(on bool) *datapath.Negotiation
	SetUDPGRO(on bool) *datapath.Negotiation
	SetOffloads(c vnethdr.Choice) (vnethdr.Offloads, error)
	SetCapture(side datapath.CaptureSide, path string) error
}

// snapshotter is what the read-only surfaces (metrics, health) need of the engine.
type Snapshotter interface{ Snapshot() datapath.Snapshot }

var _ Engine = (*datapath.Engine)(nil)

// ctlServer answers requests for one engine, or for one vhost-user datapath.
type CtlServer struct {
	eng    Engine
	vn     VhostNet
	tap    string
	listen string // the port's address, for status
	log    Logger
	ver    string // tapgro's version, for status

	mu    sync.Mutex    // one change at a time: an edit reads the choice, then sets it
	slots chan struct{} // connections being served
	busy  chan struct{} // connections being turned away
}

// NewCtlServer answers requests for eng. tap names the TAP and listen the port's address
// in status replies; version is tapgro's.
func NewCtlServer(eng Engine, tap, listen, version string, log Logger) *CtlServer {
	return &CtlServer{eng: eng, ver: version, tap: tap, listen: listen, log: log, slots: make(chan struct{}, MaxConns),
		busy: make(chan struct{}, MaxConns)}
}

// NewVhostCtlServer answers requests for a vhost-user datapath: status, and capture of
// the port side. Offloads there follow the guest's acked features and GRO does not
// run, so requests to switch them are refused with the reason.
func NewVhostCtlServer(vn VhostNet, tap, listen, version string, log Logger) *CtlServer {
	s := NewCtlServer(nil, tap, listen, version, log)
	s.vn = vn
	return s
}

// errVhostFixed refuses offload and GRO switches on a vhost-user port.
var errVhostFixed = errors.New("vhost-user: the TAP's offloads follow the features the guest acked (SET_FEATURES) and no GRO runs on this path, so there is nothing to switch; `tapgro ctl status` shows them")

// Serve answers connections on ln until it is closed.
func (s *CtlServer) Serve(ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: do not spin, try again shortly.
			s.log.Warn("control socket: accept failed", "error", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		select {
		case s.slots <- struct{}{}:
			go func() {
				defer func() { <-s.slots }()
				s.serveConn(c)
			}()
			continue
		default:
		}
		select {
		case s.busy <- struct{}{}:
			// Turned away rather than queued, after a short read of the request, with
			// the same care as a refusal (refuseCtl) so the client reads why.
			go func() {
				defer func() { <-s.busy }()
				defer c.Close()
				c.SetReadDeadline(time.Now().Add(busyTimeout))
				ReadRequest(c)
				refuse(c, &Response{Error: fmt.Sprintf("busy: %d requests are being served; try again", MaxConns)})
			}()
		default:
			c.Close()
		}
	}
}

// serveConn reads one request from c, answers it and closes c.
func (s *CtlServer) serveConn(c *net.UnixConn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(Timeout))
	cred, err := peerCred(c)
	if err != nil {
		s.log.Warn("control socket: cannot read the client's credentials; closing", "error", err)
		return
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		s.log.Warn("control socket: refused a client that is neither root nor tapgro's user", "uid", cred.Uid, "pid", cred.Pid)
		refuse(c, &Response{Error: "permission denied: only root and tapgro's own user may use the control socket"})
		return
	}
	line, err := ReadRequest(c)
	// The reply gets its own deadline: a read that timed out has used up the first.
	c.SetWriteDeadline(time.Now().Add(Timeout))
	if err != nil {
		WriteResponse(c, &Response{Error: err.Error()})
		return
	}
	resp := s.handle(line, []any{"uid", cred.Uid, "pid", cred.Pid})
	WriteResponse(c, resp)
}

// refuseCtl answers a client that will not be served with r and makes sure it can read
// the answer. Closing an AF_UNIX socket with input still unread in its receive queue
// makes the kernel reset the peer (unix_release_sock in net/unix/af_unix.c sets
// ECONNRESET on it), so a client whose request arrived but was never read gets
// ECONNRESET instead of the end of the reply, and one whose request comes after the
// close gets EPIPE. So the reply goes out first, our side is shut for writing (the
// client sees the reply and then EOF), and the client's input is read and thrown away
// until it closes its side, for at most refuseLimit bytes and refuseWait.
func refuse(c *net.UnixConn, r *Response) {
	const (
		refuseWait  = time.Second
		refuseLimit = 64 << 10
	)
	c.SetDeadline(time.Now().Add(refuseWait))
	if WriteResponse(c, r) != nil {
		return
	}
	c.CloseWrite()
	io.Copy(io.Discard, io.LimitReader(c, refuseLimit))
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// readCtlRequest reads one line of at most ctlMaxRequest bytes. A client that closes
// its side after the request without a newline is served too.
func ReadRequest(c io.Reader) (string, error) {
	r := bufio.NewReaderSize(io.LimitReader(c, MaxRequest+1), MaxRequest+1)
	line, err := r.ReadString('\n')
	switch {
	case len(line) > MaxRequest:
		return "", fmt.Errorf("request longer than %d bytes", MaxRequest)
	case err == nil:
	case errors.Is(err, io.EOF) && line != "":
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "", fmt.Errorf("no complete request line within %v", Timeout)
	default:
		return "", fmt.Errorf("reading the request: %w", err)
	}
	return strings.TrimRight(line, "\r\n"), nil
}

func WriteResponse(w io.Writer, r *Response) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// handle runs one request and describes the state after it. who identifies the client
// in the log.
func (s *CtlServer) handle(line string, who []any) *Response {
	req, err := ParseRequest(line)
	if err != nil {
		return &Response{Error: err.Error()}
	}
	if req.status {
		return &Response{OK: true, Status: s.status()}
	}
	if s.vn != nil {
		if req.editsOffloads() || req.gro != nil || req.udpGRO != nil {
			return &Response{Error: errVhostFixed.Error()}
		}
		if req.pcapTap != nil {
			return &Response{Error: "vhost-user: capture has one side, port= (each frame as the guest sent or received it; the TAP sees the same frames)"}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &Response{OK: true}
	// Everything that can be refused is decided before anything changes.
	var choice vnethdr.Choice
	if req.editsOffloads() {
		if choice, err = s.editedChoice(&req); err != nil {
			return &Response{Error: err.Error()}
		}
	}
	who = append(who[:len(who):len(who)], "request", line)
	if req.pcapTap != nil || req.pcapPort != nil {
		if err := s.setPcap(&req, resp); err != nil {
			s.log.Warn("ctl: capture not switched", append(who, "error", err)...)
			return &Response{Error: err.Error(), Applied: resp.Applied}
		}
	}
	if req.editsOffloads() {
		set, err := s.eng.SetOffloads(choice)
		if err != nil {
			s.log.Warn("ctl: cannot change the TAP's offloads", append(who, "error", err)...)
			return &Response{Error: fmt.Sprintf("offloads %s: %v; the TAP keeps %s", choice, err, set)}
		}
		resp.Applied = append(resp.Applied, s.describeOffloads(choice, set))
	}
	if req.gro != nil {
		n := s.eng.SetGRO(*req.gro)
		msg := "gro " + onOff(*req.gro)
		if *req.gro && n.P2T&datapath.StepGRO == 0 {
			msg += ", but it stays inactive: the kernel refused a GSO write earlier (sticky until restart)"
		}
		resp.Applied = append(resp.Applied, msg)
	}
	if req.udpGRO != nil {
		n := s.eng.SetUDPGRO(*req.udpGRO)
		msg := "udp-gro " + onOff(*req.udpGRO)
		if *req.udpGRO && n.P2T&datapath.StepUDPGRO == 0 {
			msg += ", but it is inactive: it needs gro on and a TAP that accepts USO on write"
		}
		resp.Applied = append(resp.Applied, msg)
	}
	s.log.Info("ctl: changed at run time", append(who, "applied", strings.Join(resp.Applied, "; "))...)
	resp.Status = s.status()
	return resp
}

// setPcap switches capture side by side. A side that cannot be switched keeps what it
// had; the reply says what was done before the failure.
func (s *CtlServer) setPcap(req *request, resp *Response) error {
	for _, x := range []struct {
		side datapath.CaptureSide
		name string
		path *string
	}{{datapath.CaptureTap, "tap", req.pcapTap}, {datapath.CapturePort, "port", req.pcapPort}} {
		if x.path == nil {
			continue
		}
		var err error
		if s.vn != nil {
			err = s.vn.SetCapture(*x.path) // the port side only (handle refused tap=)
		} else {
			err = s.eng.SetCapture(x.side, *x.path)
		}
		if err != nil {
			return fmt.Errorf("pcap %s: %w", x.name, err)
		}
		if *x.path == "" {
			resp.Applied = append(resp.Applied, "pcap "+x.name+" off")
		} else {
			resp.Applied = append(resp.Applied, "pcap "+x.name+" capturing into "+*x.path)
		}
	}
	return nil
}

// editedChoice is the offload choice req asks for: its whole value, or the current
// choice with its per-offload edits. Edits turn "auto" into the explicit set auto
// stands for on this kernel, so `tso4=off` means "what I have, without tso4".
func (s *CtlServer) editedChoice(req *request) (vnethdr.Choice, error) {
	snap := s.eng.Snapshot()
	c := snap.Offload
	if req.choice != nil {
		c = *req.choice
	}
	if req.on|req.off == 0 {
		return c, nil
	}
	set := c.Set
	if c.Auto {
		set = datapath.AutoOffloads & snap.TapProbed
	}
	set = (set | req.on) &^ req.off
	if set != 0 && set&vnethdr.OffloadCSUM == 0 {
		return c, fmt.Errorf("%s without csum: the kernel rejects TSO/USO without TUN_F_CSUM; use `offload off` to turn every offload off", set)
	}
	// Normalised, so the choice shows what it means: tso_ecn goes with the last TSO.
	set = set.Normalize()
	return vnethdr.Choice{Set: set}, nil
}

// describeOffloads says what an offload change did, and why anything asked for was not
// set.
func (s *CtlServer) describeOffloads(c vnethdr.Choice, set vnethdr.Offloads) string {
	msg := fmt.Sprintf("offloads %s: the TAP now hands tapgro %s", c, set)
	if c.Auto {
		return msg
	}
	missing := c.Set &^ set
	if missing == 0 {
		return msg
	}
	probed := s.eng.Snapshot().TapProbed
	if k := missing &^ probed; k != 0 {
		msg += fmt.Sprintf(" (%s: not offered by this kernel)", k)
	}
	if n := missing & probed; n != 0 {
		msg += fmt.Sprintf(" (%s: left out by negotiation with this port, e.g. tso_ecn for a port that takes TSO without ECN)", n)
	}
	return msg
}

// vhostStatus is a vhost-user datapath's state.
func (s *CtlServer) vhostStatus() *Status {
	vs, st, bs := s.vn.State(), s.vn.Stats(), s.vn.BackendStats()
	v := &VhostStatus{
		Offered: virtio.Names(vs.Offered), HdrLen: vs.Acked.HdrLen,
		TapOffloads: vs.TapOffloads.String(), GuestMTU: vs.GuestMTU,
		Sessions: bs.Sessions.Load(), Kicks: bs.Kicks.Load(), Calls: bs.Calls.Load(),
		RXStalls: st.RXStalls.Load(), GSOToTap: st.TXGSO.Load(), GSOToGuest: st.RXGSO.Load(),
		QueuePairs: vs.QueuePairs, QueuesAttached: []int{},
	}
	for i, a := range vs.Attached {
		if a {
			v.QueuesAttached = append(v.QueuesAttached, i)
		}
	}
	if vs.AckedValid {
		v.Acked = virtio.Names(vs.Acked.Bits)
	}
	for r := range bs.Rejected {
		v.Rejected += bs.Rejected[r].Load()
	}
	var txDrop, rxDrop uint64
	for r := 0; r < vhostnet.NumDrops; r++ {
		if vhostnet.DropIsRX(r) {
			rxDrop += st.Drops[r].Load()
		} else {
			txDrop += st.Drops[r].Load()
		}
	}
	tx, rx := st.TXFrames.Load(), st.RXFrames.Load()
	return &Status{
		Version: s.ver, Tap: s.tap, Listen: s.listen, PortConnected: vs.Connected,
		TapProbed: vs.TapProbed.String(), TapOffloads: v.TapOffloads,
		PcapTap: "off", PcapPort: s.vn.Capture().Describe(),
		Counters: Counters{
			PortToTap: DirCounters{Reads: tx + txDrop, Frames: tx, Bytes: st.TXBytes.Load(), Dropped: txDrop},
			TapToPort: DirCounters{Reads: rx + rxDrop, Frames: rx, Bytes: st.RXBytes.Load(), Dropped: rxDrop},
		},
		Vhost: v,
	}
}

// status is the engine's (or the vhost-user datapath's) state from one Snapshot.
func (s *CtlServer) status() *Status {
	if s.vn != nil {
		return s.vhostStatus()
	}
	snap := s.eng.Snapshot()
	st := &Status{
		Version: s.ver, Tap: s.tap, Listen: s.listen,
		PortConnected: snap.Connected, Peer: snap.Peer,
		GRO: snap.GROOn, GROKilled: snap.GROKilled, UDPGRO: snap.UDPGROOn,
		OffloadsKilled: snap.OffloadsKilled.String(),
		PcapTap:        snap.CaptureTap.State, PcapPort: snap.CapturePort.State,
		OffloadChoice: snap.Offload.String(), TapProbed: snap.TapProbed.String(),
	}
	if n := snap.Negotiation; n != nil {
		st.Negotiated = n.String()
		st.TapOffloads = n.TapOffloads.String()
		st.TapWrite = n.TapWrite.String()
		st.PortState = n.Port.State
		st.PortAccepts = n.Port.Accepts.String()
		st.StepsTapToPort = n.T2P.String()
		st.StepsPortToTap = n.P2T.String()
		st.GROActive = n.P2T&datapath.StepGRO != 0
		st.UDPGROActive = n.P2T&datapath.StepUDPGRO != 0
	}
	c := &st.Counters
	t2p, p2t := &snap.TapToPort, &snap.PortToTap
	c.TapToPort = DirCounters{Reads: t2p.Reads, Frames: t2p.Frames, Bytes: t2p.Bytes, Dropped: snap.Dropped(t2p)}
	c.PortToTap = DirCounters{Reads: p2t.Reads, Frames: p2t.Frames, Bytes: p2t.Bytes, Dropped: snap.Dropped(p2t)}
	if g := snap.GRO; g != nil {
		c.GROSegments, c.GROPackets = g.Segments.Load(), g.Packets.Load()
	}
	c.GSOSegmented = t2p.GSOSegmented
	c.CsumCompleted = t2p.CsumCompleted
	c.GSOWriteFallback = p2t.GSOFallback
	return st
}

// lines is status as "key: value" pairs in the order `tapgro ctl status` prints them.
func (st *Status) lines() [][2]string {
	port := "waiting for a peer on " + st.Listen
	if st.PortConnected {
		port = "connected to " + st.Peer + " (on " + st.Listen + ")"
	}
	c := &st.Counters
	dir := func(d DirCounters) string {
		return fmt.Sprintf("%d frames, %d bytes (read %d, dropped %d)", d.Frames, d.Bytes, d.Reads, d.Dropped)
	}
	if v := st.Vhost; v != nil {
		if st.PortConnected {
			port = "vhost-user front-end connected (on " + st.Listen + ")"
		}
		acked := strings.Join(v.Acked, " ")
		if len(v.Acked) == 0 {
			acked = "none yet (the guest has not started its driver)"
		}
		mtu := "not told (give the NIC host_mtu=N)"
		if v.GuestMTU != 0 {
			mtu = fmt.Sprint(v.GuestMTU)
		}
		rows := [][2]string{
			{"tap", st.Tap},
			{"version", st.Version},
			{"port", port},
			{"features offered", strings.Join(v.Offered, " ")},
			{"features acked", acked},
			{"header", fmt.Sprintf("%d bytes (TAP and guest)", v.HdrLen)},
			{"tap offloads", st.TapOffloads + " (what the guest acked to receive)"},
			{"tap offers", st.TapProbed},
			{"guest mtu", mtu},
			{"guest->tap", dir(c.PortToTap) + fmt.Sprintf(", %d GSO whole", v.GSOToTap)},
			{"tap->guest", dir(c.TapToPort) + fmt.Sprintf(", %d GSO whole", v.GSOToGuest)},
			{"sessions", fmt.Sprint(v.Sessions)},
			{"kicks / calls", fmt.Sprintf("%d / %d", v.Kicks, v.Calls)},
			{"rx stalls", fmt.Sprintf("%d (the guest had no receive buffers)", v.RXStalls)},
			{"rings rejected", fmt.Sprint(v.Rejected)},
			{"pcap port", st.PcapPort},
		}
		if v.QueuePairs > 1 {
			rows = append(rows, [2]string{"queue pairs", fmt.Sprintf("%d, TAP queues attached: %v (the pairs the guest uses)", v.QueuePairs, v.QueuesAttached)})
		}
		return rows
	}
	gro := onOff(st.GRO)
	switch {
	case st.GROKilled:
		gro += " (inactive: the kernel refused a GSO write; sticky until restart)"
	case st.GRO && !st.GROActive:
		gro += " (inactive)"
	}
	udp := onOff(st.UDPGRO)
	if st.UDPGRO && !st.UDPGROActive {
		udp += " (inactive: needs gro on and a TAP that accepts USO on write)"
	}
	gp := fmt.Sprintf("%d segments into %d packets", c.GROSegments, c.GROPackets)
	if c.GROPackets > 0 {
		gp += fmt.Sprintf(" (%.1f per packet)", float64(c.GROSegments)/float64(c.GROPackets))
	}
	return [][2]string{
		{"tap", st.Tap},
		{"version", st.Version},
		{"port", port},
		{"negotiated", st.Negotiated},
		{"offload choice", st.OffloadChoice},
		{"tap offloads", st.TapOffloads},
		{"tap offers", st.TapProbed},
		{"tap takes on write", st.TapWrite},
		{"port backend", st.PortState},
		{"port accepts", st.PortAccepts},
		{"tap->port steps", st.StepsTapToPort},
		{"port->tap steps", st.StepsPortToTap},
		{"gro", gro},
		{"udp-gro", udp},
		{"offloads refused", st.OffloadsKilled},
		{"tap->port", dir(c.TapToPort)},
		{"port->tap", dir(c.PortToTap)},
		{"gro coalesced", gp},
		{"gso segmented", fmt.Sprint(c.GSOSegmented)},
		{"csum completed", fmt.Sprint(c.CsumCompleted)},
		{"gso write fallback", fmt.Sprint(c.GSOWriteFallback)},
		{"pcap tap", st.PcapTap},
		{"pcap port", st.PcapPort},
	}
}

// writeStatus prints st aligned.
func WriteStatus(w io.Writer, st *Status) {
	ls := st.lines()
	width := 0
	for _, l := range ls {
		width = max(width, len(l[0])+1)
	}
	for _, l := range ls {
		fmt.Fprintf(w, "%-*s %s\n", width, l[0]+":", l[1])
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// Logger receives the operator surfaces' events; main adapts it to its logger. kv are
// alternating keys and values, an error under the key "error".
type Logger = datapath.Logger

// Serving is how many connections are being served now (at most MaxConns).
func (s *CtlServer) Serving() int { return len(s.slots) }
