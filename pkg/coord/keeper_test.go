package coord_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/test/harness/devenv"
)

func until(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// etcd down for longer than the lease TTL: the Keeper does not give up; it
// is not Ready and fenced writes fail meanwhile; after etcd is back it has
// a new session and membership, the journal record is still there, and
// the old session's lock is not carried on (its writes are refused until
// the lock is taken again).
func TestKeeperSurvivesAnEtcdOutage(t *testing.T) {
	e, err := devenv.StartEtcd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	k, err := coord.NewKeeper(coord.Options{Endpoints: e.Endpoints, TTL: 2 * time.Second, DialTimeout: time.Second, Logger: quiet()}, "svc", "m1", "addr-1")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx) }()
	until(t, 10*time.Second, "a first session", k.Ready)
	if err := k.Acquire(ctx, "op", "x", "m1"); err != nil {
		t.Fatal(err)
	}
	if err := k.Put(ctx, "op", "x", "m1", []byte("step 1")); err != nil {
		t.Fatal(err)
	}
	first := k.Current().Lease()

	e.Stop()
	until(t, 15*time.Second, "the session counted as lost", func() bool { return !k.Ready() })
	if err := k.Put(ctx, "op", "x", "m1", []byte("step 2")); !errors.Is(err, coord.ErrSessionLost) {
		t.Fatalf("Put without a session: %v, want ErrSessionLost", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned during the outage: %v", err)
	case <-time.After(3 * time.Second): // longer than the TTL
	}
	if err := e.Restart(); err != nil {
		t.Fatal(err)
	}
	until(t, 30*time.Second, "a new session after etcd is back", k.Ready)
	if k.Current().Lease() == first {
		t.Fatal("the lost session's lease is in use again")
	}
	ms, err := k.Members(ctx, "svc")
	if err != nil || len(ms) != 1 || ms[0].ID != "m1" || ms[0].Address != "addr-1" {
		t.Fatalf("members after the outage: %v, %v", ms, err)
	}
	// The old lock is on the old lease: no write on it goes through...
	if err := k.Put(ctx, "op", "x", "m1", []byte("step 2")); !errors.Is(err, coord.ErrNotOwner) {
		t.Fatalf("Put on the lock of the lost session: %v, want ErrNotOwner", err)
	}
	// ...until the lock is taken again on the new session (once the old
	// lease has expired); the record outlived it all.
	until(t, 15*time.Second, "the operation taken over on the new session", func() bool {
		return k.Acquire(ctx, "op", "x", "m1") == nil && k.Put(ctx, "op", "x", "m1", []byte("step 2")) == nil
	})
	r, ok, err := k.Get(ctx, "op", "x")
	if err != nil || !ok || string(r.Value) != "step 2" || r.Holder != "m1" {
		t.Fatalf("record after the outage: %+v %v %v", r, ok, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
