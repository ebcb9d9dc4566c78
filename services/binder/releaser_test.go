package binder

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/coord"
)

// countingReservations records how reservations are released.
type countingReservations struct {
	mu       sync.Mutex
	released []string
	batches  []int
}

func (r *countingReservations) Reserve(context.Context, string, string) error { return nil }

func (r *countingReservations) Release(_ context.Context, resource, _ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released = append(r.released, resource)
	r.batches = append(r.batches, 1)
	return nil
}

func (r *countingReservations) ReleaseAll(_ context.Context, rs []coord.Reservation) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, x := range rs {
		r.released = append(r.released, x.Resource)
	}
	r.batches = append(r.batches, len(rs))
	return nil
}

// A burst of binds releases its reservations in batches of at most
// coord.MaxReleaseBatch, every one of them exactly once; a lone bind's goes
// alone.
func TestReleasesGoInBatches(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	res := &countingReservations{}
	c.reservations = res
	var want []string
	for i := range 250 {
		r := fmt.Sprintf("pv/v%d", i)
		want = append(want, r)
		c.releaseLater(r, "claim")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.releaser(ctx) }()
	waitReleased := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			res.mu.Lock()
			got := len(res.released)
			res.mu.Unlock()
			if got >= n {
				return
			}
		}
		t.Fatalf("released %d of %d", len(res.released), n)
	}
	waitReleased(250)
	c.releaseLater("pv/late", "claim")
	waitReleased(251)
	cancel()
	<-done
	res.mu.Lock()
	defer res.mu.Unlock()
	if !slices.Equal(res.batches, []int{100, 100, 50, 1}) {
		t.Errorf("batches %v, want [100 100 50 1]", res.batches)
	}
	if !slices.Equal(res.released, append(want, "pv/late")) {
		t.Errorf("released %d reservations, not each queued one once in order", len(res.released))
	}
}
