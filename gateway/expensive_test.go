package gateway

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeClock is a settable now.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestLimiter(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	l := newLimiter(ExpensiveOptions{RequestsPerSecond: 2, Burst: 3, MaxInFlightPerUser: 2, MaxInFlight: 3, TrackedUsers: 100})
	l.now = clock.now
	ok := func(t *testing.T, user string) func() {
		t.Helper()
		release, no := l.acquire(user)
		if no != nil {
			t.Fatalf("%s refused: %s", user, no.message)
		}
		return release
	}
	refused := func(t *testing.T, user, flag string) *refusal {
		t.Helper()
		release, no := l.acquire(user)
		if no == nil {
			release()
			t.Fatalf("%s let in, want refused naming %s", user, flag)
		}
		if !strings.Contains(no.message, flag) {
			t.Fatalf("%s: %q does not name %s", user, no.message, flag)
		}
		return no
	}

	t.Run("rate, per user", func(t *testing.T) {
		for range 3 {
			ok(t, "alice")()
		}
		no := refused(t, "alice", "--expensive-requests-burst")
		if no.retryAfter <= 0 || no.retryAfter > time.Second {
			t.Errorf("retry after %v, want within a second (2 a second)", no.retryAfter)
		}
		// A refusal takes no token: after the wait, one more.
		clock.add(no.retryAfter)
		ok(t, "alice")()
		refused(t, "alice", "--expensive-requests-per-second")
		// Others have their own bucket.
		ok(t, "bob")()
		// Refilled at 2 a second.
		clock.add(1500 * time.Millisecond)
		for range 3 {
			ok(t, "alice")()
		}
		refused(t, "alice", "--expensive-requests-burst")
	})

	t.Run("concurrency, per user and in all", func(t *testing.T) {
		clock.add(time.Hour)
		r1, r2 := ok(t, "carol"), ok(t, "carol")
		if no := refused(t, "carol", "(--max-in-flight-expensive-per-user)"); no.retryAfter != time.Second {
			t.Errorf("retry after %v", no.retryAfter)
		}
		r3 := ok(t, "dave")
		refused(t, "erin", "(--max-in-flight-expensive)")
		r1()
		r1() // twice is once
		r4 := ok(t, "erin")
		refused(t, "carol", "(--max-in-flight-expensive)")
		r2()
		r3()
		r4()
		ok(t, "carol")()
		// A refused request took no slot.
		l.mu.Lock()
		inFlight := l.inFlight
		l.mu.Unlock()
		if inFlight != 0 {
			t.Fatalf("%d in flight after every release", inFlight)
		}
	})

	t.Run("memory is bounded", func(t *testing.T) {
		clock.add(time.Hour)
		held := ok(t, "frank")
		for i := range 10000 {
			ok(t, fmt.Sprintf("user-%d", i))()
		}
		if n := l.tracked(); n > 100 {
			t.Fatalf("%d users tracked, want at most 100", n)
		}
		// A user with a request in flight is never forgotten (its count
		// would go wrong).
		l.mu.Lock()
		_, kept := l.users["frank"]
		l.mu.Unlock()
		if !kept {
			t.Fatal("a user with a request in flight was dropped")
		}
		held()
	})
}

// Through the gateway: the expensive routes answer 429 with Retry-After
// and a JSON error per user, cheap routes are not limited, and a user's
// requests in flight are bounded.
func TestExpensiveRoutesAreLimitedPerUser(t *testing.T) {
	g := startGateway(t, func(o *Options) {
		o.Expensive = ExpensiveOptions{RequestsPerSecond: 0.001, Burst: 2, MaxInFlightPerUser: 1}
	})
	match := func(token string) (*http.Response, apiError) {
		return g.do(t, "POST", "/v1/namespaces/team/claims:match", token, strings.NewReader(`{"metadata":{"name":"x"}}`), "Content-Type", "application/json")
	}
	for range 2 {
		if resp, e := match("viewer-token"); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s %+v, want the backend's 404", resp.Status, e)
		}
	}
	resp, e := match("viewer-token")
	if resp.StatusCode != http.StatusTooManyRequests || e.Code != int(codes.ResourceExhausted) || !strings.Contains(e.Message, "--expensive-requests-burst") {
		t.Fatalf("%s %+v, want 429 naming the limit", resp.Status, e)
	}
	if ra := resp.Header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Fatalf("Retry-After %q", ra)
	}
	// Every route marked expensive is limited: the viewer's bucket is
	// empty for all of them.
	for _, rt := range routes {
		if !rt.Expensive || rt.write() {
			continue
		}
		var body *strings.Reader
		if rt.Method == "POST" {
			body = strings.NewReader("{}")
		}
		var resp *http.Response
		if body != nil {
			resp, _ = g.do(t, rt.Method, concrete(rt.Path), "viewer-token", body)
		} else {
			resp, _ = g.do(t, rt.Method, concrete(rt.Path), "viewer-token", nil)
		}
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s %s: %s, want 429", rt.Method, rt.Path, resp.Status)
		}
	}
	// Another user is not.
	if resp, e := match("operator-token"); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("operator: %s %+v", resp.Status, e)
	}
	// Nor are cheap routes.
	for range 5 {
		if resp, e := g.do(t, "GET", "/v1/claims", "viewer-token", nil); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("list: %s %+v", resp.Status, e)
		}
	}

	// In flight: the operator's first match blocks in the backend, the
	// second is refused at once.
	block, entered := make(chan struct{}), make(chan struct{}, 1)
	g.backend.mu.Lock()
	g.backend.answer = func(method string) error {
		entered <- struct{}{}
		<-block
		return status.Error(codes.NotFound, "fake backend: not found")
	}
	g.backend.mu.Unlock()
	done := make(chan int)
	go func() {
		req, _ := http.NewRequest("POST", g.url+"/v1/namespaces/team/claims:match", strings.NewReader(`{}`))
		req.Header.Set("Authorization", "Bearer operator-token")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	<-entered
	resp, e = match("operator-token")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(e.Message, "--max-in-flight-expensive-per-user") || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("%s %+v (Retry-After %q), want 429 naming the in-flight limit", resp.Status, e, resp.Header.Get("Retry-After"))
	}
	close(block)
	if code := <-done; code != http.StatusNotFound {
		t.Fatalf("the blocked match: %d", code)
	}
}
