package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"tapgro/datapath"
	"tapgro/netdev"
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
//	pcap tap=FILE|off port=FILE|off         start, switch or stop capture (capture.go)
//
// Offload edits and switches may be combined in one request (`tso4=off gro=off`; the
// word "offload" is optional before per-offload edits). The whole request is validated
// before anything changes, so a bad request changes nothing.
//
// Changes go through the bridge's hooks (offload_control.go): TUNSETOFFLOAD on the open
// TAP, and atomics the port→TAP goroutine reads between two read batches. Neither
// touches the port connection, and the datapath decides per frame, so frames already
// queued under the old setting are still handled right.
//
// The socket is 0600 and owned by tapgro's user (root before --user drops it), and each
// connection's SO_PEERCRED is checked as well: only root or that user may talk to it.
// Every connection has a deadline and at most ctlMaxConns are served at once, so a
// client that sends nothing, or many clients, cannot block tapgro or grow its memory.

const (
	ctlDefaultDir = "/run/tapgro"
	ctlMaxRequest = 1024
	ctlTimeout    = 5 * time.Second
	ctlMaxConns   = 8
	// ctlBusyTimeout bounds the time spent turning away a client beyond ctlMaxConns.
	ctlBusyTimeout = 100 * time.Millisecond
	// ctlMaxResponse bounds what the client reads; a status reply is about 1.5 KB.
	ctlMaxResponse = 1 << 20
)

// defaultCtlSocket is where the control socket of the TAP named tap lives.
func defaultCtlSocket(tap string) string { return filepath.Join(ctlDefaultDir, tap+".ctl") }

// ctlResponse is the one JSON object each request gets back.
type ctlResponse struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Applied says what each change did, one readable sentence per change.
	Applied []string   `json:"applied,omitempty"`
	Status  *ctlStatus `json:"status,omitempty"`
}

// ctlStatus is the state after the request.
type ctlStatus struct {
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

	GRO            bool        `json:"gro"`             // the switch
	GROKilled      bool        `json:"gro_killed"`      // the kernel refused a GSO write
	GROActive      bool        `json:"gro_active"`      // TCP coalescing runs
	UDPGRO         bool        `json:"udp_gro"`         // the switch
	UDPGROActive   bool        `json:"udp_gro_active"`  // UDP coalescing runs
	OffloadsKilled string      `json:"offloads_killed"` // refused GSO kinds, split from now on
	PcapTap        string      `json:"pcap_tap"`        // the capture file and its counts, or "off"
	PcapPort       string      `json:"pcap_port"`
	Counters       ctlCounters `json:"counters"`
}

type ctlDirCounters struct {
	Reads   uint64 `json:"reads"`   // frames read from the near side
	Frames  uint64 `json:"frames"`  // frames (GSO packets towards the TAP) delivered
	Bytes   uint64 `json:"bytes"`   // Ethernet bytes delivered
	Dropped uint64 `json:"dropped"` // every drop reason together (/metrics splits them)
}

type ctlCounters struct {
	TapToPort        ctlDirCounters `json:"tap_to_port"`
	PortToTap        ctlDirCounters `json:"port_to_tap"`
	GROSegments      uint64         `json:"gro_segments"`
	GROPackets       uint64         `json:"gro_packets"`
	GSOSegmented     uint64         `json:"gso_segmented"`
	CsumCompleted    uint64         `json:"csum_completed"`
	GSOWriteFallback uint64         `json:"gso_write_fallback"`
}

