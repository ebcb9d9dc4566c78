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

func (r *countingReservations) ReserveAll(_ context.Context, rs []coord.Reservation) ([]error, error) {
	return make([]error, len(rs)), nil
}

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
	c.reservations.etcd = res
	c.reservations.linger = 20 * time.Millisecond
	var want []string
	for i := range 250 {
		r := fmt.Sprintf("pv/v%d", i)
		want = append(want, r)
		c.reservations.releaseLater(r, "claim")
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.reservations.releaser(ctx) }()
	waitReleased(t, res, 250)
	c.reservations.releaseLater("pv/late", "claim")
	waitReleased(t, res, 251)
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

func waitReleased(t *testing.T, res *countingReservations, n int) {
	t.Helper()
	waitFor(t, func() bool {
		res.mu.Lock()
		defer res.mu.Unlock()
		return len(res.released) >= n
	})
}

// The reservations of finished binds wait for others to share their
// transaction; that of a failed bind goes at once, and takes those waiting
// with it.
func TestFailedBindReleasesAtOnce(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	res := &countingReservations{}
	c.reservations.etcd = res
	c.reservations.linger = time.Hour
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.reservations.releaser(ctx) }()
	defer func() { cancel(); <-done }()

	for i := range 3 {
		c.reservations.releaseLater(fmt.Sprintf("pv/bound-%d", i), "claim")
	}
	time.Sleep(50 * time.Millisecond)
	res.mu.Lock()
	early := len(res.released)
	res.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d lingering releases went before their linger or a failed bind's", early)
	}
	c.reservations.releaseSoon("pv/failed", "claim")
	waitReleased(t, res, 4)
	res.mu.Lock()
	defer res.mu.Unlock()
	if !slices.Equal(res.batches, []int{4}) || res.released[3] != "pv/failed" {
		t.Errorf("batches %v of %v, want one of 4 ending with pv/failed", res.batches, res.released)
	}
}
