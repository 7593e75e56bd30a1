package ops

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tapgro/datapath"
	"tapgro/datapath/datapathtest"
	"tapgro/tapdev/taptest"
	"tapgro/vnethdr"
)

func TestParseCtlRequest(t *testing.T) {
	on, off := true, false
	good := []struct {
		line    string
		want    request
		choice  string // "" for no whole choice
		onBits  vnethdr.Offloads
		offBits vnethdr.Offloads
	}{
		{line: "status", want: request{status: true}},
		{line: "  status\r", want: request{status: true}},
		{line: "offload auto", choice: "auto"},
		{line: "offload off", choice: "off"},
		{line: "offload none", choice: "off"},
		{line: "offload csum,tso4,tso6", choice: "csum,tso4,tso6"},
		{line: "offload tso4=off csum=on", onBits: oCSUM, offBits: oTSO4},
		{line: "tso4=off tso6=0 ecn=no uso=false", offBits: oTSO4 | oTSO6 | oECN | oUSO},
		{line: "offload csum tso_ecn=off", choice: "csum", offBits: oECN},
		{line: "gro=off", want: request{gro: &off}},
		{line: "udp-gro=on", want: request{udpGRO: &on}},
		{line: "udp_gro=off gro=on tso4=off", want: request{gro: &on, udpGRO: &off}, offBits: oTSO4},
	}
	for _, c := range good {
		r, err := ParseRequest(c.line)
		if err != nil {
			t.Errorf("%q: %v", c.line, err)
			continue
		}
		choice := ""
		if r.choice != nil {
			choice = r.choice.String()
		}
		boolEq := func(a, b *bool) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
		if r.status != c.want.status || choice != c.choice || r.on != c.onBits || r.off != c.offBits ||
			!boolEq(r.gro, c.want.gro) || !boolEq(r.udpGRO, c.want.udpGRO) {
			t.Errorf("%q parsed as %+v (choice %q)", c.line, r, choice)
		}
	}
	bad := []struct{ line, msg string }{
		{"", "empty request"},
		{"   ", "empty request"},
		{"status now", "status takes no arguments"},
		{"offload", "offload: want auto"},
		{"offload tso4", "needs csum"},
		{"offload csum,gso", `unknown offload "gso"`},
		{"offload csum,", `unknown offload ""`},
		{"gro=maybe", `gro="maybe": want on or off`},
		{"gro", `"gro": want status`},
		{"gro=on gro=off", `"gro" is given twice`},
		{"ecn=on tso_ecn=off", `"tso_ecn" is given twice`},
		{"offload gro=off frob=on", `unknown switch "frob"`},
		{"uso4=on", `unknown switch "uso4"`}, // half of a pair the kernel sets only whole
		{"reboot", `"reboot": want status`},
		{"status\x00", `"status\x00": want status`},
	}
	for _, c := range bad {
		if _, err := ParseRequest(c.line); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: err = %v, want one containing %q", c.line, err, c.msg)
		}
	}
}

// newCtlTest is a control server for a real engine on an in-memory TAP whose kernel offers
// every offload, negotiated for a plain port with --offload auto.
func newCtlTest(t testing.TB) (*CtlServer, *datapath.Engine, *taptest.TAP) {
	return newCtlTestProbed(t, oCSUM|oTSO4|oTSO6|oECN|oUSO)
}

func newCtlTestProbed(t testing.TB, probed vnethdr.Offloads) (*CtlServer, *datapath.Engine, *taptest.TAP) {
	eng, tap := datapathtest.NewEngine(t, probed, nil)
	log := &recLogger{t: t}
	if _, fuzz := t.(*testing.F); fuzz {
		log.t = nil // F.Log may not be called from the fuzz function
	}
	return NewCtlServer(engineDatapath(eng), "test", log), eng, tap
}

