package gateway

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func requests(t *testing.T, route, method string, code int) float64 {
	t.Helper()
	var m dto.Metric
	if err := httpRequests.WithLabelValues(route, method, strconv.Itoa(code)).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// Every request is counted by route template (never by the names in its
// path, which would make a series per object), method and status; one
// refused before a route was matched counts under "none".
func TestRequestsCountedByRouteAndStatus(t *testing.T) {
	g := startGateway(t, nil)
	const claim = "/v1/namespaces/{namespace}/claims/{name}"
	const sync = "/v1/namespaces/{namespace}/claims/{name}:sync"
	cases := []struct {
		name, method, path, token string
		route                     string
		code                      int
	}{
		{"a read (the fake binder knows no claim)", http.MethodGet, "/v1/namespaces/team/claims/data-1", "viewer-token", claim, http.StatusNotFound},
		{"the same route, another name", http.MethodGet, "/v1/namespaces/other/claims/data-2", "viewer-token", claim, http.StatusNotFound},
		{"a write the viewer may not make", http.MethodPost, "/v1/namespaces/team/claims/data-1:sync", "viewer-token", sync, http.StatusForbidden},
		{"no credentials", http.MethodGet, "/v1/namespaces/team/claims/data-1", "", routeNone, http.StatusUnauthorized},
		{"no such route", http.MethodGet, "/v1/nothing/here", "viewer-token", routeNone, http.StatusNotFound},
		{"a public path", http.MethodGet, "/healthz", "", "/healthz", http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := requests(t, tc.route, tc.method, tc.code)
			resp, _ := g.do(t, tc.method, tc.path, tc.token, nil)
			if resp.StatusCode != tc.code {
				t.Fatalf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
			}
			if got := requests(t, tc.route, tc.method, tc.code); got != before+1 {
				t.Errorf("volplane_gateway_http_requests_total{route=%q,method=%q,code=\"%d\"} went from %v to %v, want +1", tc.route, tc.method, tc.code, before, got)
			}
		})
	}
	for _, bad := range []string{"/v1/namespaces/team/claims/data-1", "/v1/nothing/here"} {
		if n := requests(t, bad, http.MethodGet, http.StatusOK) + requests(t, bad, http.MethodGet, http.StatusNotFound); n != 0 {
			t.Errorf("a series labelled with the request path %s", bad)
		}
	}
}
