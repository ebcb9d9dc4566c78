package metrics

import (
	"context"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// restBuckets are kube-controller-manager's buckets of the REST client's
// latencies (k8s.io/component-base/metrics/prometheus/restclient).
var restBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}

// client-go's REST client metrics, with kube-controller-manager's names
// and labels, so its dashboards and alerts read volplane's too.
var (
	restRequestLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_request_duration_seconds",
		Help:    "Request latency in seconds. Broken down by verb, and host.",
		Buckets: restBuckets,
	}, []string{"verb", "host"})
	restRateLimiterLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_rate_limiter_duration_seconds",
		Help:    "Client side rate limiter latency in seconds. Broken down by verb, and host.",
		Buckets: restBuckets,
	}, []string{"verb", "host"})
	restRequestResult = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total",
		Help: "Number of HTTP requests, partitioned by status code, method, and host.",
	}, []string{"code", "method", "host"})
	restRequestRetry = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_request_retries_total",
		Help: "Number of request retries, partitioned by status code, verb, and host.",
	}, []string{"code", "verb", "host"})
)

// registerRESTClientMetrics registers the REST client metrics on Registry
// and makes every client-go client of the process report them (client-go
// takes the first registration only).
func registerRESTClientMetrics() {
	Registry.MustRegister(restRequestLatency, restRateLimiterLatency, restRequestResult, restRequestRetry)
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestLatency:     latencyAdapter{restRequestLatency},
		RateLimiterLatency: latencyAdapter{restRateLimiterLatency},
		RequestResult:      resultAdapter{restRequestResult},
		RequestRetry:       resultAdapter{restRequestRetry},
	})
}

type latencyAdapter struct{ m *prometheus.HistogramVec }

func (l latencyAdapter) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	l.m.WithLabelValues(verb, u.Host).Observe(latency.Seconds())
}

type resultAdapter struct{ m *prometheus.CounterVec }

func (r resultAdapter) Increment(_ context.Context, code, method, host string) {
	r.m.WithLabelValues(code, method, host).Inc()
}

func (r resultAdapter) IncrementRetry(_ context.Context, code, method, host string) {
	r.m.WithLabelValues(code, method, host).Inc()
}
