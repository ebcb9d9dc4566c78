package bench

import (
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// tracker times every claim of a run from the moment its create is sent
// to the first watch event that shows it Bound.
type tracker struct {
	w       watch.Interface
	mu      sync.Mutex
	sent    []time.Time
	latency []time.Duration // 0 until Bound
	bound   int
	last    time.Time     // when the last claim was seen Bound
	all     chan struct{} // closed once every claim is Bound
	closed  chan struct{} // closed if the watch ends
}

// newTracker watches the claims of ns, n of them named claim-0 to
// claim-<n-1>. The apiserver may close a watch under load (a slow
// reader); the retry watcher resumes from the last resourceVersion without
// losing events.
func newTracker(ctx context.Context, client kubernetes.Interface, ns string, n int) (*tracker, error) {
	list, err := client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, opts)
		},
	})
	if err != nil {
		return nil, err
	}
	t := &tracker{w: w, sent: make([]time.Time, n), latency: make([]time.Duration, n), all: make(chan struct{}), closed: make(chan struct{})}
	go t.loop()
	return t, nil
}

// sending records that claim i's create is being sent now.
func (t *tracker) sending(i int) {
	t.mu.Lock()
	t.sent[i] = time.Now()
	t.mu.Unlock()
}

func (t *tracker) loop() {
	defer close(t.closed)
	for ev := range t.w.ResultChan() {
		if ev.Type != watch.Modified && ev.Type != watch.Added {
			continue
		}
		c, ok := ev.Object.(*corev1.PersistentVolumeClaim)
		if !ok || c.Status.Phase != corev1.ClaimBound {
			continue
		}
		t.seen(c.Name, time.Now())
	}
}

func (t *tracker) seen(name string, at time.Time) {
	i, err := strconv.Atoi(strings.TrimPrefix(name, "claim-"))
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil || i < 0 || i >= len(t.sent) || t.latency[i] != 0 || t.sent[i].IsZero() {
		return
	}
	t.latency[i] = max(at.Sub(t.sent[i]), time.Nanosecond)
	t.bound++
	t.last = at
	if t.bound == len(t.sent) {
		close(t.all)
	}
}

func (t *tracker) stop() { t.w.Stop() }

// boundCount is how many claims were seen Bound.
func (t *tracker) boundCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bound
}

// latencies are the Bound claims' create-to-Bound times, sorted, the
// number not Bound, and when the last was seen Bound.
func (t *tracker) latencies() (sorted []time.Duration, unbound int, last time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, l := range t.latency {
		if l > 0 {
			sorted = append(sorted, l)
		}
	}
	slices.Sort(sorted)
	return sorted, len(t.latency) - len(sorted), t.last
}

// Latency summarizes create-to-Bound times.
type Latency struct {
	P50, P90, P99, Max time.Duration
}

// summarize takes the nearest-rank percentiles of sorted latencies.
func summarize(sorted []time.Duration) Latency {
	if len(sorted) == 0 {
		return Latency{}
	}
	return Latency{P50: percentile(sorted, 0.50), P90: percentile(sorted, 0.90), P99: percentile(sorted, 0.99), Max: sorted[len(sorted)-1]}
}

// percentile is the nearest-rank p-quantile of sorted (not empty).
func percentile(sorted []time.Duration, p float64) time.Duration {
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
