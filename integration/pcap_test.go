//go:build linux

package integration

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

var tcpdumpLenRe = regexp.MustCompile(`, length (\d+):`)

// tcpdumpRead decodes a capture file with tcpdump and returns its lines and each
// frame's length (from -e: the Ethernet frame's true length, not the captured one).
func tcpdumpRead(t *testing.T, path string) (lines []string, lens []int) {
	t.Helper()
	out, err := exec.Command("tcpdump", "-r", path, "-nn", "-e").Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("tcpdump -r %s: %v\n%s", path, err, msg)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" {
			continue
		}
		m := tcpdumpLenRe.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("tcpdump line without a frame length: %q", l)
		}
		n, _ := strconv.Atoi(m[1])
		lines = append(lines, l)
		lens = append(lens, n)
	}
	return lines, lens
}

// TestPcapCapture runs tapgro A with both captures during pings and a short transfer
// each way, and reads the files back with tcpdump: they decode, the pings are there,
// the TAP side holds GSO super-frames and the port side only MTU frames, and the
// record counts equal the exit summary's counters.
func TestPcapCapture(t *testing.T) {
	netnstest.RequirePriv(t)
	requireTool(t, "tcpdump")
	s := newPair(t, backends[0])
	// A restarted with capture (newPair's extra flags would go to both processes, and
	// the two must not write the same files).
	tapFile, portFile := filepath.Join(s.dir, "tap.pcap"), filepath.Join(s.dir, "port.pcap")
	s.pa.kill()
	s.pa = startTapgro(t, s.a, "tapgro A (pcap)", append(s.argsA, "--pcap-tap", tapFile, "--pcap-port", portFile)...)
	s.pa.waitLog(readyRe, 10*time.Second)
	s.pingAll(t)
	transfer(t, s.a, s.b, "198.18.0.2", 7101, 8<<20)
	transfer(t, s.b, s.a, "198.18.0.1", 7102, 8<<20)
	// The counters are read from the exit line, not /metrics: only once A has stopped
	// are its capture files flushed and closed, and do the pipelines stop counting, so
	// file, capture counters and pipeline counters can be compared exactly. The metrics
	// server stops with the process.
	s.pa.stop()
	sum := exitSummary(t, s.pa)

	for _, c := range []struct {
		side, file string
		want       uint64 // what the pipelines counted crossing that side
	}{
		{"tap", tapFile, sum["tap_to_port_reads"] + sum["port_to_tap_frames"]},
		{"port", portFile, sum["tap_to_port_frames"] + sum["port_to_tap_reads"]},
	} {
		lines, lens := tcpdumpRead(t, c.file)
		got := sum["pcap_"+c.side+"_frames"]
		if uint64(len(lines)) != got || got != c.want || sum["pcap_"+c.side+"_dropped"] != 0 {
			t.Errorf("%s capture: tcpdump decodes %d frames; summary pcap_%s_frames=%d dropped=%d; pipelines counted %d",
				c.side, len(lines), c.side, got, sum["pcap_"+c.side+"_dropped"], c.want)
		}
		all := strings.Join(lines, "\n")
		for _, want := range []string{"198.18.0.1 > 198.18.0.2: ICMP echo request", "198.18.0.2 > 198.18.0.1: ICMP echo reply",
			"198.18.0.2 > 198.18.0.1: ICMP echo request", "198.18.0.1 > 198.18.0.2: ICMP echo reply"} {
			if !strings.Contains(all, want) {
				t.Errorf("%s capture lacks %q", c.side, want)
			}
		}
		big, longest := 0, 0
		for _, n := range lens {
			if n > 1514 {
				big++
			}
			longest = max(longest, n)
		}
		t.Logf("%s capture: %d frames, %d over 1514 bytes, longest %d", c.side, len(lens), big, longest)
		switch {
		case c.side == "tap" && big == 0:
			t.Errorf("tap capture has no GSO super-frame (nothing over 1514 bytes)")
		case c.side == "port" && big != 0:
			t.Errorf("port capture has %d frames over 1514 bytes (longest %d); the port carries MTU frames", big, longest)
		}
	}
}
