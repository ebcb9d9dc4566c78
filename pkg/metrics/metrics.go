package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/volplane/volplane/pkg/health"
	"github.com/volplane/volplane/pkg/version"
)

// Registry holds every volplane metric of this process. Services register
// their own collectors on it.
var Registry = &registry{Registry: prometheus.NewRegistry(), collectors: map[prometheus.Collector]bool{}}

// registry is a prometheus.Registry that remembers its collectors, so that
// Descs can list every metric registered, samples or not (docs/metrics.md
// is checked against it).
type registry struct {
	*prometheus.Registry
	mu         sync.Mutex
	collectors map[prometheus.Collector]bool
}

func (r *registry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	r.collectors[c] = true
	r.mu.Unlock()
	return nil
}

func (r *registry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *registry) Unregister(c prometheus.Collector) bool {
	r.mu.Lock()
	delete(r.collectors, c)
	r.mu.Unlock()
	return r.Registry.Unregister(c)
}

// Descs describes every metric registered on Registry, whether it has
// samples yet or not.
func Descs() []*prometheus.Desc {
	Registry.mu.Lock()
	cs := make([]prometheus.Collector, 0, len(Registry.collectors))
	for c := range Registry.collectors {
		cs = append(cs, c)
	}
	Registry.mu.Unlock()
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	var out []*prometheus.Desc
	for d := range ch {
		out = append(out, d)
	}
	return out
}

// DescName is the metric name a Desc describes (client_golang keeps it
// unexported: "Desc{fqName: \"name\", ...}").
func DescName(d *prometheus.Desc) string {
	s := d.String()
	const key = `fqName: "`
	i := strings.Index(s, key)
	if i < 0 {
		return ""
	}
	s = s[i+len(key):]
	if j := strings.IndexByte(s, '"'); j >= 0 {
		return s[:j]
	}
	return ""
}

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
	Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())
	registerRESTClientMetrics()
	RegisterWorkqueueMetrics()
	Registry.MustRegister(volumeOperationSeconds, volumeOperationErrors)
}

// buildInfo is volplane_build_info: 1, labelled with the build's version,
// commit and Go version (pkg/version), as Kubernetes components'
// kubernetes_build_info.
func buildInfo() prometheus.Collector {
	v := version.Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "volplane_build_info",
		Help:        "1, labelled with the version, commit and Go version of the running binary.",
		ConstLabels: prometheus.Labels{"version": v.Version, "commit": v.Commit, "go_version": v.GoVersion},
	})
	g.Set(1)
	return g
}

// Debug is what the debug port serves besides /metrics and health.
type Debug struct {
	// Pprof serves /debug/pprof/ (--enable-pprof): CPU and heap profiles,
	// goroutine dumps and the command line, to whoever reaches the port.
	// Off by default, as in external-provisioner.
	Pprof bool
}

// PprofFlagUsage is the help of --enable-pprof, the same for every
// service.
const PprofFlagUsage = "serve /debug/pprof/ (profiles, goroutine dumps, the command line) on --debug-address; off by default, as anyone who reaches the port could read them"

// Handler serves /metrics, the service's health h, and with d.Pprof
// /debug/pprof/: /readyz (readiness, the same verdict as its gRPC health)
// and /livez (liveness; /healthz is the same). A nil h serves a /livez and
// /healthz that only say the process answers, and no /readyz.
func Handler(h *health.Checks, d Debug) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(Gatherer(), promhttp.HandlerOpts{}))
	if d.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	if h == nil {
		h = health.New()
	} else {
		mux.Handle("GET /readyz", h.ReadyHandler())
	}
	mux.Handle("GET /livez", h.LiveHandler())
	mux.Handle("GET /healthz", h.LiveHandler())
	return mux
}

// Serve serves handler (Handler's, or one built on it) on addr until ctx
// ends; an empty addr serves nothing and returns when ctx ends.
func Serve(ctx context.Context, addr string, log *slog.Logger, handler http.Handler) error {
	if addr == "" {
		<-ctx.Done()
		return nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s (--debug-address): %w", addr, err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("serving metrics and health", "address", lis.Addr().String())
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

// OperationBuckets are the buckets of volplane's end-to-end latencies
// (create to Bound, create to provisioned, a reclaim): those of
// kube-controller-manager's volume_operation_total_seconds, and 30 minutes
// and an hour above, so that a claim stuck for long still lands in a
// bucket of its own.
var OperationBuckets = []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600, 1800, 3600}
