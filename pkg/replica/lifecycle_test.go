package replica

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
)

const testService = "volplane.test.v1.TestService"

// startTest starts a replica of service "test" on a fake clientset and a
// local listener, with c's other fields; its logs go to logs.
func startTest(t *testing.T, c Config, logs *lockedBuffer) *Replica {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.Service, c.Client, c.Listener = "test", fake.NewClientset(), lis
	c.TLS = grpcutil.TLSFiles{InsecurePlaintext: true}
	c.Log = slog.New(slog.NewTextHandler(logs, nil))
	r, err := Start(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// status is the gRPC health of service on r's server.
func status(r *Replica, service string) healthpb.HealthCheckResponse_ServingStatus {
	resp, err := r.Server.Health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.Status
}

// poll fails the test unless ok holds within 10 s.
func poll(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// runTest runs r with tasks until the test ends; the channel gets Run's
// answer.
func runTest(t *testing.T, r *Replica, tasks ...Task) (cancel func(), done <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc, returned := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(returned)
		errc <- r.Run(ctx, tasks...)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-returned:
		case <-time.After(30 * time.Second):
			t.Error("Run did not return within 30s of its context's end")
		}
	})
	return cancel, errc
}

// The checks a replica starts with: "etcd-session" only with etcd,
// "api-server" unless the service judges the API server itself; the
// service's own come after them, in the order added.
func TestStartingChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Config
		want []string
	}{
		{"etcd and the API server", Config{Etcd: coord.Options{Endpoints: []string{"http://127.0.0.1:1"}}, MemberID: "test-0"},
			[]string{"etcd-session", "api-server", "own"}},
		{"no etcd", Config{}, []string{"api-server", "own"}},
		{"no etcd, its own API check", Config{OwnAPICheck: true, ReadOnly: true}, []string{"own"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startTest(t, tc.c, &lockedBuffer{})
			if (r.Coord != nil) != (len(tc.c.Etcd.Endpoints) > 0) {
				t.Errorf("Coord %v with etcd endpoints %v", r.Coord, tc.c.Etcd.Endpoints)
			}
			if (r.Recorder != nil) == tc.c.ReadOnly {
				t.Errorf("Recorder %v with ReadOnly %v", r.Recorder, tc.c.ReadOnly)
			}
			r.Health.AddReadiness("own", func() error { return nil })
			_, results := r.Health.Evaluate()
			var names []string
			for _, res := range results {
				names = append(names, res.Name)
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("checks %v, want %v", names, tc.want)
			}
		})
	}
}

// One failing named check makes the replica NOT_SERVING, for the server
// and its services, with the check's name and reason in the log and in
// /readyz; once it passes again the replica serves again. Before the first
// verdict the services are NOT_SERVING, not unknown.
func TestReadinessComposedFromNamedChecks(t *testing.T) {
	var logs lockedBuffer
	r := startTest(t, Config{ReadOnly: true, Readiness: Readiness{Every: 20 * time.Millisecond, Services: []string{testService}}}, &logs)
	if got := status(r, testService); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("before the first verdict: %v, want NOT_SERVING", got)
	}
	var broken atomic.Bool
	r.Health.AddReadiness("disk", func() error {
		if broken.Load() {
			return errors.New("the disk is full")
		}
		return nil
	})
	r.Health.AddReadiness("cache", func() error { return nil })
	runTest(t, r)
	serving := func(want healthpb.HealthCheckResponse_ServingStatus) func() bool {
		return func() bool { return status(r, testService) == want && status(r, "") == want }
	}
	poll(t, "SERVING", serving(healthpb.HealthCheckResponse_SERVING))
	poll(t, "logged ready", func() bool { return strings.Contains(logs.String(), `msg="test ready"`) })

	broken.Store(true)
	poll(t, "NOT_SERVING with a failing check", serving(healthpb.HealthCheckResponse_NOT_SERVING))
	poll(t, "logged not ready", func() bool {
		return strings.Contains(logs.String(), `msg="test not ready" why="disk: the disk is full"`)
	})
	rec := httptest.NewRecorder()
	r.Health.ReadyHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if body := rec.Body.String(); rec.Code != 503 || !strings.Contains(body, "[-]disk failed: the disk is full") || !strings.Contains(body, "[+]cache ok") {
		t.Errorf("/readyz: %d\n%s", rec.Code, body)
	}

	broken.Store(false)
	poll(t, "SERVING again once the check passes", serving(healthpb.HealthCheckResponse_SERVING))
	if n := strings.Count(logs.String(), `msg="test ready"`); n != 2 {
		t.Errorf("logged ready %d times, want 2 (once per change):\n%s", n, logs.String())
	}
}

