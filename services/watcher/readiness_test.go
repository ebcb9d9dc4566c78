package watcher

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	k8swatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/volplane/volplane/pkg/grpcutil"
)

// probeStub is an apiProbe whose verdict the test sets.
type probeStub struct {
	ok  bool
	err error
}

func (p *probeStub) Run(context.Context, time.Duration)  {}
func (p *probeStub) Healthy(time.Duration) (bool, error) { return p.ok, p.err }

// What "current" means, informer by informer: a watch open (or reopened
// within the grace), and an open watch that has gone silent counts as dead
// only while the API server does not answer the probe either.
func TestCurrent(t *testing.T) {
	now := time.Now()
	l := limits{rewatch: 10 * time.Second, silence: 90 * time.Second, probeGrace: 3 * time.Second}
	open := func(heard time.Duration) *watchState {
		return &watchState{open: 1, heard: now.Add(-heard), closed: now.Add(-time.Hour)}
	}
	closed := func(since time.Duration, err error) *watchState {
		return &watchState{closed: now.Add(-since), heard: now.Add(-since), err: err}
	}
	refused := errors.New("connection refused")
	for _, tc := range []struct {
		name    string
		watches map[string]*watchState
		probeOK bool
		want    bool
		why     string // in the error when not current
	}{
		{"every watch open", map[string]*watchState{"PersistentVolume": open(time.Second), "StorageClass": open(time.Minute)}, true, true, ""},
		{"a slow API server: the probe fails, the watches deliver", map[string]*watchState{"PersistentVolume": open(time.Second), "StorageClass": open(30 * time.Second)}, false, true, ""},
		{"a watch reopening within the grace", map[string]*watchState{"PersistentVolume": closed(5*time.Second, nil)}, true, true, ""},
		{"a watch reopening within the grace while the probe fails", map[string]*watchState{"PersistentVolume": closed(5*time.Second, nil)}, false, true, ""},
		{"no watch for longer than the grace", map[string]*watchState{"PersistentVolume": open(0), "StorageClass": closed(11*time.Second, refused)}, true, false, "StorageClass informer: no watch open on the API server for 11s (last error: connection refused)"},
		{"a silent watch while the API server answers", map[string]*watchState{"PersistentVolume": open(10 * time.Minute)}, true, true, ""},
		{"a silent watch while the API server does not answer", map[string]*watchState{"PersistentVolume": open(100 * time.Second)}, false, false, "PersistentVolume informer: its watch has delivered nothing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &apiHealth{probe: &probeStub{ok: tc.probeOK, err: errors.New("context deadline exceeded")}, limits: l, watches: tc.watches}
			ok, why := a.current(now)
			if ok != tc.want {
				t.Fatalf("current = %v (%v), want %v", ok, why, tc.want)
			}
			if !ok && !strings.Contains(why.Error(), tc.why) {
				t.Fatalf("why = %q, want it to say %q", why, tc.why)
			}
		})
	}
}