// ctlRequest is a parsed request line.
type ctlRequest struct {
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

func (r *ctlRequest) editsOffloads() bool { return r.choice != nil || r.on|r.off != 0 }

const ctlUsage = "want status, offload auto|off|csum,tso4,..., offload tso4=off ..., gro=on|off, udp-gro=on|off or pcap tap=FILE|off port=FILE|off"

// parseCtlRequest parses one request line. Errors quote what the client sent with %q,
// so whatever bytes it contains reach the client and the log escaped.
func parseCtlRequest(line string) (ctlRequest, error) {
	var r ctlRequest
	f := strings.Fields(line)
	if len(f) == 0 {
		return r, errors.New("empty request: " + ctlUsage)
	}
	if f[0] == "status" {
		if len(f) > 1 {
			return r, fmt.Errorf("status takes no arguments, got %q", strings.Join(f[1:], " "))
		}
		r.status = true
		return r, nil
	}
	if f[0] == "pcap" {
		return parseCtlPcap(f[1:])
	}
	if f[0] == "offload" {
		f = f[1:]
		if len(f) == 0 {
			return r, errors.New("offload: want auto, off, a list such as csum,tso4,tso6, or edits such as tso4=off")
		}
		if !strings.Contains(f[0], "=") {
			c, err := parseCtlOffloadList(f[0])
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
			return r, fmt.Errorf("%q: %s", tok, ctlUsage)
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
		on, err := ctlOnOff(k, v)
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
func parseCtlPcap(f []string) (ctlRequest, error) {
	var r ctlRequest
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

func ctlOnOff(k, v string) (bool, error) {
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
func parseCtlOffloadList(s string) (vnethdr.Choice, error) {
	c, err := vnethdr.ParseChoice(s)
	if err != nil {
		return c, fmt.Errorf("offload %q: %w", s, err)
	}
	return c, nil
}

// engine is what the control socket steers: datapath.Engine's switches and Snapshot.
type engine interface {
	snapshotter
	SetGRO(on bool) *datapath.Negotiation
	SetUDPGRO(on bool) *datapath.Negotiation
	SetOffloads(c vnethdr.Choice) (vnethdr.Offloads, error)
	SetCapture(side datapath.CaptureSide, path string) error
}

// snapshotter is what the read-only surfaces (metrics, health) need of the engine.
type snapshotter interface{ Snapshot() datapath.Snapshot }

var _ engine = (*datapath.Engine)(nil)

// ctlServer answers requests for one engine.
type ctlServer struct {
	eng    engine
	tap    string
	listen string // the port's address, for status
	log    *logrus.Logger

	mu    sync.Mutex    // one change at a time: an edit reads the choice, then sets it
	slots chan struct{} // connections being served
	busy  chan struct{} // connections being turned away
}

func newCtlServer(eng engine, tap, listen string, log *logrus.Logger) *ctlServer {
	return &ctlServer{eng: eng, tap: tap, listen: listen, log: log, slots: make(chan struct{}, ctlMaxConns),
		busy: make(chan struct{}, ctlMaxConns)}
}

// startCtl serves the control socket o asks for until the returned func is called. An
// explicit --ctl-socket that cannot be created is an error; the default path only
// warns, so a second tapgro for a TAP of the same name in another network namespace
// (the path is per host, the name per namespace) still starts.
func startCtl(o *options, s *ctlServer) (func(), error) {
	path := o.ctlSocket
	if path == "" {
		return func() {}, nil
	}
	opt := netdev.Options{SocketMode: 0o600, AllowUnsafeDir: o.allowUnsafeDir}
	if o.user != nil {
		// 0600 keeps meaning "root and the user tapgro runs as".
		opt.SocketUID, opt.SocketGID = o.user.uid, o.user.gid
	}
	ln, remove, err := listenCtl(path, opt)
	if err != nil {
		if o.ctlSocketDefault {
			s.log.WithError(err).WithField("path", path).Warn("no control socket: cannot create the default one; give --ctl-socket PATH (or --ctl-socket \"\" to silence this)")
			return func() {}, nil
		}
		return nil, fmt.Errorf("--ctl-socket: %w", err)
	}
	done := make(chan struct{})
	go func() { s.serve(ln); close(done) }()
	s.log.WithField("path", path).Info("control socket ready (tapgro ctl)")
	return func() {
		ln.Close()
		<-done
		remove()
	}, nil
}

// listenCtl creates path's directory if it is missing (0700: the socket is root's
// business) and listens on path.
func listenCtl(path string, opt netdev.Options) (*net.UnixListener, func(), error) {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, err
		}
	}
	return netdev.ListenUnix(path, opt)
}

func (s *ctlServer) serve(ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and the like: do not spin, try again shortly.
			s.log.WithError(err).Warn("control socket: accept failed")
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
				c.SetReadDeadline(time.Now().Add(ctlBusyTimeout))
				readCtlRequest(c)
				refuseCtl(c, &ctlResponse{Error: fmt.Sprintf("busy: %d requests are being served; try again", ctlMaxConns)})
			}()
		default:
			c.Close()
		}
	}
}

// serveConn reads one request from c, answers it and closes c.
func (s *ctlServer) serveConn(c *net.UnixConn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(ctlTimeout))
	cred, err := peerCred(c)
	if err != nil {
		s.log.WithError(err).Warn("control socket: cannot read the client's credentials; closing")
		return
	}
	if cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		s.log.WithFields(logrus.Fields{"uid": cred.Uid, "pid": cred.Pid}).Warn("control socket: refused a client that is neither root nor tapgro's user")
		refuseCtl(c, &ctlResponse{Error: "permission denied: only root and tapgro's own user may use the control socket"})
		return
	}
	line, err := readCtlRequest(c)
	// The reply gets its own deadline: a read that timed out has used up the first.
	c.SetWriteDeadline(time.Now().Add(ctlTimeout))
	if err != nil {
		writeCtlResponse(c, &ctlResponse{Error: err.Error()})
		return
	}
	resp := s.handle(line, logrus.Fields{"uid": cred.Uid, "pid": cred.Pid})
	writeCtlResponse(c, resp)
}

