package binder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/coord"
)

// gatedReservations holds its first ReserveAll until open is closed, and
// refuses every resource named "pv/taken".
type gatedReservations struct {
	countingReservations
	open    chan struct{}
	entered chan struct{}
	once    sync.Once
	mu      sync.Mutex
	batches [][]coord.Reservation
}

func (g *gatedReservations) ReserveAll(_ context.Context, rs []coord.Reservation) ([]error, error) {
	g.once.Do(func() { close(g.entered); <-g.open })
	g.mu.Lock()
	g.batches = append(g.batches, slices.Clone(rs))
	g.mu.Unlock()
	errs := make([]error, len(rs))
	for i, r := range rs {
		if r.Resource == "pv/taken" {
			errs[i] = fmt.Errorf("%s: %w", r.Resource, coord.ErrReserved)
		}
	}
	return errs, nil
}

// Reservations asked for while one transaction is in flight go together in
// the next (at most coord.MaxReserveBatch, a resource at most once in
// each); every caller gets its own answer; a caller that stops waiting
// has its reservation given back once it is taken.
func TestReservationsGoInBatches(t *testing.T) {
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(), record.NewFakeRecorder(100))
	g := &gatedReservations{open: make(chan struct{}), entered: make(chan struct{})}
	c.reservations.etcd = g

	ctx := t.Context()
	first := make(chan error, 1)
	go func() {
		first <- c.reservations.reserveInEtcd(ctx, coord.Reservation{Resource: "pv/first", Holder: "a"})
	}()
	<-g.entered // the first transaction is in flight

	const n = 150
	var wg sync.WaitGroup
	answers := make([]error, n+2)
	ask := func(i int, r coord.Reservation) {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = c.reservations.reserveInEtcd(ctx, r) }()
	}
	for i := range n {
		ask(i, coord.Reservation{Resource: fmt.Sprintf("pv/v%d", i), Holder: fmt.Sprintf("claim-%d", i)})
	}
	ask(n, coord.Reservation{Resource: "pv/taken", Holder: "claim-x"})
	ask(n+1, coord.Reservation{Resource: "pv/v0", Holder: "claim-0"}) // the same resource again
	gone, stop := context.WithCancel(ctx)
	quitter := make(chan error, 1)
	go func() {
		quitter <- c.reservations.reserveInEtcd(gone, coord.Reservation{Resource: "pv/quitter", Holder: "q"})
	}()
	waitPending(t, c.reservations, n+3)
	stop()
	if err := <-quitter; !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller that stopped waiting: %v, want context.Canceled", err)
	}
	close(g.open)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, err := range answers {
		if i == n {
			if !errors.Is(err, coord.ErrReserved) {
				t.Errorf("pv/taken: %v, want ErrReserved", err)
			}
		} else if err != nil {
			t.Errorf("answer %d: %v", i, err)
		}
	}
	g.mu.Lock()
	var sizes []int
	for _, b := range g.batches {
		sizes = append(sizes, len(b))
		seen := map[string]bool{}
		for _, r := range b {
			if seen[r.Resource] {
				t.Errorf("%s twice in one batch", r.Resource)
			}
			seen[r.Resource] = true
		}
	}
	g.mu.Unlock()
	// 1 in flight, then 153 waiting: 100, then 53.
	if !slices.Equal(sizes, []int{1, 100, 53}) {
		t.Errorf("batches of %v, want [1 100 53]", sizes)
	}
	select {
	case r := <-c.reservations.releases:
		if r != (queuedRelease{Reservation: coord.Reservation{Resource: "pv/quitter", Holder: "q"}, soon: true}) {
			t.Errorf("gave back %v, want the quitter's", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the reservation of a caller that stopped waiting was not given back")
	}
}

func waitPending(t *testing.T, b *reservations, n int) {
	t.Helper()
	waitFor(t, func() bool {
		b.reserveMu.Lock()
		defer b.reserveMu.Unlock()
		return len(b.pending) == n
	})
}

// A resource asked for twice waits for the next batch; order is kept.
func TestReserveBatchHasEachResourceOnce(t *testing.T) {
	req := func(r, h string) *reserveRequest {
		return &reserveRequest{r: coord.Reservation{Resource: r, Holder: h}}
	}
	b := &reservations{pending: []*reserveRequest{req("pv/a", "1"), req("pv/a", "2"), req("pv/b", "3"), req("pv/a", "4")}}
	names := func(rs []*reserveRequest) (out []string) {
		for _, r := range rs {
			out = append(out, r.r.Resource+"="+r.r.Holder)
		}
		return out
	}
	for _, want := range [][]string{{"pv/a=1", "pv/b=3"}, {"pv/a=2"}, {"pv/a=4"}, nil} {
		if got := names(b.next()); !slices.Equal(got, want) {
			t.Fatalf("batch %v, want %v", got, want)
		}
	}
}

// A bind that got its four writes in gives its reservation back lingering;
// one that failed after reserving gives it back at once.
func TestBindGivesBackItsReservation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failPV   bool
		wantSoon bool
	}{{"bound", false, false}, {"failed", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			v, cl := testVolume("pv-1"), testClaim("claim-1")
			client := fake.NewClientset(v, cl)
			if tc.failPV {
				client.PrependReactor("update", "persistentvolumes", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewConflict(corev1.Resource("persistentvolumes"), "pv-1", errors.New("stale"))
				})
			}
			c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, record.NewFakeRecorder(100))
			c.reservations.etcd = &countingReservations{}
			err := c.bind(t.Context(), v, cl)
			if (err != nil) != tc.failPV {
				t.Fatalf("bind: %v", err)
			}
			select {
			case r := <-c.reservations.releases:
				if r.Resource != "pv/pv-1" || r.Holder != string(cl.UID) || r.soon != tc.wantSoon {
					t.Errorf("gave back %+v, want pv/pv-1 of %s, soon %v", r, cl.UID, tc.wantSoon)
				}
			default:
				t.Fatal("the reservation was not given back")
			}
		})
	}
}

