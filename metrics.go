package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"tapgro/datapath"
	"tapgro/netdev"
)

// The packet path keeps plain atomic counters; this collector reads them only when
// Prometheus scrapes, so metrics cost the datapath nothing but the atomic adds.

type metric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(*datapath.Snapshot) float64
	label []string
}

type collector struct {
	metrics []metric
	// custom series that are not a single value (histograms).
	customDesc []*prometheus.Desc
	custom     []func(*datapath.Snapshot) prometheus.Metric

	eng snapshotter // read once per scrape
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics {
		ch <- m.desc
	}
	for _, d := range c.customDesc {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	snap := c.eng.Snapshot()
	for _, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.kind, m.value(&snap), m.label...)
	}
	for _, f := range c.custom {
		if m := f(&snap); m != nil {
			ch <- m
		}
	}
}

// add registers one series. Series of the same name with different label values share a
// Desc, as the client library requires.
func (c *collector) add(name, help string, kind prometheus.ValueType, labels prometheus.Labels, v func(*datapath.Snapshot) float64) {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	vals := make([]string, len(keys))
	for i, k := range keys {
		vals[i] = labels[k]
	}
	for _, m := range c.metrics {
		if m.desc.String() == prometheus.NewDesc(name, help, keys, nil).String() {
			c.metrics = append(c.metrics, metric{desc: m.desc, kind: kind, value: v, label: vals})
			return
		}
	}
	c.metrics = append(c.metrics, metric{desc: prometheus.NewDesc(name, help, keys, nil), kind: kind, value: v, label: vals})
}

func u(f func() uint64) func(*datapath.Snapshot) float64 {
	return func(*datapath.Snapshot) float64 { return float64(f()) }
}

// snapU is a counter read from the scrape's Snapshot.
func snapU(f func(*datapath.Snapshot) uint64) func(*datapath.Snapshot) float64 {
	return func(s *datapath.Snapshot) float64 { return float64(f(s)) }
}

// newCollector lists every metric tapgro exports. The README documents each name.
func newCollector(eng snapshotter, ep netdev.Endpoint) *collector {
	c := &collector{eng: eng}
	for _, d := range []struct {
		dir string
		st  func(*datapath.Snapshot) *datapath.Dir
	}{
		{"tap_to_port", func(s *datapath.Snapshot) *datapath.Dir { return &s.TapToPort }},
		{"port_to_tap", func(s *datapath.Snapshot) *datapath.Dir { return &s.PortToTap }},
	} {
		l := prometheus.Labels{"direction": d.dir}
		st := d.st
		c.add("tapgro_frames_total", "Frames (or GSO packets, towards the TAP) delivered to the far side.", prometheus.CounterValue, l, snapU(func(s *datapath.Snapshot) uint64 { return st(s).Frames }))
		c.add("tapgro_bytes_total", "Ethernet bytes delivered to the far side.", prometheus.CounterValue, l, snapU(func(s *datapath.Snapshot) uint64 { return st(s).Bytes }))
		c.add("tapgro_read_frames_total", "Frames read from the near side.", prometheus.CounterValue, l, snapU(func(s *datapath.Snapshot) uint64 { return st(s).Reads }))
		c.add("tapgro_batches_total", "Read batches processed.", prometheus.CounterValue, l, snapU(func(s *datapath.Snapshot) uint64 { return st(s).Batches }))
		for r := datapath.Drop(0); r < datapath.NumDrops; r++ {
			c.add("tapgro_dropped_total", "Frames dropped, by reason.", prometheus.CounterValue,
				prometheus.Labels{"direction": d.dir, "reason": r.String()}, snapU(func(s *datapath.Snapshot) uint64 { return st(s).Drops[r] }))
		}
	}
	c.add("tapgro_gso_segmented_total", "GSO frames from the TAP split in software for the port.", prometheus.CounterValue, nil,
		snapU(func(s *datapath.Snapshot) uint64 { return s.TapToPort.GSOSegmented }))
	c.add("tapgro_csum_completed_total", "Partial checksums from the TAP completed in software.", prometheus.CounterValue, nil,
		snapU(func(s *datapath.Snapshot) uint64 { return s.TapToPort.CsumCompleted }))
	c.add("tapgro_gro_gso_write_fallback_total", "GSO writes the kernel refused (EINVAL) and that were re-sent segmented.", prometheus.CounterValue, nil,
		snapU(func(s *datapath.Snapshot) uint64 { return s.PortToTap.GSOFallback }))
	c.add("tapgro_port_connected", "1 while a peer is connected to the port.", prometheus.GaugeValue, nil,
		func(s *datapath.Snapshot) float64 { return b2f(s.Connected) })
	for _, side := range []struct {
		name string
		c    func(*datapath.Snapshot) *datapath.Capture
	}{
		{"tap", func(s *datapath.Snapshot) *datapath.Capture { return &s.CaptureTap }},
		{"port", func(s *datapath.Snapshot) *datapath.Capture { return &s.CapturePort }},
	} {
		l := prometheus.Labels{"side": side.name}
		get := side.c
		c.add("tapgro_pcap_frames_total", "Frames written to the capture file, by side.", prometheus.CounterValue, l,
			snapU(func(s *datapath.Snapshot) uint64 { return get(s).Frames }))
		c.add("tapgro_pcap_dropped_total", "Frames the capture could not write (file error, size cap without rotation), by side.", prometheus.CounterValue, l,
			snapU(func(s *datapath.Snapshot) uint64 { return get(s).Dropped }))
	}
	addCoalescerMetrics(c)
	addDeviceMetrics(c, eng, ep)
	addRxPoolMetrics(c)
	addOffloadMetrics(c, ep)
	c.add("tapgro_build_info", "Build version.", prometheus.GaugeValue, prometheus.Labels{"version": version}, func(*datapath.Snapshot) float64 { return 1 })
	start := float64(time.Now().Unix())
	c.add("tapgro_start_time_seconds", "Process start time (Unix seconds).", prometheus.GaugeValue, nil, func(*datapath.Snapshot) float64 { return start })
	return c
}

// serveMetrics serves /metrics and /healthz (health.go) on addr until the returned func
// is called.
func serveMetrics(addr string, pprofOn bool, eng snapshotter, ep netdev.Endpoint, h *healthMon, log *logrus.Logger) (func(), error) {
	reg := prometheus.NewRegistry()
	c := newCollector(eng, ep)
	addHealthMetrics(c, h)
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/healthz", h)
	if pprofOn {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.WithError(err).Error("metrics server stopped")
		}
	}()
	log.WithField("addr", ln.Addr().String()).Info("serving /metrics")
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, nil
}
