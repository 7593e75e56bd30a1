package ops

import (
	"context"
	"sort"
	"strings"
	"time"

	"tapgro/datapath"
	"tapgro/port"
	"tapgro/rxpool"
)

// Per-packet problems are reported at most once per interval with their counts, never
// per packet: counters are the truth (/metrics), this is for whoever reads only the log.

// ProblemCounts names every per-packet problem counter ("direction/reason") with its
// value in snap. The port's own counters come from ps, nil before a port exists.
func ProblemCounts(snap datapath.Snapshot, ps PortProblemStats) map[string]uint64 {
	m := map[string]uint64{}
	for _, d := range []struct {
		dir string
		st  *datapath.Dir
	}{{"tap_to_port", &snap.TapToPort}, {"port_to_tap", &snap.PortToTap}} {
		for r := datapath.Drop(0); r < datapath.NumDrops; r++ {
			m[d.dir+"/"+r.String()] = d.st.Drops[r]
		}
	}
	for d := rxpool.Drop(0); d < rxpool.NumDrops; d++ {
		m["rx_pool/"+d.String()] = snap.Pool.Drops[d].Load()
	}
	m["port_to_tap/gso_write_fallback"] = snap.PortToTap.GSOFallback
	if ps != nil {
		for k, v := range ps() {
			m["port/"+k] = v
		}
	}
	return m
}

// PortProblemStats returns the port's error counters by reason.
type PortProblemStats func() map[string]uint64

// problemDeltas is what grew between two readings, keyed as log fields
// ("tap_to_port_no_peer"); nil when nothing did.
func problemDeltas(prev, cur map[string]uint64) map[string]uint64 {
	var f map[string]uint64
	for k, v := range cur {
		if v > prev[k] {
			if f == nil {
				f = map[string]uint64{}
			}
			f[strings.ReplaceAll(k, "/", "_")] = v - prev[k]
		}
	}
	return f
}

// kvSorted is m as alternating keys and values, keys sorted.
func kvSorted(m map[string]uint64) []any {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	kv := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		kv = append(kv, k, m[k])
	}
	return kv
}

// ReportProblems logs, at most once per interval and only when something changed, how
// many frames each per-packet problem cost since the last report. Counters are the
// truth (/metrics); this line is for whoever reads only the log.
func ReportProblems(ctx context.Context, every time.Duration, read func() map[string]uint64, log Logger) {
	prev := read()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cur := read()
			if f := problemDeltas(prev, cur); f != nil {
				log.Warn("frames dropped or refused since the last report (counts; see /metrics for totals)",
					append(kvSorted(f), "interval", every)...)
			}
			prev = cur
		}
	}
}

// Problems reads dp's per-packet problem counters, for ReportProblems: every port kind
// has the report.
func Problems(dp Datapath) func() map[string]uint64 { return dp.problems }

// ProblemInterval is the shortest time between two reports of per-packet problems.
const ProblemInterval = 10 * time.Second

// PortProblems reads the port's per-frame error counters.
func PortProblems(ps *port.Stats) PortProblemStats {
	return func() map[string]uint64 {
		return map[string]uint64{
			"bad_length":        ps.BadLength.Load(),
			"truncated":         ps.Truncated.Load(),
			"short_datagram":    ps.ShortDatagram.Load(),
			"oversize_datagram": ps.OversizeDatagram.Load(),
			"send_refused":      ps.SendDrops.Load(),
			"rejected_clients":  ps.Rejects.Load(),
		}
	}
}
