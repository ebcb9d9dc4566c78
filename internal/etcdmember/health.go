package etcdmember

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp"
	"go.uber.org/zap"
)

// The entrypoint's own metrics, served with etcd's on the metrics port.
var (
	defragmentations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "volplane_etcd_member_defragmentations_total",
		Help: "Defragmentations of this member's database made by the entrypoint.",
	})
	alarmDisarms = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "volplane_etcd_member_alarm_disarms_total",
		Help: "NOSPACE alarms disarmed by this member's entrypoint once every member's database was below its quota again.",
	})
	replacements = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "volplane_etcd_member_replacements_total",
		Help: "Former selves (members of this name or peer URL whose data is lost) removed from the cluster by this member before joining it.",
	})
	quorumRecoveries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "volplane_etcd_member_quorum_recoveries_total",
		Help: "Restarts as a cluster of one (--force-new-cluster) after the quorum was lost with every other member's data.",
	})
	noSpaceAlarm = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "volplane_etcd_member_nospace_alarm",
		Help: "1 while etcd's NOSPACE alarm is raised (every write refused), as this member's last maintenance pass saw it.",
	})
	noSpaceAlarms = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "volplane_etcd_member_nospace_alarms_total",
		Help: "NOSPACE alarms this member's entrypoint saw raised.",
	})
	waiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "volplane_etcd_member_waiting",
		Help: "1 while the member waits (for its peers, or for a quorum) before starting etcd.",
	})
)

func init() {
	prometheus.MustRegister(defragmentations, alarmDisarms, noSpaceAlarm, noSpaceAlarms, replacements, quorumRecoveries, waiting)
}

// healthHandler serves /metrics always, and etcd's own /health, /livez
// and /readyz once etcd runs; before, /livez answers 200 (the member is
// alive, deciding or waiting) and /readyz 503 with why it waits.
type healthHandler struct {
	etcd   atomic.Pointer[http.ServeMux]
	reason atomic.Pointer[string]
}

func (h *healthHandler) setEtcd(e *embed.Etcd) {
	if e == nil {
		h.etcd.Store(nil)
		return
	}
	mux := http.NewServeMux()
	etcdhttp.HandleMetrics(mux)
	etcdhttp.HandleHealth(zap.NewNop(), mux, e.Server)
	h.etcd.Store(mux)
}

func (h *healthHandler) setReason(s string) { h.reason.Store(&s) }

func (h *healthHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if mux := h.etcd.Load(); mux != nil {
		mux.ServeHTTP(w, r)
		return
	}
	reason := "starting"
	if p := h.reason.Load(); p != nil {
		reason = *p
	}
	switch r.URL.Path {
	case "/metrics":
		promhttp.Handler().ServeHTTP(w, r)
	case "/livez":
		fmt.Fprintf(w, "ok: etcd not started yet: %s\n", reason)
	case "/readyz", "/health":
		http.Error(w, "etcd not started yet: "+reason, http.StatusServiceUnavailable)
	default:
		http.NotFound(w, r)
	}
}

// serveHealth serves h on every metrics URL until ctx ends.
func (r *runner) serveHealth(ctx context.Context) error {
	if len(r.p.metrics) == 0 {
		<-ctx.Done()
		return nil
	}
	errc := make(chan error, len(r.p.metrics))
	var servers []*http.Server
	for _, u := range r.p.metrics {
		lis, err := net.Listen("tcp", u.Host)
		if err != nil {
			for _, s := range servers {
				s.Close()
			}
			return fmt.Errorf("--listen-metrics-urls: %w", err)
		}
		srv := &http.Server{Handler: &r.health, ReadHeaderTimeout: 5 * time.Second}
		servers = append(servers, srv)
		go func() { errc <- srv.Serve(lis) }()
	}
	select {
	case <-ctx.Done():
		for _, s := range servers {
			s.Close()
		}
		return nil
	case err := <-errc:
		for _, s := range servers {
			s.Close()
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("metrics endpoint: %w", err)
	}
}
