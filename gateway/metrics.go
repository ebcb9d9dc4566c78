package gateway

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/volplane/volplane/pkg/metrics"
)

// The REST side of the gateway, on its --debug-address /metrics (the gRPC
// side is grpc_client_*, by backend method): every request by route (the
// path template of http.yaml, so one label value per route whatever the
// names in the path), method and HTTP status.
var (
	httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "volplane_gateway_http_requests_total",
		Help: "REST requests answered, by route (the path template; \"none\" for requests refused before a route was matched: 400, 401, 413, and 404 for no route), method and HTTP status code.",
	}, []string{"route", "method", "code"})
	httpSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "volplane_gateway_http_request_duration_seconds",
		Help:    "Time to answer a REST request, by route and method (for /v1/watch, how long the stream stayed open).",
		Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"route", "method"})
)

func init() { metrics.Registry.MustRegister(httpRequests, httpSeconds) }

// routeNone is the route label of a request answered before a route was
// matched.
const routeNone = "none"

// observe records one answered request.
func observe(r *http.Request, st *reqState, code int, d time.Duration) {
	route := routeNone
	switch {
	case st.route != nil:
		route = st.route.Path
	case public[r.URL.Path]:
		route = r.URL.Path
	}
	method := r.Method
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions:
	default:
		method = "other" // the label's values stay few whatever callers send
	}
	httpRequests.WithLabelValues(route, method, strconv.Itoa(code)).Inc()
	httpSeconds.WithLabelValues(route, method).Observe(d.Seconds())
}
