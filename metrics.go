package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"tapgro/ops"
)

// promCollector hands package ops' metric catalogue to the Prometheus client: one
// Snapshot of the engine per scrape, every series as a const metric. It describes no
// series up front (an "unchecked" collector), since ops owns the catalogue; Gather still
// checks each scrape for duplicates and inconsistent labels.
type promCollector struct {
	m *ops.Metrics

	mu    sync.Mutex
	descs map[string]*prometheus.Desc // by name and label names
}

func newPromCollector(m *ops.Metrics) *promCollector {
	return &promCollector{m: m, descs: map[string]*prometheus.Desc{}}
}

func (c *promCollector) Describe(chan<- *prometheus.Desc) {}

func (c *promCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m.Collect(func(s *ops.Sample) {
		key := s.Name + "\x00" + strings.Join(s.LabelNames, "\x00")
		d := c.descs[key]
		if d == nil {
			d = prometheus.NewDesc(s.Name, s.Help, s.LabelNames, nil)
			c.descs[key] = d
		}
		switch s.Kind {
		case ops.Histogram:
			ch <- prometheus.MustNewConstHistogram(d, s.Count, s.Sum, s.Buckets, s.LabelValues...)
		case ops.Gauge:
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, s.Value, s.LabelValues...)
		default:
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, s.Value, s.LabelValues...)
		}
	})
}

// serveMetrics serves /metrics and /healthz on addr until the returned func is called.
// health answers /healthz (an *ops.HealthMonitor, or a plain 200 where there is none).
func serveMetrics(addr string, pprofOn bool, m *ops.Metrics, health http.Handler, log *logrus.Logger) (func(), error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(newPromCollector(m)); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/healthz", health)
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
