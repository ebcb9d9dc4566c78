package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/test/harness/devenv"
)

// Run runs the benchmark o describes and writes its report to o.Out: one
// burst (the default, or the ceiling alone with Ceiling), bursts
// interleaved with the ceiling (VsCeiling), or open-loop arrivals at each
// of Rates.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return err
	}
	// The load generator (and the ceiling's client) is this process: it
	// runs with what binds.
	if err := devenv.PinSelf(o.others); err != nil {
		return err
	}
	switch {
	case o.Compare > 0:
		return runCompare(ctx, &o)
	case o.Hop > 0:
		return runHop(ctx, &o)
	case o.VsCeiling > 0:
		return runVsCeiling(ctx, &o)
	case len(o.Rates) > 0:
		return runRates(ctx, &o)
	case o.Delete:
		return runDelete(ctx, &o)
	default:
		r, err := once(ctx, &o, o.system(), load{n: o.N, clients: o.Clients})
		if err != nil {
			return err
		}
		r.Print(o.Out)
		if o.ProfileDir != "" {
			return printCauses(o.Out, r, o.ProfileDir)
		}
		return nil
	}
}

// once measures l on a fresh control plane with sys binding.
func once(ctx context.Context, o *Options, sys system, l load) (*Result, error) {
	t, err := start(ctx, o, sys, l.claims())
	if err != nil {
		return nil, err
	}
	defer t.stop()
	return t.measure(ctx, l)
}

// measure creates the claims as l says and waits until every one is Bound
// (a burst fails if one is not within boundWait; open-loop arrivals report
// how many were not). Counters and CPU times are read before the first
// claim and after the last write of the last bind.
func (t *trial) measure(ctx context.Context, l load) (*Result, error) {
	n := l.claims()
	tr, err := newTracker(ctx, t.newClient("volplane-bench-tracker"), benchNamespace, n)
	if err != nil {
		return nil, err
	}
	defer tr.stop()
	procs := t.procList()
	before, err := t.metrics.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	cpu := sample(procs)
	if l.rate > 0 {
		fmt.Fprintf(t.o.Log, "creating %d claims at %g/s for %s (open loop)...\n", n, l.rate, l.duration)
	} else {
		fmt.Fprintf(t.o.Log, "creating %d claims and waiting until all are Bound...\n", n)
	}
	profiles := t.startProfiles(ctx, l, n)
	start := time.Now()
	var late Lateness // set before done is sent
	done := make(chan error, 1)
	var made atomic.Int64
	go func() {
		var err error
		late, err = l.create(ctx, func(i int) error {
			tr.sending(i)
			c, err := t.client.CoreV1().PersistentVolumeClaims(benchNamespace).Create(ctx, claim(i), metav1.CreateOptions{})
			if err == nil {
				made.Add(1)
				if t.ceiling != nil {
					t.ceiling.add(c)
				}
			}
			return err
		})
		done <- err
	}()
	window, err := t.waitBurst(ctx, tr, burst{n: n, start: start, done: done, sent: made.Load, prog: newProgress(n, start),
		sending: "create claims", open: l.rate > 0, stuck: "only %d of %d claims Bound within %s of the last create (log: %s)", watch: "claim"})
	if err != nil {
		return nil, err
	}
	lat, unbound, last := tr.latencies()
	if t.ceiling != nil {
		t.ceiling.drain()
	}
	after, err := t.quiesce(ctx)
	if err != nil {
		return nil, err
	}
	cpuAfter := sample(procs)
	if err := profiles(); err != nil {
		fmt.Fprintf(t.o.Log, "profile: %v\n", err)
	}
	r := &Result{
		System: t.o.name(t.sys), Placement: t.o.placement(), Dynamic: t.o.Dynamic, Claims: n, Rate: l.rate, Duration: l.duration,
		CreateWindow: window, Latency: summarize(lat), Unbound: unbound, Late: late,
		Setup: t.setup, Procs: usage(procs, cpu, cpuAfter), Requests: after.since(before),
	}
	r.Requests.Watches = r.Requests.Watches.minus(t.baseWatches)
	r.ClusterVolumes, r.ClusterClaims = t.setup.Existing.Volumes+t.pairs, t.setup.Existing.Claims+n
	if t.o.Dynamic {
		r.ClusterVolumes = t.setup.Existing.Volumes + n - unbound
	}
	if !last.IsZero() {
		r.Elapsed = last.Sub(start)
		r.PerSecond = float64(n-unbound) / r.Elapsed.Seconds()
	}
	return r, nil
}

// burst is one burst's wait: n claims sent from start (sent counts them)
// by the sender that reports on done.
type burst struct {
	n       int
	start   time.Time
	done    <-chan error
	sent    func() int64
	prog    *progress
	sending string // what the sender does, for its error
	// open: an open-loop run, whose claims still unbound when the wait
	// ends are counted, not an error.
	open  bool
	stuck string // the error of a closed-loop run that does not finish (done, n, wait, log)
	watch string // what the tracker watches
}

// waitBurst waits until the sender is done and the tracker has seen every
// claim through (or, open loop, until boundWait after the last send), with
// a progress line every progressEvery, and returns the sending window.
func (t *trial) waitBurst(ctx context.Context, tr *tracker, b burst) (time.Duration, error) {
	var window time.Duration
	var timeout <-chan time.Time
	done, all := b.done, tr.all
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for done != nil || all != nil {
		select {
		case now := <-tick.C:
			fmt.Fprintln(t.o.Log, b.prog.line(tr.boundCount(), int(b.sent()), now))
		case err := <-done:
			if err != nil {
				return 0, fmt.Errorf("%s: %w", b.sending, err)
			}
			window, done = time.Since(b.start), nil
			timeout = time.After(boundWait(b.n))
		case <-all:
			all = nil
		case <-timeout:
			if b.open {
				return window, nil
			}
			return 0, fmt.Errorf(b.stuck, tr.boundCount(), b.n, boundWait(b.n), t.logPath())
		case err := <-t.fail:
			return 0, err
		case <-tr.closed:
			return 0, errors.New(b.watch + " watch closed")
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return window, nil
}

// logPath is the log that explains a stuck run.
func (t *trial) logPath() string {
	if t.binder != nil {
		return t.binder.LogPath
	}
	return t.api.LogPath
}

// quiesce waits until the writes of the last binds (and their Events)
// have reached the apiserver, at most 10 s, and returns the counters then.
func (t *trial) quiesce(ctx context.Context) (snapshot, error) {
	s, err := t.metrics.snapshot(ctx)
	if err != nil {
		return s, err
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(time.Second):
		}
		next, err := t.metrics.snapshot(ctx)
		if err != nil {
			return s, err
		}
		if next.writes() == s.writes() {
			return next, nil
		}
		s = next
	}
	return s, nil
}
