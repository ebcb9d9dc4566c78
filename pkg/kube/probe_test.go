package kube

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// readyz is an API server's /readyz whose behaviour a test changes.
type readyz struct {
	delay  atomic.Int64 // nanoseconds before answering
	status atomic.Int32 // 0: 200
	hang   atomic.Bool  // never answer (until the client gives up)
}

func (r *readyz) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if r.hang.Load() {
		<-req.Context().Done()
		return
	}
	select {
	case <-time.After(time.Duration(r.delay.Load())):
	case <-req.Context().Done():
		return
	}
	if s := r.status.Load(); s != 0 {
		http.Error(w, "not ready", int(s))
		return
	}
	_, _ = w.Write([]byte("ok"))
}

func startProbe(t *testing.T, timeout time.Duration) (*readyz, *httptest.Server, *APIProbe) {
	t.Helper()
	r := &readyz{}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	p := NewAPIProbe(client)
	p.Timeout = timeout
	go p.Run(t.Context(), 20*time.Millisecond)
	return r, srv, p
}

// until polls cond until it holds or the deadline passes.
func until(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An API server that answers every probe, however slowly (within the
// probe's timeout), is healthy all along, even when each answer takes
// longer than the grace.
func TestAPIProbeSlowIsNotGone(t *testing.T) {
	const grace = 100 * time.Millisecond
	r, _, p := startProbe(t, 2*time.Second)
	r.delay.Store(int64(400 * time.Millisecond))
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if ok, err := p.Healthy(grace); !ok {
			t.Fatalf("an API server answering in 400ms counted as gone with a grace of %s: %v", grace, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Failing probes make the API server unhealthy once they have failed for
// the grace: refused connections, an HTTP error status, no answer within
// the timeout; it is healthy again at its next answer.
func TestAPIProbeFailures(t *testing.T) {
	const grace = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		fail func(r *readyz, srv *httptest.Server)
		mend func(r *readyz)
	}{
		{"HTTP error", func(r *readyz, _ *httptest.Server) { r.status.Store(http.StatusInternalServerError) }, func(r *readyz) { r.status.Store(0) }},
		{"no answer within the timeout", func(r *readyz, _ *httptest.Server) { r.hang.Store(true) }, func(r *readyz) { r.hang.Store(false) }},
		{"connection refused", func(_ *readyz, srv *httptest.Server) { srv.Close() }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, srv, p := startProbe(t, 300*time.Millisecond)
			until(t, 5*time.Second, "healthy at start", func() bool { ok, _ := p.Healthy(grace); return ok })
			tc.fail(r, srv)
			until(t, 5*time.Second, "unhealthy", func() bool { ok, _ := p.Healthy(grace); return !ok })
			if _, err := p.Healthy(grace); err == nil {
				t.Error("unhealthy without an error")
			}
			if tc.mend == nil {
				return
			}
			tc.mend(r)
			until(t, 5*time.Second, "healthy again", func() bool { ok, _ := p.Healthy(grace); return ok })
		})
	}
}