// The handler changes exactly what each request asks for, refuses bad requests without
// changing anything, and reports the state after the change.
func TestCtlHandle(t *testing.T) {
	s, b, tap := newCtlTest(t)
	all := oCSUM | oTSO4 | oTSO6 | oECN | oUSO
	steps := []struct {
		req     string
		err     string
		mask    vnethdr.Offloads // the TAP's mask afterwards
		choice  string
		gro     bool
		udpGRO  bool
		applied string
	}{
		{req: "status", mask: all, choice: "auto", gro: true, udpGRO: true},
		{req: "offload tso4=off", mask: oCSUM | oTSO6 | oECN | oUSO, choice: "csum,tso6,tso_ecn,uso4,uso6", gro: true, udpGRO: true,
			applied: "the TAP now hands tapgro csum,tso6,tso_ecn,uso4,uso6"},
		{req: "tso6=off", mask: oCSUM | oUSO, choice: "csum,uso4,uso6", gro: true, udpGRO: true},
		{req: "csum=off", err: "without csum", mask: oCSUM | oUSO, choice: "csum,uso4,uso6", gro: true, udpGRO: true},
		{req: "offload off", mask: 0, choice: "off", gro: true, udpGRO: true, applied: "offloads off: the TAP now hands tapgro none"},
		{req: "tso4=on csum=on", mask: oCSUM | oTSO4, choice: "csum,tso4", gro: true, udpGRO: true},
		{req: "gro=off", mask: oCSUM | oTSO4, choice: "csum,tso4", gro: false, udpGRO: true, applied: "gro off"},
		// A bad request in the middle of good ones changes nothing at all.
		{req: "gro=on frob=1", err: "unknown switch", mask: oCSUM | oTSO4, choice: "csum,tso4", gro: false, udpGRO: true},
		{req: "udp-gro=off gro=on", mask: oCSUM | oTSO4, choice: "csum,tso4", gro: true, udpGRO: false},
		{req: "offload auto", mask: all, choice: "auto", gro: true, udpGRO: false},
		{req: "udp-gro=on", mask: all, choice: "auto", gro: true, udpGRO: true,
			applied: "udp-gro on, but it is inactive: it needs gro on and a TAP that accepts USO on write"},
	}
	for _, st := range steps {
		resp := s.handle(st.req, nil)
		if st.err != "" {
			if resp.OK || !strings.Contains(resp.Error, st.err) || resp.Status != nil {
				t.Errorf("%q: %+v, want an error containing %q", st.req, resp, st.err)
			}
		} else if !resp.OK || resp.Status == nil {
			t.Fatalf("%q: %+v", st.req, resp)
		}
		if got := tap.Offloads(); got != st.mask {
			t.Errorf("%q: TAP mask %s, want %s", st.req, got, st.mask)
		}
		status := s.status()
		if status.OffloadChoice != st.choice || status.TapOffloads != st.mask.String() || status.GRO != st.gro || status.UDPGRO != st.udpGRO {
			t.Errorf("%q: status choice %s offloads %s gro %v udp-gro %v; want %s %s %v %v",
				st.req, status.OffloadChoice, status.TapOffloads, status.GRO, status.UDPGRO, st.choice, st.mask, st.gro, st.udpGRO)
		}
		n := b.Snapshot().Negotiation
		if status.Negotiated != n.String() || !strings.HasPrefix(status.Negotiated, "tap offloads="+st.mask.String()+" ") {
			t.Errorf("%q: status negotiated %q; engine %q", st.req, status.Negotiated, n)
		}
		if (n.P2T&datapath.StepGRO != 0) != st.gro {
			t.Errorf("%q: the GRO engine's TCP coalescing does not follow gro=%v", st.req, st.gro)
		}
		if st.applied != "" && !strings.Contains(strings.Join(resp.Applied, "\n"), st.applied) {
			t.Errorf("%q: applied %q, want it to say %q", st.req, resp.Applied, st.applied)
		}
	}
}

// An offload the kernel does not offer is named as such in the reply.
func TestCtlHandleUnsupported(t *testing.T) {
	s, _, tap := newCtlTestProbed(t, oCSUM|oTSO4|oTSO6|oECN) // a kernel before 6.2: no USO
	resp := s.handle("offload csum,tso4,uso", nil)
	if !resp.OK || tap.Offloads() != oCSUM|oTSO4 || !strings.Contains(resp.Applied[0], "uso4,uso6: not offered by this kernel") {
		t.Fatalf("%+v; TAP mask %s", resp, tap.Offloads())
	}
}

