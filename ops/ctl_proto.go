package ops

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"tapgro/onoff"
	"tapgro/vnethdr"
)

// The control socket's protocol: one request line, parsed here, and one JSON reply
// (Response with its Status). The server is ctl.go, the status builders ctl_status.go.

// Response is the one JSON object each request gets back.
type Response struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// Applied says what each change did, one readable sentence per change.
	Applied []string `json:"applied,omitempty"`
	Status  *Status  `json:"status,omitempty"`
}

// Status is the state after the request.
type Status struct {
	Version       string `json:"version"`
	Sandbox       string `json:"sandbox"` // what package sandbox put in force
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
	// GSOCut are TAP GSO frames cut for a guest that cannot take them whole (UDP GSO for
	// a guest without GUEST_USO4/6).
	GSOCut uint64 `json:"gso_cut"`
	// OffloadChoice is the cap on the TAP's offloads (--offload, `tapgro ctl offload`).
	OffloadChoice string `json:"offload_choice"`
	// Logging: the front-end has dirty logging on (a live migration runs); LogPages the
	// pages marked so far, RARPs the announcements sent after migrations.
	Logging  bool   `json:"migration_log"`
	LogPages uint64 `json:"log_pages"`
	RARPs    uint64 `json:"rarps"`

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

// request is a parsed request line.
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

// ParseRequest parses one request line. Errors quote what the client sent with %q,
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

// parsePcap parses the arguments of a pcap request. Files must be absolute paths:
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
	if on, ok := onoff.Parse(v); ok {
		return on, nil
	}
	return false, fmt.Errorf("%s=%q: want on or off", k, v)
}

// ParseOffloadList is --offload's syntax (vnethdr.ParseChoice) with the request's
// words in its errors.
func ParseOffloadList(s string) (vnethdr.Choice, error) {
	c, err := vnethdr.ParseChoice(s)
	if err != nil {
		return c, fmt.Errorf("offload %q: %w", s, err)
	}
	return c, nil
}

// ReadRequest reads one line of at most MaxRequest bytes. A client that closes
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

// WriteResponse writes r as the one JSON object of a reply.
func WriteResponse(w io.Writer, r *Response) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
