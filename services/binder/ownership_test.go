package binder

import (
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
)

// claimWrite is one write of a claim's status by one replica.
type claimWrite struct {
	replica, claim string
	at             time.Time
}

// Two replicas share the API; the second joins, and the two see the new
// member list 100ms apart (the joiner first). Every claim's status is
// written again and again by whichever replica owns it. No claim is ever
// written by both: a claim moving to the joiner is last written by the
// first replica before the joiner's first write of it.
func TestTwoReplicasNeverWriteOneClaimAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settle   time.Duration
		overlaps bool
	}{
		{"settled", 500 * time.Millisecond, false},
		// Without the settle period the lagging replica writes claims the
		// joiner already writes: the test sees it.
		{"no settle", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var claims []runtime.Object
			for i := range 40 {
				cl := testClaim(fmt.Sprintf("c%02d", i))
				cl.Spec.StorageClassName = nil
				cl.Status.Phase = ""
				claims = append(claims, cl)
			}
			api := fake.NewClientset(claims...)
			var (
				mu     sync.Mutex
				writes []claimWrite
			)
			replica := func(id string, own *ownership) *controller {
				client := fake.NewClientset()
				client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" {
						cl := u.GetObject().(*corev1.PersistentVolumeClaim)
						mu.Lock()
						writes = append(writes, claimWrite{id, claimKey(cl), time.Now()})
						mu.Unlock()
						// The write "does not stick", so the claim is
						// written again at every resync.
						back := cl.DeepCopy()
						back.Status.Phase = ""
						return true, back, nil
					}
					return k8stesting.ObjectReaction(api.Tracker())(a)
				})
				recorder := record.NewFakeRecorder(0)
				recorder.Events = nil // discard
				c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), client, recorder)
				c.owns = own.owns
				c.Reset()
				for _, o := range claims {
					deliver(t, c, evAdded, o.(*corev1.PersistentVolumeClaim).DeepCopy())
				}
				c.Synced()
				go func() { _ = c.run(t.Context(), 4, 10*time.Millisecond) }()
				return c
			}
			ownA, ownB := newOwnership("a", tc.settle), newOwnership("b", tc.settle)
			ownA.set([]string{"a"})
			replica("a", ownA)
			replica("b", ownB)
			count := func(id string, owned func(string) bool) (n int) {
				mu.Lock()
				defer mu.Unlock()
				for _, w := range writes {
					if w.replica == id && owned("pvc/"+w.claim) {
						n++
					}
				}
				return n
			}
			ring := newOwnership("b", 0)
			ring.set([]string{"a", "b"})
			toB := func(key string) bool { return ring.current().Owner(key) == "b" }
			// a alone writes every claim, among them those about to move.
			waitFor(t, func() bool { return count("a", toB) >= 20 })
			ownB.set([]string{"a", "b"})
			// a's view lags: it still writes claims that are b's now, and
			// without a settle period b writes them too.
			seen := count("a", toB)
			waitFor(t, func() bool {
				return count("a", toB) >= seen+20 && (tc.settle > 0 || count("b", toB) > 0)
			})
			ownA.set([]string{"a", "b"})
			// b writes each of its claims a few times.
			waitFor(t, func() bool { return count("b", toB) >= 60 })

			mu.Lock()
			defer mu.Unlock()
			byClaim := map[string][]claimWrite{}
			for _, w := range writes {
				byClaim[w.claim] = append(byClaim[w.claim], w)
			}
			moved, overlaps := 0, 0
			for claim, ws := range byClaim {
				sort.Slice(ws, func(i, j int) bool { return ws[i].at.Before(ws[j].at) })
				firstB := -1
				for i, w := range ws {
					if w.replica == "b" {
						firstB = i
						break
					}
				}
				if firstB < 0 {
					continue
				}
				moved++
				for _, w := range ws[firstB:] {
					if w.replica == "a" {
						overlaps++
						if !tc.overlaps {
							t.Errorf("%s written by a at %s after b's first write at %s", claim, w.at.Format(time.StampMicro), ws[firstB].at.Format(time.StampMicro))
						}
						break
					}
				}
			}
			if moved == 0 {
				t.Fatal("no claim moved to the joining replica")
			}
			if tc.overlaps && overlaps == 0 {
				t.Fatal("without a settle period no overlap was seen: the test does not see what it should")
			}
		})
	}
}

// A lost session owns nothing at once; a new one waits the settle period.
func TestOwnershipStopsAtOnceAndStartsAfterSettling(t *testing.T) {
	o := newOwnership("a", 300*time.Millisecond)
	if o.owns("pv/x") || o.ready() {
		t.Fatal("owns before any member list")
	}
	o.set([]string{"a"})
	if o.owns("pv/x") || o.ready() {
		t.Fatal("owns or ready before the settle period")
	}
	waitFor(t, func() bool { return o.owns("pv/x") && o.ready() })
	o.set([]string{"a", "b"}) // another member joins: still ready
	if !o.ready() {
		t.Fatal("not ready after another member joined")
	}
	o.lose()
	if o.owns("pv/x") || o.ready() {
		t.Fatal("owns after the session was lost")
	}
	o.set([]string{"a"})
	if o.owns("pv/x") {
		t.Fatal("owns at once after a new session")
	}
	waitFor(t, func() bool { return o.owns("pv/x") })
	o.set([]string{"b"}) // a list without this replica
	if o.owns("pv/x") || o.ready() {
		t.Fatal("owns with a member list that does not list it")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
	}
}
