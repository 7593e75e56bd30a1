package ops

import (
	"runtime"
	"sort"
	"time"

	"tapgro/datapath"
	"tapgro/port"
)

// The metric catalogue: every series tapgro exports, each a name, help text, labels and
// a value read from one Snapshot of the engine (plus the port's own counters) per
// scrape. The packet path keeps plain atomic counters, so metrics cost the datapath
// nothing but the atomic adds. This package describes the series; package main hands
// them to the Prometheus client, the only place that imports it.

// Kind is a series' type.
type Kind uint8

const (
	Counter Kind = iota
	Gauge
	Histogram
)

// Labels name a series within its family.
type Labels map[string]string

// Sample is one series' value at a scrape.
type Sample struct {
	Name, Help  string
	Kind        Kind
	LabelNames  []string // sorted
	LabelValues []string // in LabelNames' order
	Value       float64  // Counter and Gauge

	// Histogram: cumulative counts per upper bound, the total count and the sum.
	Buckets map[float64]uint64
	Count   uint64
	Sum     float64
}

// Source is what one scrape reads: the engine's Snapshot and the port's counters.
type Source struct {
	Snap *datapath.Snapshot
	Port *port.Stats
}

type series struct {
	name, help string
	kind       Kind
	keys, vals []string
	value      func(*Source) float64
}

// Metrics is the catalogue for one running tapgro.
type Metrics struct {
	// snapshot takes the engine's Snapshot once per scrape (nil: the kind has none).
	snapshot func() datapath.Snapshot
	port     *port.Stats
	// portCounters are the transport's own (port.CounterSource), exported as they come.
	portCounters []port.Counter
	series       []series
	custom       []func(*Source) *Sample // series that are not a single value, or may be absent
}

func (m *Metrics) add(name, help string, kind Kind, labels Labels, v func(*Source) float64) {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	vals := make([]string, len(keys))
	for i, k := range keys {
		vals[i] = labels[k]
	}
	m.series = append(m.series, series{name: name, help: help, kind: kind, keys: keys, vals: vals, value: v})
}

// Collect takes one Snapshot and hands every series to emit.
func (m *Metrics) Collect(emit func(*Sample)) {
	src := &Source{Port: m.port}
	if m.snapshot != nil {
		snap := m.snapshot()
		src.Snap = &snap
	}
	var s Sample
	for i := range m.series {
		d := &m.series[i]
		s = Sample{Name: d.name, Help: d.help, Kind: d.kind, LabelNames: d.keys, LabelValues: d.vals, Value: d.value(src)}
		emit(&s)
	}
	for _, f := range m.custom {
		if c := f(src); c != nil {
			emit(c)
		}
	}
}

// addProcess adds the series about the process itself, the same for every datapath.
func (m *Metrics) addProcess(version string) {
	m.add("tapgro_build_info", "Build version.", Gauge, Labels{"version": version}, func(*Source) float64 { return 1 })
	start := float64(time.Now().Unix())
	m.add("tapgro_start_time_seconds", "Process start time (Unix seconds).", Gauge, nil, func(*Source) float64 { return start })
	m.add("tapgro_gomaxprocs", "Threads that may run tapgro's code at once (GOMAXPROCS): --procs, or what the load scaler set.", Gauge, nil, func(*Source) float64 { return float64(runtime.GOMAXPROCS(0)) })
}

// u reads a counter that is not the engine's (the port's own, through the Source).
func u(f func() uint64) func(*Source) float64 {
	return func(*Source) float64 { return float64(f()) }
}

// snapU is a counter read from the scrape's Snapshot.
func snapU(f func(*datapath.Snapshot) uint64) func(*Source) float64 {
	return func(s *Source) float64 { return float64(f(s.Snap)) }
}

func b2f(v bool) float64 {
	if v {
		return 1
	}
	return 0
}

// NewMetrics is the catalogue for dp: the families every port kind shares, the kind's
// own, the stall gauges of health (nil: none) and the process's. version is tapgro's.
func NewMetrics(dp Datapath, health *HealthMonitor, version string) *Metrics {
	m := &Metrics{}
	dp.catalogue(m)
	if health != nil {
		m.addStalled(health)
	}
	m.addProcess(version)
	return m
}
