package coord_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/metrics"
)

func scrape(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(metrics.Handler(nil, metrics.Debug{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func waitMetrics(t *testing.T, wants ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		body, missing := scrape(t), ""
		for _, w := range wants {
			if !strings.Contains(body, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s in /metrics", missing)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Against a real etcd: the session's state and its loss, and the latency
// of every request by method, as /metrics reports them.
func TestKeeperMetrics(t *testing.T) {
	const service = "metrics-svc"
	k, err := coord.NewKeeper(coord.Options{Endpoints: endpoints, Prefix: "/metrics-test", TTL: 5 * time.Second, Logger: quiet()}, service, "m1", "addr-1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	defer func() { cancel(); <-done }()

	waitMetrics(t, `volplane_etcd_session{service="`+service+`"} 1`)
	if err := k.Reserve(t.Context(), "pv/metrics", "claim"); err != nil {
		t.Fatal(err)
	}
	waitMetrics(t, `volplane_etcd_request_duration_seconds_count{code="OK",method="Txn"}`,
		`volplane_etcd_request_duration_seconds_count{code="OK",method="LeaseGrant"}`)

	// The lease goes (as when etcd was out of reach for longer than the
	// TTL): the loss is counted, and a new session follows.
	co := k.Current()
	if _, err := co.Client().Revoke(t.Context(), co.Lease()); err != nil {
		t.Fatal(err)
	}
	waitMetrics(t, `volplane_etcd_sessions_lost_total{service="`+service+`"} 1`)
	waitMetrics(t, `volplane_etcd_session{service="`+service+`"} 1`)
}
