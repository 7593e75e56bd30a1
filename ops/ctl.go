package ops

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tapgro/datapath"
	"tapgro/onoff"
	"tapgro/vnethdr"
)

// The control socket lets an operator look at a running tapgro and switch offloads and
// GRO without a restart: when a kernel misbehaves with one TUN offload, turning that
// offload off must not cost the guest its connection.
//
// Protocol: a client connects to the UNIX stream socket, sends one request line of at
// most MaxRequest bytes, and reads one JSON object (Response) and EOF. Requests:
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
// Changes go through the datapath's switches (Datapath; the engine's are datapath.Engine's:
// TUNSETOFFLOAD on the open TAP, and atomics the port→TAP goroutine reads between two read
// batches). Neither
// touches the port connection, and the datapath decides per frame, so frames already
// queued under the old setting are still handled right.
//
// The socket is 0600 and owned by tapgro's user (root before --user drops it), and each
// connection's SO_PEERCRED is checked as well: only root or that user may talk to it.
// Every connection has a deadline and at most MaxConns are served at once, so a
// client that sends nothing, or many clients, cannot block tapgro or grow its memory.

const (
	MaxRequest = 1024
	Timeout    = 5 * time.Second
	MaxConns   = 8
	// busyTimeout bounds the time spent turning away a client beyond MaxConns.
	busyTimeout = 100 * time.Millisecond
	// MaxResponse bounds what the client reads; a status reply is about 1.5 KB.
	MaxResponse = 1 << 20
)

// CtlServer answers requests for one Datapath. What a request may switch is the
// datapath's to say (Datapath.refuse); a request for a switch it lacks is refused with
// the reason before anything changes.
type CtlServer struct {
	dp      Datapath
	tap     string
	listen  string // the port's address, for status
	log     Logger
	ver     string                 // tapgro's version, for status
	sandbox atomic.Pointer[string] // what the sandbox put in force, for status (SetSandbox)

	mu    sync.Mutex    // one change at a time: an edit reads the choice, then sets it
	slots chan struct{} // connections being served
	busy  chan struct{} // connections being turned away
}

// NewCtlServer answers requests for dp; version is tapgro's.
func NewCtlServer(dp Datapath, version string, log Logger) *CtlServer {
	tap, listen := dp.names()
	return &CtlServer{dp: dp, ver: version, tap: tap, listen: listen, log: log,
		slots: make(chan struct{}, MaxConns), busy: make(chan struct{}, MaxConns)}
}

// ctlCaps are the run-time switches a datapath may have.
type ctlCaps uint8

const (
	capOffloads ctlCaps = 1 << iota // the TAP's offloads (offload …)
	capGRO                          // gro=
	capUDPGRO                       // udp-gro=
	capPcapTap                      // pcap tap=
	capPcapPort                     // pcap port=
)

// status is the datapath's status with what the server knows added.
func (s *CtlServer) status() *Status {
	st := s.dp.status()
	st.Version, st.Tap, st.Listen = s.ver, s.tap, s.listen
	if sb := s.sandbox.Load(); sb != nil {
		st.Sandbox = *sb
	}
	return st
}

// SetSandbox records what package sandbox put in force, for status. The server starts
// before the sandbox closes (its listener is opened with the rest of set-up).
func (s *CtlServer) SetSandbox(what string) { s.sandbox.Store(&what) }

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
			// the same care as a refusal (refuse) so the client reads why.
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

// euid is read at start: geteuid(2) is not on the confined allow-list. In the user
// namespace of a tapgro started unprivileged it is 0, the starting user seen from
// inside; root outside is not mapped there and reads as the overflow uid, so only the
// starting user may use that tapgro's control socket.
var euid = os.Geteuid()

// serveConn reads one request from c, answers it and closes c.
func (s *CtlServer) serveConn(c *net.UnixConn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(Timeout))
	cred, err := peerCred(c)
	if err != nil {
		s.log.Warn("control socket: cannot read the client's credentials; closing", "error", err)
		return
	}
	if cred.Uid != 0 && int(cred.Uid) != euid {
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

// refuse answers a client that will not be served with r and makes sure it can read
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
	var need ctlCaps
	if req.editsOffloads() {
		need |= capOffloads
	}
	if req.gro != nil {
		need |= capGRO
	}
	if req.udpGRO != nil {
		need |= capUDPGRO
	}
	if req.pcapTap != nil {
		need |= capPcapTap
	}
	if req.pcapPort != nil {
		need |= capPcapPort
	}
	if err := s.dp.refuse(need); err != nil {
		return &Response{Error: err.Error()}
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
		set, err := s.dp.setOffloads(choice)
		if err != nil {
			s.log.Warn("ctl: cannot change the TAP's offloads", append(who, "error", err)...)
			return &Response{Error: fmt.Sprintf("offloads %s: %v; the TAP keeps %s", choice, err, set)}
		}
		resp.Applied = append(resp.Applied, s.describeOffloads(choice, set))
	}
	if req.gro != nil {
		active, err := s.dp.setGRO(*req.gro)
		if err != nil {
			return &Response{Error: err.Error(), Applied: resp.Applied}
		}
		msg := "gro " + onoff.String(*req.gro)
		if *req.gro && !active {
			msg += ", but it stays inactive: the kernel refused a GSO write earlier (sticky until restart)"
		}
		resp.Applied = append(resp.Applied, msg)
	}
	if req.udpGRO != nil {
		active, err := s.dp.setUDPGRO(*req.udpGRO)
		if err != nil {
			return &Response{Error: err.Error(), Applied: resp.Applied}
		}
		msg := "udp-gro " + onoff.String(*req.udpGRO)
		if *req.udpGRO && !active {
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
		if err := s.dp.setCapture(x.side, *x.path); err != nil {
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
	c, probed := s.dp.offloads()
	if req.choice != nil {
		c = *req.choice
	}
	if req.on|req.off == 0 {
		return c, nil
	}
	set := c.Set
	if c.Auto {
		set = datapath.AutoOffloads & probed
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
	_, probed := s.dp.offloads()
	if k := missing &^ probed; k != 0 {
		msg += fmt.Sprintf(" (%s: not offered by this kernel)", k)
	}
	if n := missing & probed; n != 0 {
		msg += fmt.Sprintf(" (%s: left out by negotiation with this port, e.g. tso_ecn for a port that takes TSO without ECN)", n)
	}
	return msg
}

// Serving is how many connections are being served now (at most MaxConns).
func (s *CtlServer) Serving() int { return len(s.slots) }
