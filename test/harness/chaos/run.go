package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultDuration  = 5 * time.Minute
	DefaultKillEvery = 5 * time.Second
	DefaultConverge  = 3 * time.Minute
)

// Options configures Run.
type Options struct {
	// Cluster says where the binaries are and where to put the cluster;
	// Run sets the replica counts of the chaos run (2 watchers, 3
	// binders, 2 provisioners, 2 reclaimers, the gateway) unless Replicas
	// is set.
	Cluster ClusterOptions
	// Replicas keeps Cluster's replica counts as given.
	Replicas bool
	// Seed makes the storm and the faults repeatable (the same objects,
	// order, deletions, victims and times).
	Seed uint64
	// Duration is how long the storm and the faults last; default
	// DefaultDuration.
	Duration time.Duration
	// StaticPairs, DynamicClaims and Deletions size the storm.
	StaticPairs, DynamicClaims, Deletions int
	// KillEvery is the mean time between two SIGKILLs of a random
	// replica; default DefaultKillEvery.
	KillEvery time.Duration
	// Converge bounds the wait for the cluster to converge after the last
	// fault; default DefaultConverge.
	Converge time.Duration
	// RebindReleased turns the binder's rebind of Released volumes on for
	// the run (docs/rebind.md): the classes and most static PVs carry the
	// policy, a third of the dynamic claims are of a Retain class, and half
	// the deleted claims are created again under their old name, so
	// volumes are rebound while replicas are killed. The rebinds are
	// counted and judged (InvRebindRules); a run with none is a
	// violation, for it proves nothing.
	RebindReleased bool
	// Out receives progress and the report; nil discards.
	Out io.Writer
}

// Report is what a run found.
type Report struct {
	// Result is the invariant table.
	Result Result
	// Faults lists the faults made, in order.
	Faults []string
	// Converged is the time from the end of the last fault until every
	// check held, or 0 if they never did within Options.Converge.
	Converged time.Duration
	// Rebinds are the rebinds the watch saw.
	Rebinds []Rebind
}

