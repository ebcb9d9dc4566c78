package health

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable time for the checks.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newChecks() (*Checks, *clock) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	c := New()
	c.now = clk.now
	return c, clk
}

func get(t *testing.T, h http.Handler) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func TestReadyz(t *testing.T) {
	for _, tc := range []struct {
		name     string
		etcd     error
		api      error
		evaluate bool
		age      time.Duration
		want     int
		lines    []string
	}{
		{name: "before the first evaluation", want: 503,
			lines: []string{"[-]readiness-loop failed: not evaluated yet", "readyz check failed"}},
		{name: "ready", evaluate: true, want: 200,
			lines: []string{"[+]etcd-session ok", "[+]api-server ok", "readyz check passed"}},
		{name: "waiting for etcd", evaluate: true, etcd: errors.New("not established"), want: 503,
			lines: []string{"[-]etcd-session failed: not established", "[+]api-server ok", "readyz check failed"}},
		{name: "every reason, one line each", evaluate: true, etcd: errors.New("lost\nreopening"), api: errors.New("no answer for 12s"), want: 503,
			lines: []string{"[-]etcd-session failed: lost reopening", "[-]api-server failed: no answer for 12s"}},
		{name: "the loop stopped long ago", evaluate: true, age: time.Minute, want: 503,
			lines: []string{"[+]etcd-session ok", "[-]readiness-loop failed: last evaluated 1m0s ago (every 1s)"}},
		{name: "a slow loop is still current", evaluate: true, age: 4 * time.Second, want: 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, clk := newChecks()
			c.AddReadiness("etcd-session", func() error { return tc.etcd })
			c.AddReadiness("api-server", func() error { return tc.api })
			if tc.evaluate {
				c.every = time.Second
				c.Evaluate()
			}
			clk.advance(tc.age)
			code, body := get(t, c.ReadyHandler())
			if code != tc.want {
				t.Errorf("code %d, want %d; body:\n%s", code, tc.want, body)
			}
			for _, l := range tc.lines {
				if !strings.Contains(body, l+"\n") {
					t.Errorf("no line %q in:\n%s", l, body)
				}
			}
		})
	}
}

// /readyz serves the verdict the loop last set (the gRPC health), not a
// fresh one: they never disagree.
func TestReadyzServesTheLastVerdict(t *testing.T) {
	c, _ := newChecks()
	var etcd error
	c.AddReadiness("etcd-session", func() error { return etcd })
	c.Evaluate()
	etcd = errors.New("not established")
	if code, body := get(t, c.ReadyHandler()); code != 200 {
		t.Fatalf("before the next evaluation: %d\n%s", code, body)
	}
	c.Evaluate()
	if code, body := get(t, c.ReadyHandler()); code != 503 {
		t.Fatalf("after it: %d\n%s", code, body)
	}
}

func TestLivez(t *testing.T) {
	c, clk := newChecks()
	// A replica waiting for etcd: not ready, and live.
	c.AddReadiness("etcd-session", func() error { return errors.New("not established") })
	beat := c.Heartbeat("main-loop", 30*time.Second)
	c.Heartbeat("other-loop", 0) // DefaultHeartbeatTimeout
	c.Evaluate()
	if code, body := get(t, c.LiveHandler()); code != 200 || !strings.Contains(body, "[+]main-loop ok\n") {
		t.Fatalf("waiting for etcd: %d\n%s", code, body)
	}
	clk.advance(20 * time.Second)
	beat()
	clk.advance(20 * time.Second)
	code, body := get(t, c.LiveHandler())
	if code != 503 || !strings.Contains(body, "[+]main-loop ok\n") || !strings.Contains(body, "[-]other-loop failed: no tick for 40s (timeout 30s)\n") ||
		!strings.HasSuffix(body, "livez check failed\n") {
		t.Fatalf("one loop wedged: %d\n%s", code, body)
	}
}

func TestLoop(t *testing.T) {
	c := New()
	var mu sync.Mutex
	var etcd error = errors.New("not established")
	c.AddReadiness("etcd-session", func() error {
		mu.Lock()
		defer mu.Unlock()
		return etcd
	})
	type call struct{ ready, changed bool }
	calls := make(chan call, 100)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Loop(ctx, 10*time.Millisecond, func(ready, changed bool, _ []Result) {
			select {
			case calls <- call{ready, changed}:
			default:
			}
		})
	}()
	next := func() call {
		t.Helper()
		select {
		case cl := <-calls:
			return cl
		case <-time.After(10 * time.Second):
			t.Fatal("the loop does not evaluate")
		}
		return call{}
	}
	if cl := next(); cl.ready || !cl.changed {
		t.Fatalf("first verdict %+v, want not ready, changed", cl)
	}
	if cl := next(); cl.ready || cl.changed {
		t.Fatalf("second verdict %+v, want not ready, unchanged", cl)
	}
	mu.Lock()
	etcd = nil
	mu.Unlock()
	for {
		if cl := next(); cl.ready {
			if !cl.changed {
				t.Fatalf("verdict %+v: ready without a change", cl)
			}
			break
		}
	}
	if code, body := get(t, c.LiveHandler()); code != 200 || !strings.Contains(body, "[+]readiness-loop ok\n") {
		t.Fatalf("livez: %d\n%s", code, body)
	}
	cancel()
	<-done
}

func TestSummary(t *testing.T) {
	if s := Summary([]Result{{Name: "a"}, {Name: "b"}}); s != "ok" {
		t.Errorf("all pass: %q", s)
	}
	if s := Summary([]Result{{Name: "a", Err: errors.New("x")}, {Name: "b"}, {Name: "c", Err: errors.New("y")}}); s != "a: x; c: y" {
		t.Errorf("failures: %q", s)
	}
}