// heldReservations keeps reservations as etcd would: one holder a resource.
type heldReservations struct {
	mu   sync.Mutex
	held map[string]string
}

func (h *heldReservations) ReserveAll(_ context.Context, rs []coord.Reservation) ([]error, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	errs := make([]error, len(rs))
	for i, r := range rs {
		if holder, ok := h.held[r.Resource]; ok && holder != r.Holder {
			errs[i] = fmt.Errorf("%s: %w %q", r.Resource, coord.ErrReserved, holder)
			continue
		}
		h.held[r.Resource] = r.Holder
	}
	return errs, nil
}

func (h *heldReservations) Release(_ context.Context, resource, holder string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held[resource] == holder {
		delete(h.held, resource)
	}
	return nil
}

func (h *heldReservations) ReleaseAll(ctx context.Context, rs []coord.Reservation) error {
	for _, r := range rs {
		_ = h.Release(ctx, r.Resource, r.Holder)
	}
	return nil
}

// A volume bound, released and made Available again while its first
// claim's reservation still lingers goes to the next claim at once: this
// replica drops its own lingering reservation instead of being refused by
// it.
func TestALingeringReleaseGivesWayToTheNextClaim(t *testing.T) {
	v, first, next := testVolume("pv-1"), testClaim("first"), testClaim("next")
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(v, first, next), record.NewFakeRecorder(100))
	held := &heldReservations{held: map[string]string{}}
	c.reservations.etcd = held
	c.reservations.linger = time.Hour
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); c.reservations.releaser(ctx) }()
	defer func() { cancel(); <-done }()

	if err := c.bind(ctx, v, first); err != nil {
		t.Fatal(err)
	}
	if h := held.held["pv/pv-1"]; h != string(first.UID) {
		t.Fatalf("after the first bind pv/pv-1 is held by %q, want the first claim's lingering reservation", h)
	}
	// The volume is Available again (recycled), as the API now has it.
	again, err := c.client.CoreV1().PersistentVolumes().Get(ctx, "pv-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	again.Spec.ClaimRef, again.Annotations, again.Status.Phase = nil, nil, corev1.VolumeAvailable
	if again, err = c.client.CoreV1().PersistentVolumes().Update(ctx, again, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.bind(ctx, again, next); err != nil {
		t.Fatalf("the next claim: %v", err)
	}
}
