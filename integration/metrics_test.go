//go:build linux

package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"tapgro/integration/netnstest"
)

// Tests read tapgro's counters from its /metrics endpoint, as an operator would, not
// from its log. Each tapgro runs in a namespace of its own, so every one can listen on
// the same loopback address.
const metricsAddr = "127.0.0.1:9187"

// The series the tests read most, named as /metrics exposes them (the exit summary's
// field in parentheses).
const (
	mT2PFrames      = `tapgro_frames_total{direction="tap_to_port"}`                      // tap_to_port_frames
	mP2TReads       = `tapgro_read_frames_total{direction="port_to_tap"}`                 // port_to_tap_reads
	mP2TFrames      = `tapgro_frames_total{direction="port_to_tap"}`                      // port_to_tap_frames
	mT2PPassthrough = `tapgro_gso_passthrough_total{direction="tap_to_port"}`             // tap_to_port_gso_passthrough
	mP2TPassthrough = `tapgro_gso_passthrough_total{direction="port_to_tap"}`             // port_to_tap_gso_passthrough
	mT2PSegmented   = `tapgro_gso_segmented_total`                                        // tap_to_port_gso_segmented
	mT2PShm         = `tapgro_shm_frames_total{direction="tap_to_port"}`                  // tap_to_port_shm
	mP2TShm         = `tapgro_shm_frames_total{direction="port_to_tap"}`                  // port_to_tap_shm
	mP2TMalformed   = `tapgro_dropped_total{direction="port_to_tap",reason="malformed"}`  // port_to_tap_malformed
	mT2PPortError   = `tapgro_dropped_total{direction="tap_to_port",reason="port_error"}` // tap_to_port_port_error
	mGROSegments    = `tapgro_gro_segments_total`                                         // gro_segments
	mGROPackets     = `tapgro_gro_packets_total`                                          // gro_packets
	mGROGSOPackets  = `tapgro_gro_gso_packets_total`                                      // gro_gso_packets
	mTapEINVAL      = `tapgro_tap_write_errors_total{errno="EINVAL"}`                     // tap_write_einval
	mGSOFallback    = `tapgro_gro_gso_write_fallback_total`                               // gso_write_fallback
)

// samples is one scrape: every sample keyed by name plus labels as exposed, e.g.
// `tapgro_frames_total{direction="tap_to_port"}`.
type samples map[string]float64

// get is the value of one series. tapgro exports every series it has from the start,
// so one missing from the scrape is a misspelt name, which must not read as 0.
func (m samples) get(t testing.TB, key string) float64 {
	t.Helper()
	v, ok := m[key]
	if !ok {
		t.Fatalf("metric %s missing from the scrape", key)
	}
	return v
}

// pick is the named series, for logs and failure messages.
func (m samples) pick(t testing.TB, keys ...string) map[string]float64 {
	t.Helper()
	out := make(map[string]float64, len(keys))
	for _, k := range keys {
		out[k] = m.get(t, k)
	}
	return out
}

// scrape reads tapgro's /metrics from inside ns (a raw HTTP/1.0 request over a socket
// made in the namespace; an http.Client would dial from another thread).
func scrape(t testing.TB, ns *netnstest.NS, addr string) samples {
	t.Helper()
	m, err := fetchSamples(ns, addr)
	if err != nil {
		t.Fatalf("metrics at %s in %s: %v", addr, ns.Name, err)
	}
	return m
}

// scrapeQuiet is scrape for goroutines other than the test's: errors give an empty map.
func scrapeQuiet(ns *netnstest.NS, addr string) samples {
	m, err := fetchSamples(ns, addr)
	if err != nil {
		return samples{}
	}
	return m
}

func fetchSamples(ns *netnstest.NS, addr string) (samples, error) {
	var c net.Conn
	if err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", addr, 5*time.Second)
		return err
	}); err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", addr)
	body, err := io.ReadAll(c)
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return parseSamples(string(body)), nil
}

// parseSamples reads the Prometheus text format's sample lines (ops_test.go checks the
// same output with the Prometheus parser itself).
func parseSamples(body string) samples {
	out := samples{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			out[l[:i]] = v
		}
	}
	return out
}

var exitLineRe = regexp.MustCompile(`tapgro exiting`)

// exitSummary reads the numbers from tapgro's exit line ("tapgro exiting" with
// key=value counters, built from the engine's last Snapshot). Only for counters that
// are final at exit alone — a shutdown's drain, capture files closed — since the
// metrics server stops with the process.
func exitSummary(t testing.TB, p *proc) map[string]uint64 {
	t.Helper()
	var line string
	for _, l := range strings.Split(p.out.String(), "\n") {
		if exitLineRe.MatchString(l) {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("%s logged no exit summary:\n%s", p.name, p.out.String())
	}
	m := map[string]uint64{}
	for _, kv := range regexp.MustCompile(`([a-z_0-9]+)=(\d+)`).FindAllStringSubmatch(line, -1) {
		v, _ := strconv.ParseUint(kv[2], 10, 64)
		m[kv[1]] = v
	}
	return m
}
