package coord_test

import (
	"context"
	"errors"
	"testing"

	"github.com/volplane/volplane/pkg/coord"
)

func TestJournalWritesAreFencedOnTheLock(t *testing.T) {
	ctx := t.Context()
	a, b := newCoord(t, "/j1", 0), newCoord(t, "/j1", 0)

	if err := a.Put(ctx, "provision", "pv-1", "a", []byte("x")); !errors.Is(err, coord.ErrNotOwner) {
		t.Fatalf("put without the lock: got %v, want ErrNotOwner", err)
	}
	if err := a.Acquire(ctx, "provision", "pv-1", "a"); err != nil {
		t.Fatal(err)
	}
	if err := a.Put(ctx, "provision", "pv-1", "a", []byte("v1")); err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(ctx, "provision", "pv-1", "b"); !errors.Is(err, coord.ErrReserved) {
		t.Fatalf("a second owner: got %v, want ErrReserved", err)
	}
	// b pretending to be a: same holder name, but not a's lease.
	if err := b.Put(ctx, "provision", "pv-1", "a", []byte("evil")); !errors.Is(err, coord.ErrNotOwner) {
		t.Fatalf("put on another lease: got %v, want ErrNotOwner", err)
	}
	if err := b.Finish(ctx, "provision", "pv-1", "b"); !errors.Is(err, coord.ErrNotOwner) {
		t.Fatalf("finish by a non-owner: got %v, want ErrNotOwner", err)
	}
	r, ok, err := b.Get(ctx, "provision", "pv-1")
	if err != nil || !ok || string(r.Value) != "v1" || r.Holder != "a" {
		t.Fatalf("get: %+v %v %v, want value v1 held by a", r, ok, err)
	}
}

func TestJournalSurvivesItsOwnerAndIsTakenOver(t *testing.T) {
	ctx := t.Context()
	a, b := newCoord(t, "/j2", 0), newCoord(t, "/j2", 0)
	for _, n := range []string{"pv-2", "pv-1"} {
		if err := a.Acquire(ctx, "provision", n, "a"); err != nil {
			t.Fatal(err)
		}
		if err := a.Put(ctx, "provision", n, "a", []byte(n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Unlock(ctx, "provision", "pv-2", "a"); err != nil {
		t.Fatal(err)
	}
	rs, err := b.List(ctx, "provision")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Name != "pv-1" || rs[0].Holder != "a" || rs[1].Name != "pv-2" || rs[1].Holder != "" {
		t.Fatalf("list: %+v, want pv-1 held by a and pv-2 free", rs)
	}

	// a dies: its lock goes with its lease, its records stay.
	a.Close()
	if err := a.Put(context.Background(), "provision", "pv-1", "a", []byte("late")); err == nil {
		t.Fatal("a put after its session closed succeeded")
	}
	if err := b.Acquire(ctx, "provision", "pv-1", "b"); err != nil {
		t.Fatalf("take over a dead owner's operation: %v", err)
	}
	r, ok, err := b.Get(ctx, "provision", "pv-1")
	if err != nil || !ok || string(r.Value) != "pv-1" || r.Holder != "b" {
		t.Fatalf("get after takeover: %+v %v %v", r, ok, err)
	}
	if err := b.Finish(ctx, "provision", "pv-1", "b"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := b.Get(ctx, "provision", "pv-1"); ok {
		t.Fatal("record still there after Finish")
	}
	if h, _ := b.Holder(ctx, "op/provision/pv-1"); h != "" {
		t.Fatalf("lock still held by %q after Finish", h)
	}
}

func TestJournalRejectsBadNames(t *testing.T) {
	c := newCoord(t, "/j3", 0)
	for _, tc := range []struct{ kind, name string }{{"", "x"}, {"k", ""}, {"k/x", "y"}, {"k", "a/b"}} {
		t.Run(tc.kind+"|"+tc.name, func(t *testing.T) {
			if err := c.Acquire(t.Context(), tc.kind, tc.name, "h"); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

func TestAcquireGetTakesTheLockAndReadsTheRecord(t *testing.T) {
	ctx := t.Context()
	a, b := newCoord(t, "/j4", 0), newCoord(t, "/j4", 0)
	if _, ok, err := a.AcquireGet(ctx, "provision", "pv-1", "a"); err != nil || ok {
		t.Fatalf("first: ok=%v err=%v, want the lock and no record", ok, err)
	}
	if err := a.Put(ctx, "provision", "pv-1", "a", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if r, ok, err := a.AcquireGet(ctx, "provision", "pv-1", "a"); err != nil || !ok || string(r.Value) != "v" {
		t.Fatalf("again by the holder: %+v %v %v", r, ok, err)
	}
	if _, _, err := b.AcquireGet(ctx, "provision", "pv-1", "b"); !errors.Is(err, coord.ErrReserved) {
		t.Fatalf("another holder: %v, want ErrReserved", err)
	}
}
