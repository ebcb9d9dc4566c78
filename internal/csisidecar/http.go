package csisidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/volplane/volplane/pkg/sidecar"
)

// tlsCert is the serving certificate.
type tlsCert struct{ tls.Certificate }

// sha256 is the fingerprint the registration pins: of the leaf's DER.
func (c tlsCert) sha256() string { return sidecar.CertSHA256(c.Certificate.Certificate[0]) }

// sidecarMetrics are the sidecar's own metrics, in a registry of its own.
type sidecarMetrics struct {
	reg   *prometheus.Registry
	calls *prometheus.CounterVec
	// ready is true once the driver answered GetPluginInfo.
	ready atomic.Bool
}

func newMetrics() *sidecarMetrics {
	m := &sidecarMetrics{reg: prometheus.NewRegistry()}
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_csi_sidecar_calls_total",
		Help: "Calls through the sidecar to the CSI driver, by method (\"other\" for every method the sidecar does not serve) and gRPC code (refusals included).",
	}, []string{"method", "code"})
	m.reg.MustRegister(m.calls, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// httpEndpoint is --http-endpoint or the deprecated --metrics-address.
func (s *Sidecar) httpEndpoint() string {
	if s.opts.Provisioner.HTTPEndpoint != "" {
		return s.opts.Provisioner.HTTPEndpoint
	}
	return s.opts.Provisioner.MetricsAddress
}

// httpMux serves /healthz (200 once the driver named itself), the
// metrics at --metrics-path and, with --enable-pprof, /debug/pprof/.
func (s *Sidecar) httpMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !s.metrics.ready.Load() {
			http.Error(w, "waiting for the CSI driver to answer GetPluginInfo", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	})
	mux.Handle(s.opts.Provisioner.MetricsPath, promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	if s.opts.Provisioner.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// serveHTTP serves mux on addr until ctx ends.
func serveHTTP(ctx context.Context, addr string, mux *http.ServeMux, log *slog.Logger) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--http-endpoint %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Info("serving health and metrics", "address", lis.Addr().String())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("--http-endpoint %s: %w", addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
