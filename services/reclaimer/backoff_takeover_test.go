package reclaimer

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// A reclaim whose holder stopped while its step backed off is taken over
// with the record's next attempt time, which the new holder keeps (the
// backoff is kept, TestBackoffIsKept); but the timer of that attempt died
// with the earlier holder, so the new holder must schedule the attempt
// itself. It did not: its first sync found the reclaim backing off and
// returned, nothing queued it again (the binder's hand-overs only return
// the held record), and the volume stayed Released with its journal record
// held by a live replica for good. Both ways in are tried: the periodic
// takeover and the binder handing the volume over.
func TestTakenOverBackoffIsScheduled(t *testing.T) {
	for _, tc := range []struct {
		name  string
		adopt func(t *testing.T, b *replica, v *corev1.PersistentVolume)
	}{
		{"takeover", func(t *testing.T, b *replica, _ *corev1.PersistentVolume) { b.takeOver(t.Context()) }},
		{"handed over by the binder", func(t *testing.T, b *replica, v *corev1.PersistentVolume) { b.start(t, v) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
			p.answer(nil, status.Error(codes.Unavailable, "provisioner restarting"))
			a := newReplica(t, "a", kc, j, p, config{})
			a.limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Hour, time.Hour)
			a.queue = workqueue.NewTypedRateLimitingQueue(a.limiter)
			t.Cleanup(a.queue.ShutDown)
			v := releasedPV("orphan", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver))
			kc.addPV(v)
			a.start(t, v)
			if rec := a.step(t, "orphan"); rec.NextAttemptTime == nil || p.calls() != 1 {
				t.Fatalf("after a failed DeleteVolume: %v, %d calls", rec, p.calls())
			}
			j.expire("a") // a is killed while its step backs off
			p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)

			clk := clocktesting.NewFakeClock(time.Now())
			b := newReplica(t, "b", kc, j, p, config{})
			b.now = clk.Now
			b.queue = workqueue.NewTypedRateLimitingQueueWithConfig(b.limiter, workqueue.TypedRateLimitingQueueConfig[string]{Clock: clk})
			t.Cleanup(b.queue.ShutDown)
			tc.adopt(t, b, kc.pv("orphan"))
			if rec := b.heldRecord("orphan"); rec == nil || rec.NextAttemptTime == nil {
				t.Fatalf("b holds %v", rec)
			}
			next := func() string {
				t.Helper()
				got := make(chan string, 1)
				go func() {
					if key, quit := b.queue.Get(); !quit {
						got <- key
					}
				}()
				deadline := time.After(10 * time.Second)
				for {
					select {
					case key := <-got:
						return key
					case <-deadline:
						t.Fatal("nothing queued: the reclaim taken over is never tried again")
					case <-time.After(10 * time.Millisecond):
						clk.Step(10 * time.Minute) // only a scheduled attempt becomes due
					}
				}
			}
			// The first sync finds the backoff still running: no DeleteVolume.
			key := next()
			b.handle(t.Context(), key)
			b.queue.Done(key)
			if p.calls() != 1 {
				t.Fatalf("DeleteVolume called %d times during the backoff", p.calls())
			}
			// The attempt comes once the backoff has run out.
			key = next()
			b.handle(t.Context(), key)
			b.queue.Done(key)
			rec, err := b.lookup(t.Context(), "orphan")
			if err != nil || rec.GetState() != reclaimerv1.State_STATE_SUCCEEDED || p.calls() != 2 || kc.pv("orphan") != nil || j.len() != 0 {
				t.Fatalf("record %v (%v), %d DeleteVolume calls, journal records %d", rec, err, p.calls(), j.len())
			}
		})
	}
}