// Counters and the port's state reach the status reply.
func TestCtlStatusCounters(t *testing.T) {
	e := datapathtest.NewStub()
	e.Snap.Connected, e.Snap.Peer = true, "unix:/test.sock pid=1"
	e.Snap.TapToPort.Frames, e.Snap.TapToPort.Bytes = 7, 7000
	e.Snap.TapToPort.Drops[datapath.DropNoPeer] = 2
	e.Snap.PortToTap.Reads = 40
	e.Snap.PortToTap.Drops[datapath.DropTapEIO] = 1
	e.Snap.GRO.Segments.Add(40)
	e.Snap.GRO.Packets.Add(2)
	s := NewCtlServer(engineDatapath(e), "test", datapath.NopLogger{})
	st := s.status()
	c := st.Counters
	if !st.PortConnected || c.TapToPort.Frames != 7 || c.TapToPort.Bytes != 7000 || c.TapToPort.Dropped != 2 ||
		c.PortToTap.Reads != 40 || c.PortToTap.Dropped != 1 || c.GROSegments != 40 || c.GROPackets != 2 {
		t.Fatalf("status %+v", st)
	}
	var out bytes.Buffer
	WriteStatus(&out, st)
	for _, want := range []string{"negotiated:         tap offloads=", "gro coalesced:      40 segments into 2 packets (20.0 per packet)",
		"tap->port:          7 frames, 7000 bytes (read 0, dropped 2)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}
}

// A client that connects and sends nothing is cut off by the deadline with an error.
func TestCtlReadDeadline(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	b.SetDeadline(time.Now().Add(time.Millisecond))
	if _, err := ReadRequest(b); err == nil || !strings.Contains(err.Error(), "no complete request line") {
		t.Fatalf("err = %v", err)
	}
}

// FuzzCtlRequest: no request line crashes the handler, and one that does not parse
// changes nothing.
func FuzzCtlRequest(f *testing.F) {
	for _, s := range []string{"status", "offload auto", "offload tso4=off csum=on", "gro=off udp-gro=on",
		"offload csum,tso4,tso6,tso_ecn,uso", "csum=off", "offload off tso4=on", "udp_gro=1 ecn=0", "\x00=\xff", "=", "offload ="} {
		f.Add(s)
	}
	s, b, tap := newCtlTest(f)
	f.Fuzz(func(t *testing.T, line string) {
		before := s.status()
		mask := tap.Offloads()
		resp := s.handle(line, nil)
		if _, err := json.Marshal(resp); err != nil {
			t.Fatal(err)
		}
		if _, err := ParseRequest(line); err != nil {
			after := s.status()
			if resp.OK || after.Negotiated != before.Negotiated || after.GRO != before.GRO || after.UDPGRO != before.UDPGRO ||
				after.OffloadChoice != before.OffloadChoice || tap.Offloads() != mask {
				t.Fatalf("%q failed to parse (%v) but changed the state", line, err)
			}
		}
		_ = b
	})
}

func TestParseCtlPcap(t *testing.T) {
	str := func(s string) *string { return &s }
	for _, c := range []struct {
		line      string
		tap, port *string
		err       string
	}{
		{line: "pcap tap=/tmp/t.pcap", tap: str("/tmp/t.pcap")},
		{line: "pcap port=off", port: str("")},
		{line: "pcap tap=off port=/var/tmp/../tmp/p.pcap", tap: str(""), port: str("/var/tmp/p.pcap")},
		{line: "pcap", err: "want tap=FILE|off"},
		{line: "pcap tap=rel.pcap", err: "absolute path"},
		{line: "pcap guest=/x", err: "unknown side"},
		{line: "pcap tap=/x tap=off", err: "given twice"},
		{line: "pcap tap=/x port=/x", err: "its own file"},
		{line: "pcap tap", err: "want tap=FILE|off"},
		{line: "pcap tap=", err: "want tap=FILE|off"},
	} {
		r, err := ParseRequest(c.line)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one with %q", c.line, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.line, err)
			continue
		}
		eq := func(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
		if !eq(r.pcapTap, c.tap) || !eq(r.pcapPort, c.port) || r.editsOffloads() || r.gro != nil {
			t.Errorf("%q: parsed %+v", c.line, r)
		}
	}
}

// pcap requests switch capture at run time and show in status; a file the other side
// already writes is refused and changes nothing.
func TestCtlPcap(t *testing.T) {
	s, b, _ := newCtlTest(t)
	dir := t.TempDir()
	tapFile, portFile := filepath.Join(dir, "tap.pcap"), filepath.Join(dir, "port.pcap")
	resp := s.handle("pcap tap="+tapFile+" port="+portFile, nil)
	if !resp.OK || len(resp.Applied) != 2 {
		t.Fatalf("start: %+v", resp)
	}
	if st := b.Snapshot().CaptureTap.State; !strings.HasPrefix(st, tapFile+" ") {
		t.Fatalf("tap capture %q, want %s", st, tapFile)
	}
	if !strings.HasPrefix(resp.Status.PcapTap, tapFile+" (0 frames") || !strings.HasPrefix(resp.Status.PcapPort, portFile) {
		t.Errorf("status pcap_tap %q pcap_port %q", resp.Status.PcapTap, resp.Status.PcapPort)
	}
	if resp := s.handle("pcap port="+tapFile, nil); resp.OK || !strings.Contains(resp.Error, "own file") {
		t.Errorf("same file for both sides: %+v", resp)
	}
	if st := b.Snapshot().CapturePort.State; !strings.HasPrefix(st, portFile+" ") {
		t.Errorf("a refused switch changed the port capture to %q", st)
	}
	if resp := s.handle("pcap tap=/nonexistent-dir/x.pcap", nil); resp.OK {
		t.Errorf("a file that cannot be created: %+v", resp)
	}
	if st := b.Snapshot().CaptureTap.State; !strings.HasPrefix(st, tapFile+" ") {
		t.Errorf("a failed switch lost the tap capture: %q", st)
	}
	resp = s.handle("pcap tap=off port=off", nil)
	if !resp.OK || resp.Status.PcapTap != "off" || resp.Status.PcapPort != "off" {
		t.Fatalf("stop: %+v", resp)
	}
	if snap := b.Snapshot(); snap.CaptureTap.State != "off" || snap.CapturePort.State != "off" {
		t.Fatal("capture still on after pcap tap=off port=off")
	}
	for _, f := range []string{tapFile, portFile} {
		if fi, err := os.Stat(f); err != nil || fi.Size() != 24 || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v; want an empty capture (file header only), mode 0600", f, fi, err)
		}
	}
}