// Run starts a cluster, storms it while killing its parts, waits for it
// to converge and checks the invariants. The error is for a run that
// could not be carried out; violations are in the report.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Duration <= 0 {
		o.Duration = DefaultDuration
	}
	if o.KillEvery <= 0 {
		o.KillEvery = DefaultKillEvery
	}
	if o.Converge <= 0 {
		o.Converge = DefaultConverge
	}
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	var outMu sync.Mutex
	began := time.Now()
	logf := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, "[%6.1fs] %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}
	co := o.Cluster
	if !o.Replicas {
		co.Watchers, co.Binders, co.Provisioners, co.Reclaimers, co.Gateway = 2, 3, 2, 2, true
	}
	co.Logf = logf
	rebindNote := ""
	if o.RebindReleased {
		rebindNote = "; rebind of Released volumes on"
	}
	logf("seed %d: %d static pairs, %d dynamic claims, %d deletions over %s; a SIGKILL every ~%s; %d etcd member(s)%s",
		o.Seed, o.StaticPairs, o.DynamicClaims, o.Deletions, o.Duration, o.KillEvery, max(co.EtcdMembers, 1), rebindNote)
	c, err := StartCluster(ctx, co)
	if err != nil {
		return nil, err
	}
	defer c.Stop()

	rep := &Report{}
	book := NewBook()
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
	s := &storm{c: c, b: book, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), logf: logf, rebind: o.RebindReleased}
	if err := s.setup(ctx); err != nil {
		return nil, fmt.Errorf("storm setup: %w", err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	flips := WatchFlips(runCtx, c.Client)
	journaled := WatchJournal(runCtx, c)
	go func() {
		for sleep(runCtx, time.Second) {
			_ = book.MarkBound(runCtx, c)
		}
	}()
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		c.supervise(runCtx, logf)
	}()

	// The storm over the first 60% of the run, the faults over all of it.
	plan := s.plan(o.StaticPairs, o.DynamicClaims, o.Deletions, o.Duration*6/10)
	stormDone := make(chan struct{})
	go func() {
		defer close(stormDone)
		s.run(runCtx, plan)
	}()
	f := &faults{c: c, rng: rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64())), logf: logf}
	lastFault := f.run(runCtx, o.Duration, o.KillEvery)
	rep.Faults = f.done
	<-stormDone
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	st, dy, del, _ := book.Counts()
	logf("storm over: %d static and %d dynamic claims made, %d deleted, %d made again under a deleted one's name; %d faults; waiting for convergence (up to %s)",
		st, dy, del, book.Recreations(), len(f.done), o.Converge)

	// Converge: every check holds.
	deadline := time.Now().Add(o.Converge)
	var res Result
	for {
		_ = book.MarkBound(ctx, c)
		res, err = Check(ctx, c, book)
		if err == nil && res.Violations() == 0 {
			rep.Converged = time.Since(lastFault)
			// Markers of the claims that bound last.
			_ = book.MarkBound(ctx, c)
			res, err = Check(ctx, c, book)
			break
		}
		if time.Now().After(deadline) {
			break
		}
		if !sleep(ctx, time.Second) {
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("check: %w", err)
	}
	stopRun()
	bg.Wait()
	flipped, _, gaps := flips.Result()
	res.add(InvFlips, flipped)
	if gaps > 0 {
		res.Rows[len(res.Rows)-1].Examples = append(res.Rows[len(res.Rows)-1].Examples, fmt.Sprintf("(the watch relisted %d times)", gaps))
	}
	rep.Rebinds = flips.Rebinds()
	broken, err := CheckRebinds(ctx, c, book, rep.Rebinds, journaled, ClassPolicies(o.RebindReleased))
	if err != nil {
		return nil, fmt.Errorf("check rebinds: %w", err)
	}
	res.add(InvRebindRules, broken)
	if g := journaled.Gaps(); g > 0 {
		res.Rows[len(res.Rows)-1].Examples = append(res.Rows[len(res.Rows)-1].Examples, fmt.Sprintf("(the journal watch read afresh %d times)", g))
	}
	rebound := Row{Invariant: InvRebinds, Info: fmt.Sprint(len(rep.Rebinds))}
	if o.RebindReleased && len(rep.Rebinds) == 0 {
		rebound = Row{Invariant: InvRebinds, Count: 1, Examples: []string{"none with the policy on: the run proves nothing about rebinding"}}
	}
	res.Rows = append(res.Rows, rebound)
	var crashed []string
	for _, r := range append(append([]*Replica{c.CSI}, c.Etcd...), c.Services...) {
		if n := r.Crashes(); n > 0 {
			crashed = append(crashed, fmt.Sprintf("%s x%d", r.Name, n))
		}
	}
	res.add("replicas that exited on their own", crashed)
	conv := Row{Invariant: InvConvergence, Info: rep.Converged.Round(100 * time.Millisecond).String()}
	if rep.Converged == 0 {
		conv = Row{Invariant: InvConvergence, Count: 1, Examples: []string{"not converged within " + o.Converge.String()}}
	}
	res.Rows = append(res.Rows, conv)
	rep.Result = res

	st, dy, del, marks := book.Counts()
	outMu.Lock()
	fmt.Fprintf(out, "\nchaos run, seed %d, %s: %d static and %d dynamic claims, %d deleted, %d made again under their name, %d rebinds, %d markers written; %d faults: %s\n\n",
		o.Seed, o.Duration, st, dy, del, book.Recreations(), len(rep.Rebinds), marks, len(rep.Faults), summarize(rep.Faults))
	res.Print(out)
	fmt.Fprintf(out, "\n%d violated invariant(s)\n", res.Violations())
	outMu.Unlock()
	return rep, nil
}

// supervise restarts a replica that exited on its own, as a kubelet would
// (it is counted as a crash in the report).
func (c *Cluster) supervise(ctx context.Context, logf func(string, ...any)) {
	seen := map[*Replica]int{}
	for sleep(ctx, time.Second) {
		for _, r := range append([]*Replica{c.CSI}, c.Services...) {
			if n := r.Crashes(); n > seen[r] && !r.Running() {
				seen[r] = n
				logf("%s exited on its own (status %d; log %s): restarting", r.Name, r.ExitCode(), r.LogPath())
				if err := r.Start(); err != nil {
					logf("restart %s: %v", r.Name, err)
				}
			}
		}
	}
}