// refuseCtl answers a client that will not be served with r and makes sure it can read
// the answer. Closing an AF_UNIX socket with input still unread in its receive queue
// makes the kernel reset the peer (unix_release_sock in net/unix/af_unix.c sets
// ECONNRESET on it), so a client whose request arrived but was never read gets
// ECONNRESET instead of the end of the reply, and one whose request comes after the
// close gets EPIPE. So the reply goes out first, our side is shut for writing (the
// client sees the reply and then EOF), and the client's input is read and thrown away
// until it closes its side, for at most refuseLimit bytes and refuseWait.
func refuseCtl(c *net.UnixConn, r *ctlResponse) {
	const (
		refuseWait  = time.Second
		refuseLimit = 64 << 10
	)
	c.SetDeadline(time.Now().Add(refuseWait))
	if writeCtlResponse(c, r) != nil {
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
func readCtlRequest(c io.Reader) (string, error) {
	r := bufio.NewReaderSize(io.LimitReader(c, ctlMaxRequest+1), ctlMaxRequest+1)
	line, err := r.ReadString('\n')
	switch {
	case len(line) > ctlMaxRequest:
		return "", fmt.Errorf("request longer than %d bytes", ctlMaxRequest)
	case err == nil:
	case errors.Is(err, io.EOF) && line != "":
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "", fmt.Errorf("no complete request line within %v", ctlTimeout)
	default:
		return "", fmt.Errorf("reading the request: %w", err)
	}
	return strings.TrimRight(line, "\r\n"), nil
}

func writeCtlResponse(w io.Writer, r *ctlResponse) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// handle runs one request and describes the state after it. who identifies the client
// in the log.
func (s *ctlServer) handle(line string, who logrus.Fields) *ctlResponse {
	req, err := parseCtlRequest(line)
	if err != nil {
		return &ctlResponse{Error: err.Error()}
	}
	if req.status {
		return &ctlResponse{OK: true, Status: s.status()}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &ctlResponse{OK: true}
	// Everything that can be refused is decided before anything changes.
	var choice vnethdr.Choice
	if req.editsOffloads() {
		if choice, err = s.editedChoice(&req); err != nil {
			return &ctlResponse{Error: err.Error()}
		}
	}
	entry := s.log.WithFields(who).WithField("request", line)
	if req.pcapTap != nil || req.pcapPort != nil {
		if err := s.setPcap(&req, resp); err != nil {
			entry.WithError(err).Warn("ctl: capture not switched")
			return &ctlResponse{Error: err.Error(), Applied: resp.Applied}
		}
	}
	if req.editsOffloads() {
		set, err := s.eng.SetOffloads(choice)
		if err != nil {
			entry.WithError(err).Warn("ctl: cannot change the TAP's offloads")
			return &ctlResponse{Error: fmt.Sprintf("offloads %s: %v; the TAP keeps %s", choice, err, set)}
		}
		resp.Applied = append(resp.Applied, s.describeOffloads(choice, set))
	}
	if req.gro != nil {
		n := s.eng.SetGRO(*req.gro)
		msg := "gro " + onOffString(*req.gro)
		if *req.gro && n.P2T&datapath.StepGRO == 0 {
			msg += ", but it stays inactive: the kernel refused a GSO write earlier (sticky until restart)"
		}
		resp.Applied = append(resp.Applied, msg)
	}
	if req.udpGRO != nil {
		n := s.eng.SetUDPGRO(*req.udpGRO)
		msg := "udp-gro " + onOffString(*req.udpGRO)
		if *req.udpGRO && n.P2T&datapath.StepUDPGRO == 0 {
			msg += ", but it is inactive: it needs gro on and a TAP that accepts USO on write"
		}
		resp.Applied = append(resp.Applied, msg)
	}
	entry.WithField("applied", strings.Join(resp.Applied, "; ")).Info("ctl: changed at run time")
	resp.Status = s.status()
	return resp
}

// setPcap switches capture side by side. A side that cannot be switched keeps what it
// had; the reply says what was done before the failure.
func (s *ctlServer) setPcap(req *ctlRequest, resp *ctlResponse) error {
	for _, x := range []struct {
		side datapath.CaptureSide
		name string
		path *string
	}{{datapath.CaptureTap, "tap", req.pcapTap}, {datapath.CapturePort, "port", req.pcapPort}} {
		if x.path == nil {
			continue
		}
		if err := s.eng.SetCapture(x.side, *x.path); err != nil {
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
func (s *ctlServer) editedChoice(req *ctlRequest) (vnethdr.Choice, error) {
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
func (s *ctlServer) describeOffloads(c vnethdr.Choice, set vnethdr.Offloads) string {
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

// status is the engine's state from one Snapshot.
func (s *ctlServer) status() *ctlStatus {
	snap := s.eng.Snapshot()
	st := &ctlStatus{
		Version: version, Tap: s.tap, Listen: s.listen,
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
	c.TapToPort = ctlDirCounters{Reads: t2p.Reads, Frames: t2p.Frames, Bytes: t2p.Bytes, Dropped: snap.Dropped(t2p)}
	c.PortToTap = ctlDirCounters{Reads: p2t.Reads, Frames: p2t.Frames, Bytes: p2t.Bytes, Dropped: snap.Dropped(p2t)}
	if g := snap.GRO; g != nil {
		c.GROSegments, c.GROPackets = g.Segments.Load(), g.Packets.Load()
	}
	c.GSOSegmented = t2p.GSOSegmented
	c.CsumCompleted = t2p.CsumCompleted
	c.GSOWriteFallback = p2t.GSOFallback
	return st
}

// lines is status as "key: value" pairs in the order `tapgro ctl status` prints them.
func (st *ctlStatus) lines() [][2]string {
	port := "waiting for a peer on " + st.Listen
	if st.PortConnected {
		port = "connected to " + st.Peer + " (on " + st.Listen + ")"
	}
	gro := onOffString(st.GRO)
	switch {
	case st.GROKilled:
		gro += " (inactive: the kernel refused a GSO write; sticky until restart)"
	case st.GRO && !st.GROActive:
		gro += " (inactive)"
	}
	udp := onOffString(st.UDPGRO)
	if st.UDPGRO && !st.UDPGROActive {
		udp += " (inactive: needs gro on and a TAP that accepts USO on write)"
	}
	c := &st.Counters
	dir := func(d ctlDirCounters) string {
		return fmt.Sprintf("%d frames, %d bytes (read %d, dropped %d)", d.Frames, d.Bytes, d.Reads, d.Dropped)
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
func writeStatus(w io.Writer, st *ctlStatus) {
	ls := st.lines()
	width := 0
	for _, l := range ls {
		width = max(width, len(l[0])+1)
	}
	for _, l := range ls {
		fmt.Fprintf(w, "%-*s %s\n", width, l[0]+":", l[1])
	}
}

const ctlUsageText = `Usage:
  tapgro ctl [--socket PATH | --tap NAME] [--json] REQUEST

Requests:
  status                         port, negotiated offloads, GRO, key counters
  offload auto|off|LIST          set the TAP's offloads (LIST: csum,tso4,tso6,tso_ecn,uso)
  offload tso4=off csum=on ...   change single offloads ("offload" may be left out)
  gro=on|off  udp-gro=on|off     port->TAP coalescing
  pcap tap=FILE|off port=FILE|off
                                 capture each side into a pcap file (absolute path), or stop
Changes apply at once, without dropping the port connection.

Flags:
`

// runCtl is `tapgro ctl`: it sends one request to a running tapgro and prints the reply.
func runCtl(args []string, stdout, stderr io.Writer) int {
	fset := newCtlFlags(stderr)
	socket := fset.String("socket", "", "control socket path (default "+ctlDefaultDir+"/TAP.ctl)")
	tap := fset.String("tap", "", "the TAP tapgro serves: use its default control socket")
	raw := fset.Bool("json", false, "print the JSON reply as it came")
	timeout := fset.Duration("timeout", ctlTimeout, "give up after this long")
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, errHelp) {
			return 0
		}
		return 2
	}
	if fset.NArg() == 0 {
		fmt.Fprintln(stderr, "tapgro ctl: no request")
		fset.Usage()
		return 2
	}
	path, err := ctlPath(*socket, *tap)
	if err != nil {
		fmt.Fprintln(stderr, "tapgro ctl:", err)
		return 2
	}
	req := strings.Join(fset.Args(), " ")
	body, err := ctlCall(path, req, *timeout)
	if err != nil {
		fmt.Fprintln(stderr, "tapgro ctl:", err)
		return 1
	}
	var resp ctlResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		fmt.Fprintf(stderr, "tapgro ctl: %s answered something that is not a reply: %v\n", path, err)
		return 1
	}
	if *raw {
		stdout.Write(body)
	}
	if !resp.OK {
		fmt.Fprintln(stderr, "tapgro ctl:", resp.Error)
		return 1
	}
	if *raw {
		return 0
	}
	for _, a := range resp.Applied {
		fmt.Fprintln(stdout, a)
	}
	switch {
	case resp.Status == nil:
	case len(resp.Applied) == 0:
		writeStatus(stdout, resp.Status)
	default:
		fmt.Fprintln(stdout, "negotiated: "+resp.Status.Negotiated)
	}
	return 0
}

func newCtlFlags(stderr io.Writer) *flag.FlagSet {
	fset := flag.NewFlagSet("tapgro ctl", flag.ContinueOnError)
	fset.SetOutput(stderr)
	fset.Usage = func() {
		fmt.Fprint(stderr, ctlUsageText)
		fset.PrintDefaults()
	}
	return fset
}

// ctlPath picks the socket: --socket, --tap's default, or the only socket in the
// default directory.
func ctlPath(socket, tap string) (string, error) {
	switch {
	case socket != "" && tap != "":
		return "", errors.New("give --socket or --tap, not both")
	case socket != "":
		return socket, nil
	case tap != "":
		return defaultCtlSocket(tap), nil
	}
	m, _ := filepath.Glob(filepath.Join(ctlDefaultDir, "*.ctl"))
	switch len(m) {
	case 1:
		return m[0], nil
	case 0:
		return "", fmt.Errorf("no control socket in %s; give --socket PATH or --tap NAME", ctlDefaultDir)
	}
	return "", fmt.Errorf("several control sockets in %s (%s); give --tap NAME or --socket PATH", ctlDefaultDir, strings.Join(m, ", "))
}

// ctlCall sends req and returns the raw reply.
func ctlCall(path, req string, timeout time.Duration) ([]byte, error) {
	if len(req)+1 > ctlMaxRequest {
		return nil, fmt.Errorf("request longer than %d bytes", ctlMaxRequest)
	}
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		if errors.Is(err, syscall.EACCES) {
			return nil, fmt.Errorf("%w (the control socket is for root and tapgro's own user)", err)
		}
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (is tapgro running with this control socket?)", err)
		}
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, req+"\n"); err != nil {
		return nil, fmt.Errorf("send to %s: %w", path, err)
	}
	c.(*net.UnixConn).CloseWrite()
	body, err := io.ReadAll(io.LimitReader(c, ctlMaxResponse))
	if err != nil {
		return nil, fmt.Errorf("reply from %s: %w", path, err)
	}
	if len(body) == 0 {
		return nil, fmt.Errorf("%s closed the connection without a reply", path)
	}
	return body, nil
}
