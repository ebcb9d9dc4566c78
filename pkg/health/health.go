package health

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ReadinessLoop is the heartbeat Loop beats.
const ReadinessLoop = "readiness-loop"

// DefaultHeartbeatTimeout is how long a heartbeat may go without a tick
// before /livez fails: far beyond any loop's interval, so that a slow,
// CPU-starved or garbage-collecting process is not mistaken for a wedged
// one.
const DefaultHeartbeatTimeout = 30 * time.Second

// Result is one check's outcome: Err nil means it passes.
type Result struct {
	Name string
	Err  error
}

// Checks is a service's readiness checks and liveness heartbeats. The zero
// value is not usable: call New.
type Checks struct {
	now func() time.Time

	mu    sync.Mutex
	ready []check
	// last is the verdict of the last Evaluate, at lastAt; every is the
	// interval Loop evaluates at (0 before Loop runs).
	last   []Result
	lastAt time.Time
	every  time.Duration
	beats  []*heartbeat
	// kick asks Loop to evaluate at once (Recheck).
	kick chan struct{}
}

type check struct {
	name string
	fn   func() error
}

type heartbeat struct {
	name    string
	timeout time.Duration
	last    time.Time
}

// New returns an empty set of checks.
func New() *Checks { return &Checks{now: time.Now, kick: make(chan struct{}, 1)} }

// Recheck asks Loop to evaluate the checks now rather than at its next
// tick, e.g. when a check's state has just changed (the first full list
// is in); it never blocks.
func (c *Checks) Recheck() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// AddReadiness adds a named readiness check; fn must not block (it reads
// state that other goroutines keep) and returns why the service is not
// ready, or nil.
func (c *Checks) AddReadiness(name string, fn func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ready = append(c.ready, check{name: name, fn: fn})
}

// Heartbeat adds a liveness heartbeat: /livez fails when the returned
// function has not been called for timeout (DefaultHeartbeatTimeout when
// 0). It counts as beaten now.
func (c *Checks) Heartbeat(name string, timeout time.Duration) (beat func()) {
	if timeout <= 0 {
		timeout = DefaultHeartbeatTimeout
	}
	h := &heartbeat{name: name, timeout: timeout}
	c.mu.Lock()
	h.last = c.now()
	c.beats = append(c.beats, h)
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		h.last = c.now()
		c.mu.Unlock()
	}
}

// Evaluate runs every readiness check, records the verdict for /readyz and
// returns it.
func (c *Checks) Evaluate() (ready bool, results []Result) {
	c.mu.Lock()
	checks := append([]check(nil), c.ready...)
	c.mu.Unlock()
	ready = true
	results = make([]Result, len(checks))
	for i, ch := range checks {
		results[i] = Result{Name: ch.name, Err: ch.fn()}
		ready = ready && results[i].Err == nil
	}
	c.mu.Lock()
	c.last, c.lastAt = results, c.now()
	c.mu.Unlock()
	return ready, results
}

// Loop evaluates the readiness checks every interval until ctx ends,
// beating the heartbeat ReadinessLoop, and calls set with each verdict and
// whether it differs from the previous one: another set of checks fails
// (the first verdict counts as a change; a failing check whose reason
// changes does not), so that the caller sets its gRPC health from it and
// logs the changes.
func (c *Checks) Loop(ctx context.Context, interval time.Duration, set func(ready, changed bool, results []Result)) {
	beat := c.Heartbeat(ReadinessLoop, max(DefaultHeartbeatTimeout, 10*interval))
	c.mu.Lock()
	c.every = interval
	c.mu.Unlock()
	t := time.NewTicker(interval)
	defer t.Stop()
	first, was := true, ""
	for {
		ready, results := c.Evaluate()
		beat()
		now := failing(results)
		set(ready, first || now != was, results)
		first, was = false, now
		select {
		case <-t.C:
		case <-c.kick:
		case <-ctx.Done():
			return
		}
	}
}

// failing names the checks that fail.
func failing(results []Result) string {
	var names []string
	for _, r := range results {
		if r.Err != nil {
			names = append(names, r.Name)
		}
	}
	return strings.Join(names, ",")
}

// Summary is results in one line, "etcd-session: not established;
// api-server: ..." (failures only), "ok" when every check passes: for
// logs.
func Summary(results []Result) string {
	var b strings.Builder
	for _, r := range results {
		if r.Err == nil {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(r.Name + ": " + r.Err.Error())
	}
	if b.Len() == 0 {
		return "ok"
	}
	return b.String()
}

// errNotEvaluated is the verdict before the readiness loop's first.
var errNotEvaluated = errors.New("not evaluated yet")

// readiness is what /readyz serves: the last verdict, unless the loop has
// not evaluated for several intervals.
func (c *Checks) readiness() []Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastAt.IsZero() {
		return []Result{{Name: ReadinessLoop, Err: errNotEvaluated}}
	}
	out := append([]Result(nil), c.last...)
	if c.every > 0 {
		if age := c.now().Sub(c.lastAt); age > max(10*c.every, 5*time.Second) {
			out = append(out, Result{Name: ReadinessLoop, Err: fmt.Errorf("last evaluated %s ago (every %s)", age.Round(time.Second), c.every)})
		}
	}
	return out
}

// liveness is what /livez serves: every heartbeat.
func (c *Checks) liveness() []Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	out := make([]Result, len(c.beats))
	for i, h := range c.beats {
		out[i] = Result{Name: h.name}
		if age := now.Sub(h.last); age > h.timeout {
			out[i].Err = fmt.Errorf("no tick for %s (timeout %s)", age.Round(time.Second), h.timeout)
		}
	}
	return out
}

// ReadyHandler serves /readyz: 200 when every readiness check passed at
// the last evaluation, else 503; the body lists every check.
func (c *Checks) ReadyHandler() http.Handler {
	return handler("readyz", c.readiness)
}

// LiveHandler serves /livez: 200 while every heartbeat ticks, else 503;
// the body lists every heartbeat.
func (c *Checks) LiveHandler() http.Handler {
	return handler("livez", c.liveness)
}

func handler(what string, results func() []Result) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var b strings.Builder
		ok := true
		for _, r := range results() {
			if r.Err == nil {
				fmt.Fprintf(&b, "[+]%s ok\n", r.Name)
				continue
			}
			ok = false
			// One line per check, whatever the error says.
			fmt.Fprintf(&b, "[-]%s failed: %s\n", r.Name, strings.ReplaceAll(r.Err.Error(), "\n", " "))
		}
		code := http.StatusOK
		if ok {
			fmt.Fprintf(&b, "%s check passed\n", what)
		} else {
			code = http.StatusServiceUnavailable
			fmt.Fprintf(&b, "%s check failed\n", what)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(b.String()))
	})
}
