package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/health"
)

// Registry holds every volplane metric of this process. Services register
// their own collectors on it.
var Registry = prometheus.NewRegistry()

var registerOnce sync.Once

// extra are the registries of libraries that keep their own (csi-lib-utils'
// CSIMetricsManager): /metrics serves them with Registry.
var extra struct {
	sync.Mutex
	gatherers []prometheus.Gatherer
}

// AddGatherer serves g's metrics on /metrics too.
func AddGatherer(g prometheus.Gatherer) {
	extra.Lock()
	defer extra.Unlock()
	extra.gatherers = append(extra.gatherers, g)
}

// Gatherer is every metric /metrics serves: Registry and the added
// gatherers.
func Gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		extra.Lock()
		gs := append(prometheus.Gatherers{Registry}, extra.gatherers...)
		extra.Unlock()
		return gs.Gather()
	})
}

func init() {
	Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

// Handler serves /metrics, /debug/pprof/, and the service's health h:
// /readyz (readiness, the same verdict as its gRPC health) and /livez
// (liveness; /healthz is the same). A nil h serves a /livez and /healthz
// that only say the process answers, and no /readyz.
func Handler(h *health.Checks) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(Gatherer(), promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if h == nil {
		h = health.New()
	} else {
		mux.Handle("GET /readyz", h.ReadyHandler())
	}
	mux.Handle("GET /livez", h.LiveHandler())
	mux.Handle("GET /healthz", h.LiveHandler())
	return mux
}

// Serve serves Handler(h) on addr until ctx ends; an empty addr serves
// nothing and returns when ctx ends.
func Serve(ctx context.Context, addr string, log *slog.Logger, h *health.Checks) error {
	if addr == "" {
		<-ctx.Done()
		return nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s (--debug-address): %w", addr, err)
	}
	srv := &http.Server{Handler: Handler(h), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("serving metrics, health and pprof", "address", lis.Addr().String())
	select {
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

// RegisterWorkqueueMetrics makes every client-go work queue created
// afterwards report under the Kubernetes names. Safe to call repeatedly.
func RegisterWorkqueueMetrics() {
	registerOnce.Do(func() {
		p := &workqueueProvider{
			depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "depth",
				Help: "Current depth of the work queue."}, []string{"name"}),
			adds: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "adds_total",
				Help: "Total number of adds handled by the work queue."}, []string{"name"}),
			latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "queue_duration_seconds",
				Help: "How long an item stays in the work queue before being requested.", Buckets: prometheus.ExponentialBuckets(1e-6, 10, 10)}, []string{"name"}),
			work: prometheus.NewHistogramVec(prometheus.HistogramOpts{Subsystem: "workqueue", Name: "work_duration_seconds",
				Help: "How long processing an item from the work queue takes.", Buckets: prometheus.ExponentialBuckets(1e-6, 10, 10)}, []string{"name"}),
			unfinished: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "unfinished_work_seconds",
				Help: "Seconds of work in progress not yet observed by work_duration."}, []string{"name"}),
			longest: prometheus.NewGaugeVec(prometheus.GaugeOpts{Subsystem: "workqueue", Name: "longest_running_processor_seconds",
				Help: "Seconds the longest running processor of the work queue has been running."}, []string{"name"}),
			retries: prometheus.NewCounterVec(prometheus.CounterOpts{Subsystem: "workqueue", Name: "retries_total",
				Help: "Total number of retries handled by the work queue."}, []string{"name"}),
		}
		Registry.MustRegister(p.depth, p.adds, p.latency, p.work, p.unfinished, p.longest, p.retries)
		workqueue.SetProvider(p)
	})
}

type workqueueProvider struct {
	depth, unfinished, longest *prometheus.GaugeVec
	adds, retries              *prometheus.CounterVec
	latency, work              *prometheus.HistogramVec
}

func (p *workqueueProvider) NewDepthMetric(name string) workqueue.GaugeMetric {
	return p.depth.WithLabelValues(name)
}
func (p *workqueueProvider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.adds.WithLabelValues(name)
}
func (p *workqueueProvider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.latency.WithLabelValues(name)
}
func (p *workqueueProvider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.work.WithLabelValues(name)
}
func (p *workqueueProvider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.unfinished.WithLabelValues(name)
}
func (p *workqueueProvider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.longest.WithLabelValues(name)
}
func (p *workqueueProvider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.retries.WithLabelValues(name)
}
