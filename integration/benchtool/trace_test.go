package main

import (
	"strings"
	"testing"
)

// TestTraceReport: TCP counts are divided by the gigabytes received, the ping-pong's by
// its round trips (warm-up included), summed over rounds; a round whose client failed
// (no round trips) adds no units, and a test nobody traced has no table.
func TestTraceReport(t *testing.T) {
	k := key{flav: "f", be: beVhostUser}
	rt := float64(rrRounds + rrWarm)
	round := func(rtts []float64) map[string]*guestResult {
		return map[string]*guestResult{
			"tcp-g2h": {gigabytes: 2, traceTG: map[string]float64{"readv": 4000}, traceQ: map[string]float64{"read": 1000},
				vc: vhostCounters{kicks: 600}},
			"tcp-rr": {rtts: rtts, traceTG: map[string]float64{"ctx switches": 2 * rt}, traceQ: map[string]float64{"ctx switches": rt},
				vc: vhostCounters{calls: rt}},
		}
	}
	out := traceReport([]key{k}, map[key][]map[string]*guestResult{k: {round([]float64{100}), round([]float64{90})}})
	for _, want := range []string{
		"### TCP guest -> host: per GB received",
		"| f | tapgro vhost-user | tapgro | 0 | 2000 |",    // readv: 8000 over 4 GB
		"| f | tapgro vhost-user | QEMU, not vCPU | 500 |", // read: 2000 over 4 GB
		"### TCP 1-byte ping-pong, host -> guest: per round trip",
		"| 300 | 0 |\n", // kicks: 1200 over 4 GB, no calls
		"| 2.00 | 0.00 | 0.00 | 0.00 | 0.00 | 1.00 |\n", // ctx switches 2, ..., calls 1 per round trip
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "TCP host -> guest") {
		t.Errorf("a table for a test nobody traced:\n%s", out)
	}
	// A failed client's round adds counts but no round trips: excluded from the divisor.
	out = traceReport([]key{k}, map[key][]map[string]*guestResult{k: {round(nil)}})
	if strings.Contains(out, "per round trip\n") {
		t.Errorf("a ping-pong table with no round trips:\n%s", out)
	}
}
