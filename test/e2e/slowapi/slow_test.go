package slowapi

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/test/harness/e2e"
)

// health watches every service's gRPC health and keeps whatever is not
// SERVING.
type health struct {
	mu   sync.Mutex
	bad  []string
	stop context.CancelFunc
	wg   sync.WaitGroup
}

func watchHealth(t *testing.T) *health {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &health{stop: cancel}
	start := time.Now()
	for _, s := range services {
		cc, err := cl.Dial(s.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		hc := healthpb.NewHealthClient(cc)
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for ctx.Err() == nil {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := hc.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
				cancel()
				if ctx.Err() != nil {
					return
				}
				if got := resp.GetStatus(); err != nil || got != healthpb.HealthCheckResponse_SERVING {
					h.mu.Lock()
					h.bad = append(h.bad, fmt.Sprintf("%s at +%s: %v %v", s.name, time.Since(start).Round(100*time.Millisecond), got, err))
					h.mu.Unlock()
				}
				select {
				case <-time.After(250 * time.Millisecond):
				case <-ctx.Done():
				}
			}
		}()
	}
	return h
}

func (h *health) end() []string {
	h.stop()
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bad
}

// Every request the services make waits 2 to 4s at the proxy (answers and
// watch events come back at once). Claims of a dynamic class arrive for
// longer than the watcher's old 35s stale limit: every one binds, binding
// goes on throughout, no service is NOT_SERVING at any time, no watcher
// turns "not serving", and the binder never refuses a provisioning call
// because its stream looks stale.
func TestSlowAPIServer(t *testing.T) {
	ns := e2e.Namespace(t, client)
	del := corev1.PersistentVolumeReclaimDelete
	e2e.CreateClass(t, client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ns}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &del})
	const (
		claims = 60
		every  = 750 * time.Millisecond
	)
	staleBefore := logs.count("no live watcher stream")
	notServingBefore := logs.count("watcher not serving")
	proxy.SetDelay(2*time.Second, 4*time.Second)
	t.Cleanup(func() { proxy.SetDelay(0, 0) })
	h := watchHealth(t)
	start := time.Now()

	var (
		mu      sync.Mutex
		created = map[string]time.Time{}
		bound   = map[string]time.Time{}
	)
	pctx, stopPoll := context.WithCancel(context.Background())
	defer stopPoll()
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for pctx.Err() == nil {
			list, err := client.CoreV1().PersistentVolumeClaims(ns).List(pctx, metav1.ListOptions{})
			if err == nil {
				mu.Lock()
				for _, c := range list.Items {
					if _, ok := bound[c.Name]; !ok && c.Status.Phase == corev1.ClaimBound {
						bound[c.Name] = time.Now()
					}
				}
				mu.Unlock()
			}
			select {
			case <-time.After(250 * time.Millisecond):
			case <-pctx.Done():
			}
		}
	}()
	for i := range claims {
		name := fmt.Sprintf("c-%02d", i)
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), e2e.Claim(ns, name, "1Mi", ns), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		created[name] = time.Now()
		mu.Unlock()
		time.Sleep(every)
	}
	e2e.Eventually(t, 5*time.Minute, func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(bound) < claims {
			return fmt.Sprintf("%d of %d claims Bound after %s", len(bound), claims, time.Since(start).Round(time.Second))
		}
		return ""
	})
	stopPoll()
	<-polled
	bad := h.end()

	mu.Lock()
	defer mu.Unlock()
	var times, latencies []time.Duration
	for name, at := range bound {
		times = append(times, at.Sub(start))
		latencies = append(latencies, at.Sub(created[name]))
	}
	slices.Sort(times)
	slices.Sort(latencies)
	// The longest time with claims waiting and none turning Bound.
	var gap time.Duration
	prev := times[0]
	for _, at := range times[1:] {
		gap = max(gap, at-prev)
		prev = at
	}
	t.Logf("%d claims created over %s; first Bound at +%s, last at +%s; create-to-Bound p50 %s, max %s; longest time without a bind %s",
		claims, (claims * every).Round(time.Second), times[0].Round(100*time.Millisecond), times[len(times)-1].Round(100*time.Millisecond),
		latencies[len(latencies)/2].Round(100*time.Millisecond), latencies[len(latencies)-1].Round(100*time.Millisecond), gap.Round(100*time.Millisecond))

	if len(bad) > 0 {
		t.Errorf("services not SERVING while the API server was slow: %v", bad)
	}
	if n := logs.count("no live watcher stream") - staleBefore; n > 0 {
		t.Errorf("the binder refused %d steps as stale while the API server was only slow", n)
	}
	if n := logs.count("watcher not serving") - notServingBefore; n > 0 {
		t.Errorf("the watcher turned not serving %d times while the API server was only slow", n)
	}
	if gap > 30*time.Second {
		t.Errorf("no claim turned Bound for %s while claims waited", gap.Round(time.Second))
	}
	if logs.count("API server unreachable") > 0 {
		t.Logf("the watcher's /readyz probe failed meanwhile (logged, readiness unchanged)")
	}
}
