package coord_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/test/harness/devenv"
)

var endpoints []string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "coord-etcd-")
	if err != nil {
		panic(err)
	}
	e, err := devenv.StartEtcd(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	endpoints = e.Endpoints
	code := m.Run()
	e.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

func newCoord(t *testing.T, prefix string, ttl time.Duration) *coord.Coordinator {
	t.Helper()
	c, err := coord.New(context.Background(), coord.Options{Endpoints: endpoints, Prefix: prefix, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestReserveIsExclusive(t *testing.T) {
	ctx := context.Background()
	a, b := newCoord(t, "/t1", 0), newCoord(t, "/t1", 0)
	if err := a.Reserve(ctx, "pv/x", "claim-1"); err != nil {
		t.Fatal(err)
	}
	if err := a.Reserve(ctx, "pv/x", "claim-1"); err != nil {
		t.Fatalf("the same holder again: %v", err)
	}
	if err := b.Reserve(ctx, "pv/x", "claim-2"); !errors.Is(err, coord.ErrReserved) {
		t.Fatalf("another holder: got %v, want ErrReserved", err)
	}
	if err := b.Release(ctx, "pv/x", "claim-2"); err != nil {
		t.Fatal(err)
	}
	if h, _ := a.Holder(ctx, "pv/x"); h != "claim-1" {
		t.Fatalf("a foreign release dropped the reservation: holder %q", h)
	}
	if err := a.Release(ctx, "pv/x", "claim-1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Reserve(ctx, "pv/x", "claim-2"); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

// ReleaseAll drops, in one transaction, each reservation its holder still
// has, and leaves the others' (a foreign holder, a repeated key, one never
// taken) as they are; more than MaxReleaseBatch is refused whole.
func TestReleaseAll(t *testing.T) {
	ctx := context.Background()
	a, b := newCoord(t, "/t-all", 0), newCoord(t, "/t-all", 0)
	var mine []coord.Reservation
	for i := range coord.MaxReleaseBatch - 2 {
		r := coord.Reservation{Resource: fmt.Sprintf("pv/%d", i), Holder: fmt.Sprintf("claim-%d", i)}
		if err := a.Reserve(ctx, r.Resource, r.Holder); err != nil {
			t.Fatal(err)
		}
		mine = append(mine, r)
	}
	if err := b.Reserve(ctx, "pv/other", "claim-b"); err != nil {
		t.Fatal(err)
	}
	batch := append(mine, coord.Reservation{Resource: "pv/other", Holder: "claim-x"}, mine[0])
	if err := a.ReleaseAll(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for _, r := range mine {
		if h, err := a.Holder(ctx, r.Resource); h != "" || err != nil {
			t.Fatalf("%s still held by %q (%v)", r.Resource, h, err)
		}
	}
	if h, _ := b.Holder(ctx, "pv/other"); h != "claim-b" {
		t.Fatalf("another holder's reservation was dropped: holder %q", h)
	}
	// One resource released by one holder, taken and released by the
	// next, within one batch: released for the second too.
	if err := a.Reserve(ctx, "pv/again", "claim-new"); err != nil {
		t.Fatal(err)
	}
	if err := a.ReleaseAll(ctx, []coord.Reservation{{Resource: "pv/again", Holder: "claim-old"}, {Resource: "pv/again", Holder: "claim-new"}}); err != nil {
		t.Fatal(err)
	}
	if h, err := a.Holder(ctx, "pv/again"); h != "" || err != nil {
		t.Fatalf("pv/again still held by %q (%v)", h, err)
	}
	if err := a.ReleaseAll(ctx, make([]coord.Reservation, coord.MaxReleaseBatch+1)); err == nil {
		t.Fatal("a batch over MaxReleaseBatch was taken")
	}
	if err := a.ReleaseAll(ctx, nil); err != nil {
		t.Fatalf("nothing to release: %v", err)
	}
}

// ReserveAll answers each reservation of a batch as Reserve would, in one
// transaction: free ones are taken on the session's lease, one the same
// holder has is kept, one another holder has is refused; a batch naming a
// resource twice, or over MaxReserveBatch, is refused whole and takes
// nothing.
func TestReserveAll(t *testing.T) {
	ctx := context.Background()
	a, b := newCoord(t, "/t-rall", 0), newCoord(t, "/t-rall", 0)
	if err := a.Reserve(ctx, "pv/mine", "claim-1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Reserve(ctx, "pv/theirs", "claim-b"); err != nil {
		t.Fatal(err)
	}
	batch := []coord.Reservation{
		{Resource: "pv/free-1", Holder: "claim-2"},
		{Resource: "pv/mine", Holder: "claim-1"},
		{Resource: "pv/theirs", Holder: "claim-3"},
		{Resource: "pv/free-2", Holder: "claim-3"},
	}
	errs, err := a.ReserveAll(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, nil, coord.ErrReserved, nil} {
		if !errors.Is(errs[i], want) || (want == nil && errs[i] != nil) {
			t.Errorf("%s for %s: %v, want %v", batch[i].Resource, batch[i].Holder, errs[i], want)
		}
	}
	for r, want := range map[string]string{"pv/free-1": "claim-2", "pv/mine": "claim-1", "pv/theirs": "claim-b", "pv/free-2": "claim-3"} {
		if h, err := a.Holder(ctx, r); h != want || err != nil {
			t.Errorf("%s held by %q (%v), want %q", r, h, err, want)
		}
	}
	resp, err := a.Client().Get(ctx, "/t-rall/reservations/pv/free-1")
	if err != nil || len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) != a.Lease() {
		t.Errorf("pv/free-1 not on the session's lease: %v %v", resp, err)
	}

	twice := []coord.Reservation{{Resource: "pv/twice", Holder: "claim-4"}, {Resource: "pv/twice", Holder: "claim-5"}}
	if _, err := a.ReserveAll(ctx, twice); err == nil {
		t.Error("a batch naming a resource twice was taken")
	}
	over := make([]coord.Reservation, coord.MaxReserveBatch+1)
	for i := range over {
		over[i] = coord.Reservation{Resource: fmt.Sprintf("pv/over-%d", i), Holder: "claim-6"}
	}
	if _, err := a.ReserveAll(ctx, over); err == nil {
		t.Error("a batch over MaxReserveBatch was taken")
	}
	for _, r := range []string{"pv/twice", "pv/over-0"} {
		if h, _ := a.Holder(ctx, r); h != "" {
			t.Errorf("a refused batch took %s for %q", r, h)
		}
	}
	if errs, err := a.ReserveAll(ctx, nil); err != nil || len(errs) != 0 {
		t.Errorf("nothing to reserve: %v %v", errs, err)
	}
}

func TestReserveRace(t *testing.T) {
	ctx := context.Background()
	cs := []*coord.Coordinator{newCoord(t, "/t2", 0), newCoord(t, "/t2", 0), newCoord(t, "/t2", 0)}
	var (
		mu   sync.Mutex
		wins = map[string]int{}
		wg   sync.WaitGroup
	)
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := range 10 {
				res := fmt.Sprintf("pv/%d", v)
				if err := cs[i%3].Reserve(ctx, res, fmt.Sprintf("claim-%d", i)); err == nil {
					mu.Lock()
					wins[res]++
					mu.Unlock()
				} else if !errors.Is(err, coord.ErrReserved) {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for v := range 10 {
		if n := wins[fmt.Sprintf("pv/%d", v)]; n != 1 {
			t.Errorf("pv/%d reserved by %d holders, want exactly 1", v, n)
		}
	}
}

// Batches from three replicas over the same resources: each resource still
// goes to exactly one holder.
func TestReserveAllRace(t *testing.T) {
	ctx := context.Background()
	cs := []*coord.Coordinator{newCoord(t, "/t2b", 0), newCoord(t, "/t2b", 0), newCoord(t, "/t2b", 0)}
	var (
		mu   sync.Mutex
		wins = map[string][]string{}
		wg   sync.WaitGroup
	)
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := fmt.Sprintf("claim-%d", i)
			for first := range 10 {
				// Overlapping windows of 5, in a different order per holder.
				var batch []coord.Reservation
				for k := range 5 {
					batch = append(batch, coord.Reservation{Resource: fmt.Sprintf("pv/%d", (first+k*(i%3+1))%13), Holder: holder})
				}
				errs, err := cs[i%3].ReserveAll(ctx, batch)
				if err != nil {
					t.Error(err)
					return
				}
				for j, e := range errs {
					switch {
					case e == nil:
						mu.Lock()
						if !slices.Contains(wins[batch[j].Resource], holder) {
							wins[batch[j].Resource] = append(wins[batch[j].Resource], holder)
						}
						mu.Unlock()
					case !errors.Is(e, coord.ErrReserved):
						t.Error(e)
					}
				}
			}
		}()
	}
	wg.Wait()
	for r, hs := range wins {
		if len(hs) != 1 {
			t.Errorf("%s reserved by %v, want exactly one holder", r, hs)
		}
	}
}

func TestMembershipFollowsTheSession(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watcher := newCoord(t, "/t3", 0)
	seen := make(chan []coord.Member, 16)
	go watcher.WatchMembers(ctx, "binder", func(ms []coord.Member) { seen <- ms })
	wait := func(n int) []coord.Member {
		t.Helper()
		for {
			select {
			case ms := <-seen:
				if len(ms) == n {
					return ms
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("never saw %d members", n)
			}
		}
	}
	wait(0)
	a := newCoord(t, "/t3", 0)
	if err := a.Register(ctx, "binder", "a", "10.0.0.1:9002"); err != nil {
		t.Fatal(err)
	}
	b, err := coord.New(ctx, coord.Options{Endpoints: endpoints, Prefix: "/t3"})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Register(ctx, "binder", "b", "10.0.0.2:9002"); err != nil {
		t.Fatal(err)
	}
	ms := wait(2)
	if ms[0] != (coord.Member{ID: "a", Address: "10.0.0.1:9002"}) || ms[1].ID != "b" {
		t.Fatalf("members %v", ms)
	}
	if err := b.Reserve(ctx, "pv/y", "claim-b"); err != nil {
		t.Fatal(err)
	}
	// A replica that goes away takes its membership and reservations with it.
	b.Close()
	if ms := wait(1); ms[0].ID != "a" {
		t.Fatalf("members %v", ms)
	}
	if h, err := a.Holder(ctx, "pv/y"); err != nil || h != "" {
		t.Fatalf("reservation of a closed session: holder %q, %v", h, err)
	}
	list, err := a.Members(ctx, "binder")
	if err != nil || len(list) != 1 {
		t.Fatalf("Members: %v %v", list, err)
	}
}

func TestLostSessionFencesReservations(t *testing.T) {
	ctx := context.Background()
	a := newCoord(t, "/t4", 0)
	// Revoke the lease behind the session's back, as an expiry would.
	if _, err := a.Client().Revoke(ctx, a.Lease()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("Done not closed after the lease was revoked")
	}
	if err := a.Reserve(ctx, "pv/z", "claim"); !errors.Is(err, coord.ErrSessionLost) {
		t.Fatalf("Reserve with a lost session: %v, want ErrSessionLost", err)
	}
	if _, err := a.ReserveAll(ctx, []coord.Reservation{{Resource: "pv/z", Holder: "claim"}}); !errors.Is(err, coord.ErrSessionLost) {
		t.Fatalf("ReserveAll with a lost session: %v, want ErrSessionLost", err)
	}
}

func TestRingSpreadsAndMovesLittle(t *testing.T) {
	three := coord.NewRing([]string{"a", "b", "c"})
	four := coord.NewRing([]string{"d", "c", "b", "a"})
	count := map[string]int{}
	moved := 0
	for i := range 3000 {
		k := fmt.Sprintf("pvc/ns/claim-%d", i)
		o := three.Owner(k)
		count[o]++
		if n := four.Owner(k); n != o && n != "d" {
			moved++
		}
	}
	for _, m := range []string{"a", "b", "c"} {
		if count[m] < 800 || count[m] > 1200 {
			t.Errorf("member %s owns %d of 3000 keys; want about 1000", m, count[m])
		}
	}
	if moved != 0 {
		t.Errorf("%d keys moved between old members when one joined; want 0", moved)
	}
	if (&coord.Ring{}).Owner("x") != "" || coord.NewRing([]string{"solo"}).Owner("x") != "solo" {
		t.Error("empty or single-member ring")
	}
}

// TestRevokedLeaseErrorIsRPCType pins what Reserve and the journal rely on
// to turn a write on an expired lease into ErrSessionLost: etcd's client
// returns rpctypes.ErrLeaseNotFound, matched by value, not by its text.
func TestRevokedLeaseErrorIsRPCType(t *testing.T) {
	ctx := context.Background()
	a := newCoord(t, "/t4b", 0)
	lease, err := a.Client().Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client().Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	_, err = a.Client().Txn(ctx).Then(clientv3.OpPut("/t4b/x", "v", clientv3.WithLease(lease.ID))).Commit()
	if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("write on a revoked lease: %v (%T), want rpctypes.ErrLeaseNotFound", err, err)
	}
}
