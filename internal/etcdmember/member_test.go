package etcdmember

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/coord"
)

// worker is volplane at work on the cluster: a coord.Keeper that keeps
// rewriting a journal record and taking reservations, as the binder and
// the provisioner do all day.
type worker struct {
	k      *coord.Keeper
	ok     atomic.Int64
	failed atomic.Int64
	mu     sync.Mutex
	last   time.Time
	maxGap time.Duration
	errs   []string
}

func startWorker(t *testing.T, c *testCluster, log *slog.Logger) *worker {
	t.Helper()
	k, err := coord.NewKeeper(coord.Options{
		Endpoints: c.clientURLs(),
		Security:  coord.Security{CAFile: c.tls.CAFile, CertFile: c.tls.CertFile, KeyFile: c.tls.KeyFile},
		Logger:    log, AlarmPeriod: 100 * time.Millisecond,
	}, "binder", "binder-0", "addr")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &worker{k: k, last: time.Now()}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = k.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	eventually(t, time.Minute, func() string {
		if !k.Ready() {
			return "no etcd session"
		}
		return ""
	})
	wg.Add(1)
	go func() { defer wg.Done(); w.run(ctx) }()
	eventually(t, time.Minute, func() string {
		if w.ok.Load() < 10 {
			return fmt.Sprintf("the worker made %d writes", w.ok.Load())
		}
		return ""
	})
	return w
}

func (w *worker) run(ctx context.Context) {
	held := false
	for i := 0; ctx.Err() == nil; i++ {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var err error
		if !held {
			if err = w.k.Acquire(octx, "provision", "pv-a", "binder-0"); err == nil {
				held = true
			}
		}
		if err == nil {
			err = w.k.Put(octx, "provision", "pv-a", "binder-0", []byte("step "+strconv.Itoa(i)))
		}
		if err == nil {
			err = w.k.Reserve(octx, "pv/"+strconv.Itoa(i%50), "claim-"+strconv.Itoa(i%50))
		}
		cancel()
		w.mu.Lock()
		if err == nil {
			w.ok.Add(1)
			w.maxGap = max(w.maxGap, time.Since(w.last))
			w.last = time.Now()
		} else if ctx.Err() == nil {
			w.failed.Add(1)
			if len(w.errs) < 5 {
				w.errs = append(w.errs, err.Error())
			}
			if errors.Is(err, coord.ErrSessionLost) || errors.Is(err, coord.ErrNotOwner) {
				held = false
			}
		}
		w.mu.Unlock()
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
	}
}

func (w *worker) progress(t *testing.T, n int64) {
	t.Helper()
	from := w.ok.Load()
	eventually(t, time.Minute, func() string {
		if got := w.ok.Load() - from; got < n {
			return fmt.Sprintf("the worker made %d more writes, want %d", got, n)
		}
		return ""
	})
}

func (w *worker) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("%d writes, %d failed (%v), longest time without one %s", w.ok.Load(), w.failed.Load(), w.errs, w.maxGap.Round(time.Millisecond))
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Three members bootstrap a cluster together on empty directories; one
// loses its data (its pod's emptyDir) and comes back: it removes its
// former self, joins as a learner, is promoted, and the cluster is three
// voters again. Meanwhile volplane (a Keeper) keeps its session and keeps
// writing, while the members defragment themselves, one at a time.
func TestAWipedMemberRejoinsWhileVolplaneWorks(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three etcd members")
	}
	c := newTestCluster(t, 3, func(o *Options) {
		// Defragment at every turn that frees anything: the test watches
		// that turns never overlap and that the clients do not notice.
		o.DefragMinFreeBytes, o.DefragFreeRatio = 1, 0.000001
	})
	for i := range c.names {
		c.start(i)
	}
	cli := c.client()
	eventually(t, 2*time.Minute, func() string { return c.healthy(cli, 3) })
	if got := len(c.log.lines("starting", "action=bootstrap")) + len(c.log.lines("starting", "action=join")); got != 3 {
		t.Fatalf("%d members bootstrapped or joined the new cluster, want 3", got)
	}
	for i := range c.names {
		if code, body := get(t, c.metricsURL(i)+"/readyz"); code != http.StatusOK {
			t.Errorf("%s /readyz: %d %s", c.names[i], code, body)
		}
	}

	var wlog logSink
	w := startWorker(t, c, slog.New(slog.NewTextHandler(&wlog, nil)))
	lease := w.k.Current().Lease()
	former := memberID(t, cli, "etcd-2")

	c.stop(2)
	c.wipe(2)
	c.start(2)
	eventually(t, 3*time.Minute, func() string {
		if s := c.healthy(cli, 3); s != "" {
			return s
		}
		if id := memberID(t, cli, "etcd-2"); id == former {
			return "etcd-2 is still its former self"
		}
		return ""
	})
	eventually(t, 10*time.Second, func() string {
		if len(c.log.lines("member=etcd-2", "removed this member's former self")) == 0 || len(c.log.lines("member=etcd-2", "promoted this member")) == 0 {
			return "etcd-2 did not say it replaced its former self and was promoted"
		}
		return ""
	})
	if code, body := get(t, c.metricsURL(2)+"/metrics"); code != http.StatusOK || !regexp.MustCompile(`(?m)^volplane_etcd_member_replacements_total [1-9]`).MatchString(body) {
		t.Errorf("etcd-2 /metrics: %d, no replacement counted", code)
	}
	eventually(t, time.Minute, func() string {
		if code, body := get(t, c.metricsURL(2)+"/readyz"); code != http.StatusOK {
			return fmt.Sprintf("etcd-2 /readyz: %d %s", code, body)
		}
		return ""
	})

	w.progress(t, 50)
	// Every member has had its turn to defragment by now.
	eventually(t, time.Minute, func() string {
		for _, n := range c.names {
			if len(c.log.lines("member="+n, "defragmented this member")) == 0 {
				return n + " never defragmented"
			}
		}
		return ""
	})
	checkDefragTurns(t, c.log.lines("defragmented this member"))
	if got := w.k.Current(); got == nil || got.Lease() != lease {
		t.Fatalf("volplane's etcd session was lost meanwhile (%s)", w)
	}
	if err := w.k.Health(); err != nil {
		t.Fatalf("Health: %v", err)
	}
	r, ok, err := w.k.Get(t.Context(), "provision", "pv-a")
	if err != nil || !ok || !strings.HasPrefix(string(r.Value), "step ") {
		t.Fatalf("the journal record: %+v %v %v", r, ok, err)
	}
	t.Logf("volplane meanwhile: %s", w)
	t.Logf("defragmentations: %d", len(c.log.lines("defragmented this member")))
}