// readyzServer is an API server's /readyz that answers, or never does
// while hang is set.
func readyzServer(t *testing.T, hang *atomic.Bool) discovery.DiscoveryInterface {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hang.Load() {
			<-r.Context().Done()
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(srv.Close)
	return discovery.NewDiscoveryClientForConfigOrDie(&rest.Config{Host: srv.URL})
}

func hangingReadyz(t *testing.T) discovery.DiscoveryInterface {
	var hang atomic.Bool
	hang.Store(true)
	return readyzServer(t, &hang)
}

// withDiscovery is a fake clientset whose discovery (and so the API
// probe) goes to another server.
type withDiscovery struct {
	*fake.Clientset
	d discovery.DiscoveryInterface
}

func (c withDiscovery) Discovery() discovery.DiscoveryInterface { return c.d }

// startServing runs the watcher with o on client and returns a function
// reading its health.
func startServing(t *testing.T, client kubernetes.Interface, o Options) (health func() healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o.Listen, o.TLS = "unused", grpcutil.TLSFiles{InsecurePlaintext: true}
	if err := o.validate(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, o, client, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	hc := healthpb.NewHealthClient(cc)
	return func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
}

func waitHealth(t *testing.T, health func() healthpb.HealthCheckResponse_ServingStatus, want healthpb.HealthCheckResponse_ServingStatus, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() string {
		if got := health(); got != want {
			return "health " + got.String() + ", want " + want.String()
		}
		return ""
	})
}

// An API server whose /readyz never answers, while the watches are open,
// is a slow API server: the watcher stays SERVING (issue 23, item 6: the
// probe used to turn it NOT_SERVING 3s into a burst), and says so in its
// log.
func TestUnansweredProbeKeepsServing(t *testing.T) {
	logs := newMessages()
	l := defaultLimits
	l.probeTimeout, l.probeGrace = 200*time.Millisecond, 100*time.Millisecond
	health := startServing(t, withDiscovery{fake.NewClientset(), hangingReadyz(t)}, Options{Logger: slog.New(logs), limits: l})
	waitHealth(t, health, healthpb.HealthCheckResponse_SERVING, 10*time.Second)
	eventually(t, 10*time.Second, func() string {
		if logs.count("API server unreachable") == 0 {
			return "the failing probe was not logged"
		}
		return ""
	})
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got := health(); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %v while every watch is open and only /readyz does not answer", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// brokenWatches makes a fake clientset's volume watches controllable:
// break ends the open one and fails every new one until mend.
type brokenWatches struct {
	mu      sync.Mutex
	current *k8swatch.RaceFreeFakeWatcher
	broken  atomic.Bool
}

func (b *brokenWatches) react(k8stesting.Action) (bool, k8swatch.Interface, error) {
	if b.broken.Load() {
		return true, nil, errors.New("dial tcp: no route to host")
	}
	w := k8swatch.NewRaceFreeFake()
	b.mu.Lock()
	b.current = w
	b.mu.Unlock()
	return true, w, nil
}

func (b *brokenWatches) breakAll() {
	b.broken.Store(true)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.current != nil {
		b.current.Stop()
	}
}

// Without an open watch for longer than the grace (the API server is down,
// or refuses the watch), the watcher is NOT_SERVING, whatever the probe
// says; it serves again once the watch is open again.
func TestNoWatchMeansNotServing(t *testing.T) {
	client := fake.NewClientset()
	b := &brokenWatches{}
	client.PrependWatchReactor("persistentvolumes", b.react)
	l := defaultLimits
	l.rewatch = 300 * time.Millisecond
	health := startServing(t, client, Options{Logger: slog.New(newMessages()), limits: l})
	waitHealth(t, health, healthpb.HealthCheckResponse_SERVING, 10*time.Second)
	b.breakAll()
	waitHealth(t, health, healthpb.HealthCheckResponse_NOT_SERVING, 10*time.Second)
	b.broken.Store(false)
	waitHealth(t, health, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
}

// An open watch that delivers nothing, not even a bookmark, while the API
// server answers no probe either is presumed dead (a connection that died
// without a reset): NOT_SERVING; SERVING again when the API server answers.
func TestSilentWatchesAndNoAnswerMeansNotServing(t *testing.T) {
	var hang atomic.Bool
	l := limits{rewatch: time.Minute, silence: 500 * time.Millisecond, probeGrace: 100 * time.Millisecond, probeTimeout: 200 * time.Millisecond}
	health := startServing(t, withDiscovery{fake.NewClientset(), readyzServer(t, &hang)}, Options{Logger: slog.New(newMessages()), limits: l})
	// The fake's watches never deliver a bookmark: silent, but the API
	// server answers.
	waitHealth(t, health, healthpb.HealthCheckResponse_SERVING, 10*time.Second)
	hang.Store(true)
	waitHealth(t, health, healthpb.HealthCheckResponse_NOT_SERVING, 10*time.Second)
	hang.Store(false)
	waitHealth(t, health, healthpb.HealthCheckResponse_SERVING, 10*time.Second)
}
