package served

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// lister answers ListDrivers from a channel, so a test decides when (and
// whether) the provisioner answers; an error on errs fails the call.
type lister struct {
	answers chan []string
	errs    chan error
	calls   atomic.Int32
}

func newLister() *lister { return &lister{answers: make(chan []string, 8), errs: make(chan error, 8)} }

func (l *lister) ListDrivers(ctx context.Context, _ *provisionerv1.ListDriversRequest, _ ...grpc.CallOption) (*provisionerv1.ListDriversResponse, error) {
	l.calls.Add(1)
	select {
	case names := <-l.answers:
		out := &provisionerv1.ListDriversResponse{}
		for _, n := range names {
			out.Drivers = append(out.Drivers, &provisionerv1.Driver{DriverName: n, ProvisionerName: n})
		}
		return out, nil
	case err := <-l.errs:
		return nil, err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// clock is a settable time for Cache.now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newCache(l Lister, o Options) (*Cache, *clock) {
	c := New(l, o, slog.New(slog.NewTextHandler(io.Discard, nil)))
	clk := &clock{t: time.Unix(1_000_000, 0)}
	c.now = clk.now
	return c, clk
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestNoProvisionerServesNothing(t *testing.T) {
	c := New(nil, Options{Period: time.Minute}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if s := c.Get(t.Context(), "a"); !s.Known || s.Has("a") {
		t.Fatalf("got %+v, want known and empty", s)
	}
}

func TestConcurrentFirstCallsShareOneRPC(t *testing.T) {
	l := newLister()
	c, _ := newCache(l, Options{Period: time.Minute})
	const callers = 20
	var wg sync.WaitGroup
	got := make([]Set, callers)
	for i := range callers {
		wg.Add(1)
		go func() { defer wg.Done(); got[i] = c.Get(t.Context(), "a") }()
	}
	// Every caller is waiting on the one call in flight.
	waitFor(t, "the first ListDrivers", func() bool { return l.calls.Load() == 1 })
	l.answers <- []string{"a"}
	wg.Wait()
	for i, s := range got {
		if !s.Known || !s.Has("a") {
			t.Fatalf("caller %d got %+v", i, s)
		}
	}
	if n := l.calls.Load(); n != 1 {
		t.Fatalf("%d ListDrivers calls for %d concurrent callers, want 1", n, callers)
	}
}

// A caller that found the cache empty just before the call in flight
// answered takes that answer: it does not start a second ListDrivers.
func TestLateFirstCallerTakesTheAnswerInFlight(t *testing.T) {
	l := newLister()
	c, clk := newCache(l, Options{Period: time.Minute})
	read := clk.now() // the late caller reads the empty cache here
	l.answers <- []string{"a"}
	if s := c.Get(t.Context(), "a"); !s.Has("a") {
		t.Fatalf("first answer not used: %+v", s)
	}
	if s := c.refresh(t.Context(), read); !s.Has("a") {
		t.Fatalf("late caller got %+v", s)
	}
	if n := l.calls.Load(); n != 1 {
		t.Fatalf("%d ListDrivers calls, want 1", n)
	}
	// An explicit Refresh still asks.
	l.answers <- []string{"a", "b"}
	if s := c.Refresh(t.Context()); !s.Has("b") {
		t.Fatalf("Refresh got %+v", s)
	}
}

func TestStaleAnswersAtOnceAndRefreshesBehind(t *testing.T) {
	l := newLister()
	c, clk := newCache(l, Options{Period: 10 * time.Second})
	l.answers <- []string{"a"}
	if s := c.Get(t.Context()); !s.Has("a") || s.Has("b") {
		t.Fatalf("first answer not used: %+v", s)
	}
	if s := c.Get(t.Context()); !s.Has("a") || l.calls.Load() != 1 {
		t.Fatalf("within the period: %+v after %d calls, want the cached answer after 1", s, l.calls.Load())
	}
	clk.add(20 * time.Second)
	// The provisioner does not answer the refresh yet: readers are not
	// blocked by it, however many.
	for range 50 {
		done := make(chan Set, 1)
		go func() { done <- c.Get(t.Context(), "b") }()
		select {
		case s := <-done:
			if !s.Has("a") {
				t.Fatalf("stale answer not used while refreshing: %+v", s)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Get blocked on a slow refresh")
		}
	}
	waitFor(t, "the background refresh to start", func() bool { return l.calls.Load() == 2 })
	l.answers <- []string{"b"}
	waitFor(t, "the background refresh to be used", func() bool { return c.Get(t.Context()).Has("b") })
	if n := l.calls.Load(); n != 2 {
		t.Fatalf("%d ListDrivers calls, want 2 (one refresh for every stale read)", n)
	}
}

func TestWaitForMissingAsksAgainAtMostOncePerRetry(t *testing.T) {
	l := newLister()
	c, clk := newCache(l, Options{Period: time.Hour, WaitForMissing: true})
	l.answers <- []string{"a"}
	if s := c.Get(t.Context(), "a"); !s.Has("a") {
		t.Fatalf("first answer: %+v", s)
	}
	// A name the list lacks, Retry after the last call: the caller waits
	// for a fresh answer.
	clk.add(DefaultRetry)
	l.answers <- []string{"a", "new"}
	if s := c.Get(t.Context(), "new"); !s.Has("new") {
		t.Fatalf("a driver just added is not seen: %+v", s)
	}
	// Missing again within Retry: the cached answer, no call.
	if s := c.Get(t.Context(), "other"); s.Has("other") || l.calls.Load() != 2 {
		t.Fatalf("%+v after %d calls, want the cache after 2", s, l.calls.Load())
	}
	clk.add(DefaultRetry)
	l.answers <- []string{"a", "new", "other"}
	if s := c.Get(t.Context(), "other"); !s.Has("other") || l.calls.Load() != 3 {
		t.Fatalf("%+v after %d calls, want a fresh answer after 3", s, l.calls.Load())
	}
}

func TestWithoutWaitForMissingAMissingNameDoesNotCall(t *testing.T) {
	l := newLister()
	c, _ := newCache(l, Options{Period: time.Hour})
	l.answers <- []string{"a"}
	c.Get(t.Context())
	if s := c.Get(t.Context(), "b"); s.Has("b") || l.calls.Load() != 1 {
		t.Fatalf("%+v after %d calls, want the cached answer after 1", s, l.calls.Load())
	}
}

func TestFailuresKeepTheLastAnswer(t *testing.T) {
	l := newLister()
	c, clk := newCache(l, Options{Period: time.Second})
	l.errs <- errors.New("provisioner down")
	if s := c.Get(t.Context()); s.Known || s.Err == nil {
		t.Fatalf("before any answer: %+v, want unknown with the error", s)
	}
	clk.add(DefaultRetry)
	l.answers <- []string{"a"}
	if s := c.Get(t.Context()); !s.Known || !s.Has("a") {
		t.Fatalf("after the first answer: %+v", s)
	}
	clk.add(time.Minute)
	l.errs <- errors.New("provisioner down again")
	c.Get(t.Context()) // starts a background refresh, which fails
	waitFor(t, "the failed refresh", func() bool { return l.calls.Load() == 3 && len(l.errs) == 0 })
	if s := c.Get(t.Context()); !s.Known || !s.Has("a") {
		t.Fatalf("a failed refresh lost the last answer: %+v", s)
	}
}

func TestACancelledCallerDoesNotCancelTheSharedCall(t *testing.T) {
	l := newLister()
	c, _ := newCache(l, Options{Period: time.Minute})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan Set, 1)
	go func() { done <- c.Get(ctx) }()
	waitFor(t, "the first ListDrivers", func() bool { return l.calls.Load() == 1 })
	cancel()
	if s := <-done; s.Known {
		t.Fatalf("a cancelled caller got %+v, want the unknown set", s)
	}
	l.answers <- []string{"a"}
	waitFor(t, "the shared call's answer", func() bool {
		// Within Retry, Get does not call again: it answers the cache.
		return c.Get(t.Context()).Has("a") || l.calls.Load() > 1
	})
	if n := l.calls.Load(); n != 1 {
		t.Fatalf("%d calls: the cancelled caller's call did not finish for the others", n)
	}
}

// fixedLister answers every ListDrivers with the same drivers.
type fixedLister []*provisionerv1.Driver

func (l fixedLister) ListDrivers(context.Context, *provisionerv1.ListDriversRequest, ...grpc.CallOption) (*provisionerv1.ListDriversResponse, error) {
	return &provisionerv1.ListDriversResponse{Drivers: l}, nil
}

// An endpoint the provisioner lists without a driver name (not probed
// yet, or its driver restarting) is in Unidentified: a name missing from
// the set may be that endpoint's.
func TestUnidentifiedEndpoints(t *testing.T) {
	c, _ := newCache(fixedLister{
		{Endpoint: "unix:///a.sock", DriverName: "a.csi", ProvisionerName: "a.csi", Ready: true},
		{Endpoint: "unix:///b.sock", Message: "GetPluginInfo: connection refused"},
	}, Options{Period: time.Minute})
	s := c.Get(t.Context())
	if !s.Known || !s.Has("a.csi") || len(s.Drivers) != 1 || !slices.Equal(s.Unidentified, []string{"unix:///b.sock"}) {
		t.Fatalf("got %+v", s)
	}
}
