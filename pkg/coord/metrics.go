package coord

import (
	"context"
	"path"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/metrics"
)

// etcd's side of a replica, on the process's metrics.Registry: how long
// each etcd request takes (every unary call of the client: Range, Txn,
// Put, LeaseGrant, ...) and whether the replica holds a session.
var (
	etcdRequestSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "volplane_etcd_request_duration_seconds",
		Help:    "Latency of this process's etcd requests, by gRPC method (Range, Txn, Put, LeaseGrant, ...) and gRPC status code.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15), // 1ms to 16s
	}, []string{"method", "code"})
	sessionGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "volplane_etcd_session",
		Help: "1 while the replica holds a live etcd session (its membership, locks and fenced writes hang on it), 0 while it has none: it then takes no step that needs one.",
	}, []string{"service"})
	sessionsLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_etcd_sessions_lost_total",
		Help: "etcd sessions of the replica lost (lease expired or revoked) while it ran.",
	}, []string{"service"})
	journalAge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "volplane_journal_oldest_record_seconds",
		Help: "Age of the oldest operation record in the etcd journal, by kind (provision: read by the provisioner; reclaim: by the reclaimer), as the replica's last periodic read of the journal found it; 0 when there is none. Every replica reads the whole journal: take the max over replicas, not the sum.",
	}, []string{"kind"})
)

func init() {
	metrics.Registry.MustRegister(etcdRequestSeconds, sessionGauge, sessionsLost, journalAge)
}

// ReportJournalAge sets the age of the oldest journal record of kind, as a
// service that read the whole journal found it.
func ReportJournalAge(kind string, oldest time.Duration) {
	journalAge.WithLabelValues(kind).Set(oldest.Seconds())
}

// timeRequests observes every unary etcd call in etcdRequestSeconds.
func timeRequests(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	start := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	etcdRequestSeconds.WithLabelValues(path.Base(method), status.Code(err).String()).Observe(time.Since(start).Seconds())
	return err
}