// faults makes the run's faults: a random replica killed every ~KillEvery,
// etcd restarted once (each member in turn for three), the apiserver
// restarted once and the CSI driver killed once.
type faults struct {
	c    *Cluster
	rng  *rand.Rand
	logf func(string, ...any)
	done []string
}

type scheduled struct {
	at   time.Duration
	name string
	do   func(ctx context.Context) error
}

// run makes the faults over d and returns when the last one is over.
func (f *faults) run(ctx context.Context, d, every time.Duration) time.Time {
	var plan []scheduled
	if len(f.c.Etcd) == 1 {
		plan = append(plan, scheduled{at: d * 3 / 10, name: "etcd restart", do: f.restartEtcd(f.c.Etcd[0])})
	} else {
		for i, m := range f.c.Etcd {
			plan = append(plan, scheduled{at: d * time.Duration(2+2*i) / 10, name: "kill " + m.Name, do: f.restartEtcd(m)})
		}
	}
	plan = append(plan,
		scheduled{at: d * 5 / 10, name: "kube-apiserver restart", do: f.restartAPIServer},
		scheduled{at: d * 7 / 10, name: "kill CSI driver", do: f.restartCSI})
	start := time.Now()
	last := start
	nextKill := f.jitter(every)
	for {
		elapsed := time.Since(start)
		if elapsed >= d {
			return last
		}
		if len(plan) > 0 && elapsed >= plan[0].at {
			p := plan[0]
			plan = plan[1:]
			f.note(p.name)
			if err := p.do(ctx); err != nil {
				f.logf("fault %s: %v", p.name, err)
			}
			last = time.Now()
			continue
		}
		if elapsed >= nextKill {
			if victims := f.c.Services; len(victims) > 0 {
				r := victims[f.rng.IntN(len(victims))]
				f.note("SIGKILL " + r.Name)
				r.Kill()
				sleep(ctx, restartAfterMin+time.Duration(f.rng.IntN(int((restartAfterMax-restartAfterMin)/time.Millisecond)))*time.Millisecond)
				if err := r.Start(); err != nil {
					f.logf("restart %s: %v", r.Name, err)
				}
				last = time.Now()
			}
			nextKill = time.Since(start) + f.jitter(every)
			continue
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return last
		}
	}
}

func (f *faults) jitter(every time.Duration) time.Duration {
	return every/2 + time.Duration(f.rng.Int64N(int64(every)))
}

func (f *faults) note(what string) {
	f.done = append(f.done, what)
	f.logf("fault: %s", what)
}

func (f *faults) restartEtcd(m *Replica) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		m.Kill()
		sleep(ctx, 2*time.Second)
		if err := m.Start(); err != nil {
			return err
		}
		return f.c.WaitEtcd(ctx, time.Minute)
	}
}

func (f *faults) restartAPIServer(ctx context.Context) error {
	f.c.API.Kill()
	sleep(ctx, 2*time.Second)
	return f.c.API.Start(ctx)
}

func (f *faults) restartCSI(ctx context.Context) error {
	f.c.CSI.Kill()
	sleep(ctx, time.Second)
	return f.c.CSI.Start()
}

// summarize counts the faults by kind.
func summarize(faults []string) string {
	counts := map[string]int{}
	var order []string
	for _, f := range faults {
		k := f
		if strings.HasPrefix(f, "SIGKILL ") {
			k = "SIGKILL " + strings.TrimRight(strings.TrimPrefix(f, "SIGKILL "), "0123456789-")
		}
		if counts[k] == 0 {
			order = append(order, k)
		}
		counts[k]++
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%s x%d", k, counts[k]))
	}
	return strings.Join(parts, ", ")
}

// Err is nil when every invariant held, else an error naming the ones
// that did not.
func (r *Report) Err() error {
	if f := r.Result.Failing(); len(f) > 0 {
		return fmt.Errorf("%w: %d invariant(s) violated:\n  %s", errViolated, len(f), strings.Join(f, "\n  "))
	}
	return nil
}

var errViolated = errors.New("chaos run")

// A killed replica is started again between restartAfterMin and
// restartAfterMax after its SIGKILL (docs/chaos.md).
const (
	restartAfterMin = 200 * time.Millisecond
	restartAfterMax = 1700 * time.Millisecond
)
