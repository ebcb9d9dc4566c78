package binder

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
)

// scriptedReclaimer answers every hand-off with err and counts them.
type scriptedReclaimer struct {
	mu    sync.Mutex
	err   error
	calls int
}

func (r *scriptedReclaimer) Reclaim(context.Context, *corev1.PersistentVolume) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return r.err
}

func (r *scriptedReclaimer) answer(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

func (r *scriptedReclaimer) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// syncBuffer is a log destination the test reads while workers write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines counts the log lines with every one of words.
func (s *syncBuffer) lines(words ...string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for l := range strings.Lines(s.b.String()) {
		all := true
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			n++
		}
	}
	return n
}

// stays checks that cond holds for d (a retry with backoff would come
// after 5 ms, 10 ms, ...).
func stays(t *testing.T, d time.Duration, cond func() string) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if why := cond(); why != "" {
			t.Fatal(why)
		}
	}
}

// A hand-off the reclaimer refuses for the state of the volume or its
// claims (FailedPrecondition: here a claim that still exists) is not
// retried with backoff, and warns of nothing: the volume is handed over
// again when it changes, when its claim changes, and at the resync, and
// the refusal is logged once (at info) while its reason stays the same.
// A hand-off that fails for a reason that may pass by itself (the
// reclaimer unreachable) is retried with backoff, with a warning.
func TestARefusedHandOffWaitsForAChange(t *testing.T) {
	t.Parallel()
	v := testVolume("v")
	v.Annotations = map[string]string{kube.AnnDynamicallyProvisioned: "p"}
	v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "ns", Name: "data", UID: "uid-data"}
	v.Status.Phase = corev1.VolumeReleased
	claim := testClaim("data") // bound to another volume
	claim.Spec.VolumeName = "w"
	claim.Annotations = map[string]string{kube.AnnBindCompleted: "yes", kube.AnnBoundByController: "yes"}
	claim.Status.Phase = corev1.ClaimBound
	w := testVolume("w")
	w.Annotations = map[string]string{kube.AnnBoundByController: "yes"}
	w.Spec.ClaimRef = v.Spec.ClaimRef.DeepCopy()
	w.Status.Phase = corev1.VolumeBound
	c, _ := fedController(t, v.DeepCopy(), w, claim.DeepCopy())
	logs := &syncBuffer{}
	c.log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	refusal := `claim ns/data (uid uid-data) still exists: volume "v" is not released`
	rec := &scriptedReclaimer{err: status.Error(codes.FailedPrecondition, refusal)}
	c.reclaimer = rec
	before := retries(t, reasonReclaimer)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = c.run(ctx, 2, 0) }()

	handedOver := func(want int) {
		t.Helper()
		waitFor(t, func() bool { return rec.count() >= want })
		stays(t, 300*time.Millisecond, func() string {
			if n := rec.count(); n != want {
				return "handed over " + strconv.Itoa(n) + " times, want " + strconv.Itoa(want) + ": the refusal was retried"
			}
			if n := c.volumeQueue.retries("v"); n != 0 {
				return "the refused volume is in backoff: " + strconv.Itoa(n) + " retries"
			}
			return ""
		})
	}
	rv := 1
	touch := func(o interface{ SetResourceVersion(string) }) {
		rv++
		o.SetResourceVersion(strconv.Itoa(10 + rv))
	}

	// The watch's ADDED events queued the volume once.
	handedOver(1)

	// The claim changes (a label, say): the volume is looked at again.
	changed := claim.DeepCopy()
	changed.Labels = map[string]string{"app": "web"}
	touch(changed)
	deliver(t, c, evUpdated, changed)
	handedOver(2)

	// The volume changes.
	vc := v.DeepCopy()
	vc.Labels = map[string]string{"tier": "gold"}
	touch(vc)
	deliver(t, c, evUpdated, vc)
	handedOver(3)

	// The resync.
	c.enqueueAll()
	handedOver(4)

	if n := logs.lines("level=WARN"); n != 0 {
		t.Errorf("%d warnings for a refused hand-off:\n%s", n, logs.b.String())
	}
	if n := logs.lines("level=INFO", "refused", "volume=v"); n != 1 {
		t.Errorf("the refusal was logged at info %d times, want once:\n%s", n, logs.b.String())
	}
	if d := retries(t, reasonReclaimer) - before; d != 0 {
		t.Errorf("volplane_binder_retries_total{reason=%q} grew by %v for refusals", reasonReclaimer, d)
	}

	// The reclaimer cannot be reached: that is retried with backoff, and
	// warned about.
	rec.answer(status.Error(codes.Unavailable, "connection refused"))
	c.enqueueAll()
	waitFor(t, func() bool { return rec.count() >= 7 && c.volumeQueue.retries("v") >= 2 })
	if logs.lines("level=WARN", "connection refused") == 0 {
		t.Errorf("no warning for an unreachable reclaimer:\n%s", logs.b.String())
	}

	// It answers again, with a refusal: the backoff ends with it.
	rec.answer(status.Error(codes.FailedPrecondition, refusal))
	waitFor(t, func() bool { return c.volumeQueue.retries("v") == 0 })
	n := rec.count()
	handedOver(n)
}

