package binder

import (
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

// A claim whose every sync fails, touched many times a second by watch
// events, resyncs and membership changes, is retried only as its backoff
// allows: a dozen API requests in 10 s, not one per event.
func TestAFailingClaimIsRetriedOnlyThroughItsBackoff(t *testing.T) {
	t.Parallel()
	claim := testClaim("broken")
	claim.Spec.StorageClassName = nil // no class, no volume: the sync writes Pending
	claim.Status.Phase = ""
	c, client := fedController(t, claim.DeepCopy())
	var requests atomic.Int64
	client.PrependReactor("*", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		requests.Add(1)
		return true, nil, apierrors.NewInternalError(errBroken)
	})
	before := retries(t, reasonUnavailable)

	ctx := t.Context()
	go func() { _ = c.run(ctx, 4, 0) }()
	const (
		period = 10 * time.Second
		every  = 5 * time.Millisecond // 200 touches a second
	)
	tick := time.NewTicker(every)
	defer tick.Stop()
	rv := 10
	for end := time.Now().Add(period); time.Now().Before(end); <-tick.C {
		rv++
		touched := claim.DeepCopy()
		touched.ResourceVersion = strconv.Itoa(rv)
		deliver(t, c, evUpdated, touched) // a watch event
		c.enqueueAll()                    // a resync or membership change
		c.claimQueue.add(claimKey(claim)) // a SyncClaim call, a provisioning result
	}
	// 5ms, 10ms, ... doubling: 11 tries fit in 10 s; allow some slack for
	// the retry that holds the events it meets.
	if n := requests.Load(); n > 15 {
		t.Fatalf("%d API requests for one failing claim in %s, want at most 15", n, period)
	} else if n < 2 {
		t.Fatalf("%d API requests: the claim was not retried", n)
	}
	if d := retries(t, reasonUnavailable) - before; d < 1 {
		t.Fatalf("volplane_binder_retries_total{reason=%q} grew by %v", reasonUnavailable, d)
	}
}

var errBroken = errors.New("the API server is broken for this claim")

// retries reads volplane_binder_retries_total{reason}.
func retries(t *testing.T, reason string) float64 {
	t.Helper()
	var m dto.Metric
	if err := retriesTotal.WithLabelValues(reason).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