// A service may name its own messages, and a replica without a member ID
// logs none.
func TestReadinessMessages(t *testing.T) {
	var logs lockedBuffer
	r := startTest(t, Config{ReadOnly: true, OwnAPICheck: true,
		Readiness: Readiness{Every: 20 * time.Millisecond, Ready: "serving now", NotReady: "not serving"}}, &logs)
	r.Health.AddReadiness("informers", func() error { return errors.New("not listed yet") })
	runTest(t, r)
	poll(t, "logged not serving", func() bool {
		return strings.Contains(logs.String(), `msg="not serving" why="informers: not listed yet"`)
	})
	if strings.Contains(logs.String(), "member=") {
		t.Errorf("a replica without a member ID logged one:\n%s", logs.String())
	}
}

// One task failing stops the others (their context ends) and the
// replica: Run returns that task's error, once every task has returned,
// and the gRPC server is NOT_SERVING.
func TestOneFailingTaskStopsTheReplica(t *testing.T) {
	var logs lockedBuffer
	r := startTest(t, Config{ReadOnly: true, Readiness: Readiness{Every: 20 * time.Millisecond, Services: []string{testService}}}, &logs)
	boom := errors.New("boom")
	var stopped atomic.Int32
	waiter := func(ctx context.Context) error {
		<-ctx.Done()
		stopped.Add(1)
		return nil
	}
	fail := make(chan struct{})
	_, done := runTest(t, r, waiter, Until(func(ctx context.Context) { _ = waiter(ctx) }), func(ctx context.Context) error {
		select {
		case <-fail:
			return boom
		case <-ctx.Done():
			return nil
		}
	})
	poll(t, "SERVING", func() bool { return status(r, testService) == healthpb.HealthCheckResponse_SERVING })
	close(fail)
	select {
	case err := <-done:
		if !errors.Is(err, boom) {
			t.Errorf("Run: %v, want %v", err, boom)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after a task failed")
	}
	if n := stopped.Load(); n != 2 {
		t.Errorf("%d of the 2 other tasks returned before Run did", n)
	}
	if got := status(r, testService); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("after Run: %v, want NOT_SERVING", got)
	}
	if !strings.Contains(logs.String(), `msg="test stopped"`) {
		t.Errorf("no stop logged:\n%s", logs.String())
	}
}

// Cancelling Run's context drains: each task finishes what it does at its
// end before Run returns nil.
func TestCancelDrains(t *testing.T) {
	r := startTest(t, Config{ReadOnly: true, Readiness: Readiness{Every: 20 * time.Millisecond}}, &lockedBuffer{})
	var drained atomic.Bool
	cancel, done := runTest(t, r, func(ctx context.Context) error {
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond) // the task's own draining
		drained.Store(true)
		return nil
	})
	poll(t, "SERVING", func() bool { return status(r, "") == healthpb.HealthCheckResponse_SERVING })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v, want nil", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if !drained.Load() {
		t.Error("Run returned before a task had drained")
	}
}

// A Condition passes while its function holds, else fails with its
// reason.
func TestCondition(t *testing.T) {
	var ok atomic.Bool
	check := Condition(ok.Load, "the claims are not listed yet")
	if err := check(); err == nil || err.Error() != "the claims are not listed yet" {
		t.Errorf("before: %v", err)
	}
	ok.Store(true)
	if err := check(); err != nil {
		t.Errorf("after: %v", err)
	}
}