var (
	beganRE  = regexp.MustCompile(`began=(\S+)`)
	tookRE   = regexp.MustCompile(`took=(\S+)`)
	memberRE = regexp.MustCompile(`member=(\S+)`)
)

// checkDefragTurns fails when two members' defragmentations overlap.
func checkDefragTurns(t *testing.T, lines []string) {
	t.Helper()
	type span struct {
		member     string
		begin, end time.Time
	}
	var spans []span
	for _, l := range lines {
		b, d, m := beganRE.FindStringSubmatch(l), tookRE.FindStringSubmatch(l), memberRE.FindStringSubmatch(l)
		if b == nil || d == nil || m == nil {
			t.Fatalf("defragmentation line without began, took or member: %s", l)
		}
		begin, err := time.Parse(time.RFC3339Nano, b[1])
		if err != nil {
			t.Fatal(err)
		}
		took, err := time.ParseDuration(d[1])
		if err != nil {
			t.Fatal(err)
		}
		spans = append(spans, span{m[1], begin, begin.Add(took)})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin.Before(spans[j].begin) })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin.Before(spans[i-1].end) && spans[i].member != spans[i-1].member {
			t.Errorf("%s defragmented from %s while %s did until %s", spans[i].member, spans[i].begin.Format(time.StampMicro), spans[i-1].member, spans[i-1].end.Format(time.StampMicro))
		}
	}
}

// Two members lose their data at once: the survivor has no quorum, and
// the two cannot replace themselves without one. Once the survivor sees
// that every other member's data is gone, it starts again as a cluster
// of one with its data, and the two join it, one after the other.
func TestTheSurvivorOfTwoLostMembersRebuildsTheCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three etcd members")
	}
	c := newTestCluster(t, 3, func(o *Options) { o.RecoverQuorumAfter = 3 * time.Second })
	for i := range c.names {
		c.start(i)
	}
	cli := c.client()
	eventually(t, 2*time.Minute, func() string { return c.healthy(cli, 3) })
	ctx := t.Context()
	if _, err := cli.Put(ctx, "/volplane/journal/provision/pv-x", "kept"); err != nil {
		t.Fatal(err)
	}
	survivor := memberID(t, cli, "etcd-0")

	c.stop(1)
	c.stop(2)
	c.wipe(1)
	c.wipe(2)
	c.start(1)
	c.start(2)
	eventually(t, 4*time.Minute, func() string {
		if s := c.healthy(cli, 3); s != "" {
			return s
		}
		if memberID(t, cli, "etcd-0") != survivor {
			return "etcd-0 is not the survivor"
		}
		return ""
	})
	if len(c.log.lines("member=etcd-0", "starting again as a cluster of this member alone")) != 1 {
		t.Error("etcd-0 did not say it forced a cluster of one")
	}
	resp, err := cli.Get(ctx, "/volplane/journal/provision/pv-x")
	if err != nil || len(resp.Kvs) != 1 || !bytes.Equal(resp.Kvs[0].Value, []byte("kept")) {
		t.Fatalf("the survivor's data: %v %v", resp, err)
	}
}

// A member with data never waits for its peers, and a member without
// data never starts a new cluster while a peer it cannot reach might
// hold data: it says so on /readyz and waits.
func TestAnEmptyMemberWaitsForItsPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs an etcd member")
	}
	c := newTestCluster(t, 3, nil)
	c.start(0)
	eventually(t, time.Minute, func() string {
		code, body := get(t, c.metricsURL(0)+"/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd-1 (unreachable)") {
			return fmt.Sprintf("etcd-0 /readyz: %d %s", code, body)
		}
		if code, body := get(t, c.metricsURL(0)+"/livez"); code != http.StatusOK {
			return fmt.Sprintf("etcd-0 /livez while waiting: %d %s", code, body)
		}
		return ""
	})
	if hasData(c.dataDir(0)) {
		t.Fatal("etcd-0 started etcd alone")
	}
	c.start(1)
	c.start(2)
	cli := c.client()
	eventually(t, 2*time.Minute, func() string { return c.healthy(cli, 3) })
}

// While a new cluster bootstraps, the first member to start has no
// leader and the others are still empty: they have not begun, they lost
// nothing, and it must not take that for a lost quorum, however short
// --recover-quorum-after is.
func TestABootstrapIsNotMistakenForALostQuorum(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three etcd members")
	}
	c := newTestCluster(t, 3, func(o *Options) { o.RecoverQuorumAfter = 100 * time.Millisecond })
	for i := range c.names {
		c.start(i)
	}
	cli := c.client()
	eventually(t, 2*time.Minute, func() string { return c.healthy(cli, 3) })
	if l := c.log.lines("starting again as a cluster of this member alone"); len(l) != 0 {
		t.Fatalf("a bootstrap was taken for a lost quorum: %v", l)
	}
}