// A hand-off the reclaimer took is made once: the volume's next changes
// (Failed, its finalizer removed, Terminating: each a watch event and a
// sync) do not hand it over again. A new release (another policy) is
// handed over at once, and so is the same release at the resync once the
// hand-off is older than the resync period (the safety net). A failed
// hand-off is not remembered: it is retried with backoff until one is
// taken.
//
// Not parallel: its failed hand-offs count in the process's retry metric,
// which TestARefusedHandOffWaitsForAChange reads.
func TestATakenHandOffIsNotRepeated(t *testing.T) {
	v := testVolume("v")
	v.Annotations = map[string]string{kube.AnnDynamicallyProvisioned: "p"}
	v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "ns", Name: "gone", UID: "uid-gone"}
	v.Status.Phase = corev1.VolumeReleased
	c, _ := fedController(t, v.DeepCopy())
	logs := &syncBuffer{}
	c.log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := &scriptedReclaimer{}
	c.reclaimer = rec
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = c.run(ctx, 2, 0) }()

	handedOver := func(want int) {
		t.Helper()
		waitFor(t, func() bool { return rec.count() >= want })
		stays(t, 300*time.Millisecond, func() string {
			if n := rec.count(); n != want {
				return "handed over " + strconv.Itoa(n) + " times, want " + strconv.Itoa(want)
			}
			return ""
		})
	}
	rv := 1
	update := func(change func(*corev1.PersistentVolume)) {
		rv++
		change(v)
		v.ResourceVersion = strconv.Itoa(10 + rv)
		deliver(t, c, evUpdated, v.DeepCopy())
	}
	handedOver(1)
	update(func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeFailed })
	update(func(v *corev1.PersistentVolume) { v.Finalizers = nil })
	update(func(v *corev1.PersistentVolume) { now := metav1.Now(); v.DeletionTimestamp = &now })
	c.enqueueAll() // a resync within the period
	handedOver(1)
	if n := logs.lines("level=DEBUG", "not handed over again", "volume=v"); n == 0 {
		t.Errorf("the skipped hand-offs were not logged at debug:\n%s", logs.b.String())
	}

	// Another policy is another release: handed over at once.
	update(func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	})
	handedOver(2)

	// The resync hands it over again once the period has passed.
	c.handed.mu.Lock()
	c.handed.ttl = time.Millisecond
	c.handed.mu.Unlock()
	time.Sleep(2 * time.Millisecond)
	c.enqueueAll()
	handedOver(3)

	// A failed hand-off is retried with backoff until one is taken, and
	// then not again.
	c.handed.mu.Lock()
	c.handed.ttl = time.Hour
	c.handed.mu.Unlock()
	rec.answer(status.Error(codes.Unavailable, "connection refused"))
	update(func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	})
	waitFor(t, func() bool { return rec.count() >= 6 })
	rec.answer(nil)
	waitFor(t, func() bool { return c.volumeQueue.retries("v") == 0 })
	handedOver(rec.count())
	update(func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeReleased })
	handedOver(rec.count())
}
