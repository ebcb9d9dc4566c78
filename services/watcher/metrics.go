package watcher

import (
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/volplane/volplane/pkg/metrics"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

var (
	eventsDesc = prometheus.NewDesc("volplane_watcher_events_total",
		"Events appended to the watcher's log.", []string{"kind", "type"}, nil)
	sequenceDesc = prometheus.NewDesc("volplane_watcher_sequence",
		"Sequence number of the newest event.", nil, nil)
	historyDesc = prometheus.NewDesc("volplane_watcher_history_events",
		"Events kept for subscribers that resume.", nil, nil)
	objectsDesc = prometheus.NewDesc("volplane_watcher_objects",
		"Objects in the watcher's current state.", []string{"kind"}, nil)
	subscribersDesc = prometheus.NewDesc("volplane_watcher_subscribers",
		"Streams open now.", nil, nil)
	watchOpenDesc = prometheus.NewDesc("volplane_watcher_api_watch_open",
		"Whether the informer of the resource holds an open watch on the API server (1) or not (0).", []string{"resource"}, nil)
	probeFailingDesc = prometheus.NewDesc("volplane_watcher_api_probe_failing",
		"Whether the API server's /readyz has been failing for more than 3s (1) or answers (0); readiness follows the watches.", nil, nil)
)

// collector reports the hub and the API server's state at scrape time.
type collector struct {
	h   *hub
	api *apiHealth // nil: not reported
}

// reporting is the watcher whose state /metrics reports: one per process
// in production; tests that run several in one process see the first.
// Registered once, so that the metrics are described before a watcher
// runs (docs/metrics.md is checked against them).
var reporting atomic.Pointer[collector]

type reportingCollector struct{}

func init() { metrics.Registry.MustRegister(reportingCollector{}) }

func (reportingCollector) Describe(ch chan<- *prometheus.Desc) { collector{}.Describe(ch) }

func (reportingCollector) Collect(ch chan<- prometheus.Metric) {
	if c := reporting.Load(); c != nil {
		c.Collect(ch)
	}
}

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{eventsDesc, sequenceDesc, historyDesc, objectsDesc, subscribersDesc, watchOpenDesc, probeFailingDesc} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	h := c.h
	h.mu.Lock()
	counts := h.appended
	head, stored, subs := h.head, h.stored, h.subscribers
	objects := map[watcherv1.Kind]int{}
	for k, m := range h.state {
		objects[k] = len(m)
	}
	h.mu.Unlock()
	name := func(s string, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }
	for k := range counts {
		for t, n := range counts[k] {
			if n > 0 {
				ch <- prometheus.MustNewConstMetric(eventsDesc, prometheus.CounterValue, float64(n),
					name(watcherv1.Kind(k).String(), "KIND_"), name(watcherv1.EventType(t).String(), "EVENT_TYPE_"))
			}
		}
	}
	for k, n := range objects {
		ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(n), name(k.String(), "KIND_"))
	}
	ch <- prometheus.MustNewConstMetric(sequenceDesc, prometheus.GaugeValue, float64(head))
	ch <- prometheus.MustNewConstMetric(historyDesc, prometheus.GaugeValue, float64(stored))
	ch <- prometheus.MustNewConstMetric(subscribersDesc, prometheus.GaugeValue, float64(subs))
	if c.api == nil {
		return
	}
	c.api.mu.Lock()
	watches := make(map[string]*watchState, len(c.api.watches))
	for n, w := range c.api.watches {
		watches[n] = w
	}
	c.api.mu.Unlock()
	for n, w := range watches {
		open := 0.0
		if w.get().open > 0 {
			open = 1
		}
		ch <- prometheus.MustNewConstMetric(watchOpenDesc, prometheus.GaugeValue, open, n)
	}
	failing := 0.0
	if ok, _ := c.api.probe.Healthy(c.api.limits.probeGrace); !ok {
		failing = 1
	}
	ch <- prometheus.MustNewConstMetric(probeFailingDesc, prometheus.GaugeValue, failing)
}
