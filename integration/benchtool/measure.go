package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"tapgro/iperfns"
)

// The measurements: iperf3 throughput and ping round trips, and the rows that hold a
// case's results (rrRow: the QEMU ping-pong's).

// rrRow is one QEMU case's ping-pong round trips, all runs together.
type rrRow struct {
	name  string
	rtts  []float64 // µs
	calls uint64    // calls to the guest over the runs (boot included)
	err   error
}

func (r *rrRow) pct(p float64) float64 {
	v := append([]float64(nil), r.rtts...)
	sort.Float64s(v)
	return v[min(len(v)-1, int(float64(len(v))*p/100))]
}

func (r *rrRow) mean() float64 {
	t := 0.0
	for _, x := range r.rtts {
		t += x
	}
	return t / float64(len(r.rtts))
}

// row is one case's measurements in one test and direction. A row that failed keeps
// its error and is reported as failed, never as a number.
type row struct {
	vals []float64
	cpu  string
	err  error
}

func (r *row) stats() (med, lo, hi float64) {
	v := append([]float64(nil), r.vals...)
	sort.Float64s(v)
	n := len(v)
	med = v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return med, v[0], v[n-1]
}

func fmtVals(v []float64) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return "[" + strings.Join(s, " ") + "]"
}

func (b *bench) iperf(d direction, args ...string) ([]byte, error) {
	return iperfns.Run(d.server, d.client, d.dst, args...)
}

func (b *bench) iperfTCP(d direction, streams int) (float64, error) {
	out, err := b.iperf(d, "-t", strconv.Itoa(b.secs), "-P", strconv.Itoa(streams))
	if err != nil {
		return 0, err
	}
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, err
	}
	if r.Error != "" || r.End.SumReceived.BitsPerSecond == 0 {
		return 0, fmt.Errorf("iperf3 reported no throughput (error %q)", r.Error)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, nil
}

// iperfUDP64 returns thousands of 64-byte datagrams per second that arrived.
func (b *bench) iperfUDP64(d direction) (float64, error) {
	out, err := b.iperf(d, "-u", "-l", "64", "-b", "0", "-t", strconv.Itoa(b.secs))
	if err != nil {
		return 0, err
	}
	var r struct {
		End struct {
			Sum struct {
				Packets     float64 `json:"packets"`
				LostPackets float64 `json:"lost_packets"`
				Seconds     float64 `json:"seconds"`
			} `json:"sum"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, err
	}
	if r.End.Sum.Seconds == 0 {
		return 0, fmt.Errorf("iperf3 UDP: no summary")
	}
	return (r.End.Sum.Packets - r.End.Sum.LostPackets) / r.End.Sum.Seconds / 1e3, nil
}

var rttRe = regexp.MustCompile(`= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms`)

// pingRTT returns the mean round-trip time of 200 pings 5 ms apart, in µs: one small
// request and its answer crossing both relays each way.
func (b *bench) pingRTT(d direction) (float64, error) {
	out, err := exec.Command("ip", "netns", "exec", d.client, "ping", "-q", "-c", "200", "-i", "0.005", d.dst).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("ping: %v: %s", err, out)
	}
	m := rttRe.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("ping output: %s", out)
	}
	avg, _ := strconv.ParseFloat(string(m[2]), 64)
	return avg * 1000, nil
}
