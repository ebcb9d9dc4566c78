package reclaimer

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

const devDriver = "dev.csi.volplane.io"

func servedDev() *fakeProvisioner {
	return &fakeProvisioner{drivers: []*provisionerv1.Driver{{DriverName: devDriver, ProvisionerName: devDriver, Ready: true}}}
}

// start hands the volume to the replica as the binder does.
func (r *replica) start(t *testing.T, v *corev1.PersistentVolume) *reclaimerv1.Reclaim {
	t.Helper()
	rec, err := r.reclaim(t.Context(), v)
	if err != nil {
		t.Fatalf("reclaim %s: %v", v.Name, err)
	}
	return rec
}

// step runs one sync of the volume, as a worker would, and returns the
// record afterwards.
func (r *replica) step(t *testing.T, name string) *reclaimerv1.Reclaim {
	t.Helper()
	r.handle(t.Context(), name)
	rec, err := r.lookup(t.Context(), name)
	if err != nil || rec == nil {
		t.Fatalf("no record of %s after a step: %v", name, err)
	}
	return rec
}

func hasEvent(events []string, want string) bool {
	return slices.ContainsFunc(events, func(e string) bool { return strings.HasPrefix(e, want) })
}

func TestRetainTouchesNothing(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{})
	v := releasedPV("keep", corev1.PersistentVolumeReclaimRetain)
	kc.addPV(v)
	rec := r.start(t, v)
	if rec.State != reclaimerv1.State_STATE_RETAINED || rec.Method != reclaimerv1.Method_METHOD_NONE || rec.ClaimUid != "claim-uid" {
		t.Fatalf("record %v", rec)
	}
	if j.len() != 0 || r.queue.Len() != 0 || len(r.drain()) != 0 {
		t.Errorf("Retain journaled, queued or reported something: journal %d, queue %d", j.len(), r.queue.Len())
	}
	if got := kc.pv("keep"); got.Status.Phase != corev1.VolumeReleased || got.Spec.ClaimRef == nil {
		t.Errorf("volume changed: %+v", got)
	}
	// The binder asks again on every sync: the same answer.
	if again := r.start(t, v); !sameReclaim(again, rec) {
		t.Errorf("a second call started another reclaim: %v", again)
	}
}

func TestDeleteThroughTheProvisioner(t *testing.T) {
	for _, tc := range []struct {
		name       string
		resp       *provisionerv1.DeleteVolumeResponse
		err        error
		state      reclaimerv1.State
		phase      corev1.PersistentVolumePhase // "" means the volume is gone
		event      string
		retried    bool
		messageHas string
	}{
		{name: "finished", resp: &provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED},
			state: reclaimerv1.State_STATE_SUCCEEDED, messageHas: "deleted"},
		{name: "in background", resp: &provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, Message: "driver timed out"},
			state: reclaimerv1.State_STATE_RUNNING, phase: corev1.VolumeReleased, retried: true, messageHas: "driver timed out"},
		{name: "final driver error", resp: &provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, Message: "rpc error: code = Internal desc = disk busy"},
			state: reclaimerv1.State_STATE_FAILED, phase: corev1.VolumeFailed, retried: true,
			event: "Warning VolumeFailedDelete rpc error: code = Internal desc = disk busy", messageHas: "disk busy"},
		{name: "not deletable", err: status.Error(codes.FailedPrecondition, "volume has no CSI source"),
			state: reclaimerv1.State_STATE_FAILED, phase: corev1.VolumeFailed, retried: true,
			event: "Warning VolumeFailedDelete volume has no CSI source", messageHas: "no CSI source"},
		{name: "provisioner unreachable", err: status.Error(codes.Unavailable, "connection refused"),
			state: reclaimerv1.State_STATE_RUNNING, phase: corev1.VolumeReleased, retried: true, messageHas: "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
			p.answer(tc.resp, tc.err)
			r := newReplica(t, "me", kc, j, p, config{})
			v := releasedPV("pvc-1", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver),
				func(v *corev1.PersistentVolume) { v.Finalizers = []string{kube.FinalizerExternalProvisioner} })
			kc.addPV(v)
			if rec := r.start(t, v); rec.State != reclaimerv1.State_STATE_PENDING || rec.Method != reclaimerv1.Method_METHOD_PROVISIONER || rec.Driver != devDriver {
				t.Fatalf("started as %v", rec)
			}
			rec := r.step(t, "pvc-1")
			if rec.State != tc.state || !strings.Contains(rec.Message, tc.messageHas) || p.calls() != 1 {
				t.Fatalf("after the step: %v (DeleteVolume calls %d), want %s with %q", rec, p.calls(), tc.state, tc.messageHas)
			}
			got := kc.pv("pvc-1")
			switch {
			case tc.phase == "" && got != nil:
				t.Errorf("the volume is still there: %+v", got)
			case tc.phase != "" && (got == nil || got.Status.Phase != tc.phase):
				t.Errorf("volume %+v, want phase %s", got, tc.phase)
			}
			events := r.drain()
			if tc.event == "" && len(events) > 0 || tc.event != "" && !hasEvent(events, tc.event) {
				t.Errorf("events %q, want %q", events, tc.event)
			}
			if tc.retried != (rec.NextAttemptTime != nil) || tc.retried != (j.len() == 1) {
				t.Errorf("retried: next attempt %v, journal records %d; want retried %v", rec.NextAttemptTime, j.len(), tc.retried)
			}
			if !tc.retried {
				return
			}
			// The driver recovers: the retry finishes the job.
			p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
			if rec := r.step(t, "pvc-1"); rec.State != reclaimerv1.State_STATE_SUCCEEDED || rec.Attempts != 2 {
				t.Fatalf("after the retry: %v", rec)
			}
			if kc.pv("pvc-1") != nil || j.len() != 0 {
				t.Errorf("volume left, or journal not finished (%d records)", j.len())
			}
		})
	}
}

// A volume whose object was deleted first (Terminating, held by the
// external-provisioner finalizer) still gets its backing volume deleted;
// then the finalizer goes and with it the object.
func TestDeleteOfAVolumeDeletedFirst(t *testing.T) {
	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	r := newReplica(t, "me", kc, j, p, config{})
	now := metav1.Now()
	v := releasedPV("pvc-2", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver), func(v *corev1.PersistentVolume) {
		v.Finalizers = []string{"kubernetes.io/pv-protection", kube.FinalizerExternalProvisioner}
		v.DeletionTimestamp = &now
	})
	kc.addPV(v)
	r.start(t, v)
	if rec := r.step(t, "pvc-2"); rec.State != reclaimerv1.State_STATE_SUCCEEDED || p.calls() != 1 {
		t.Fatalf("%v, DeleteVolume calls %d", rec, p.calls())
	}
	got := kc.pv("pvc-2")
	if got == nil || !slices.Equal(got.Finalizers, []string{"kubernetes.io/pv-protection"}) {
		t.Fatalf("only the external-provisioner finalizer goes: %+v", got)
	}
}

// The reclaim's record is the deletion's only journal. When the volume
// (one without the external-provisioner finalizer) is deleted while the
// deletion of its backing volume is in flight, and the replica stops, the
// replica that takes the reclaim over still has the backing volume
// deleted, from the record's copy of the volume. A deletion that never
// began, or failed finally, is not finished that way.
func TestDeleteFinishedWhenTheVolumeVanishes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first *provisionerv1.DeleteVolumeResponse // nil: no attempt before the volume goes
		// refused: then a claim asks for the volume, and the guard
		// refuses the next attempt (the driver may have acted already).
		refused bool
		state   reclaimerv1.State
		calls   int
	}{
		{name: "in flight", first: &provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, Message: "driver timed out"},
			state: reclaimerv1.State_STATE_SUCCEEDED, calls: 2},
		{name: "in flight, then refused", first: &provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, Message: "driver timed out"},
			refused: true, state: reclaimerv1.State_STATE_SUCCEEDED, calls: 2},
		{name: "failed finally", first: &provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, Message: "disk busy"},
			state: reclaimerv1.State_STATE_CANCELLED, calls: 1},
		{name: "never began", state: reclaimerv1.State_STATE_CANCELLED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
			a := newReplica(t, "a", kc, j, p, config{})
			v := releasedPV("pvc-3", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver))
			kc.addPV(v)
			a.start(t, v)
			if tc.first != nil {
				p.answer(tc.first, nil)
				a.step(t, "pvc-3")
				rec, ok, err := j.Get(t.Context(), reclaimjournal.Kind, "pvc-3")
				if err != nil || !ok {
					t.Fatalf("no journal record: %v", err)
				}
				r, err := reclaimjournal.Decode(rec)
				if err != nil {
					t.Fatal(err)
				}
				if got, err := reclaimjournal.Deleting(r); (got != nil) != (tc.state == reclaimerv1.State_STATE_SUCCEEDED) || err != nil {
					t.Fatalf("journaled deletion %v (%v) of record %v", got, err, r)
				}
				if api, err := a.lookup(t.Context(), "pvc-3"); err != nil || len(answer(api).GetDeletingVolume()) != 0 {
					t.Errorf("the API shows the journal's copy of the volume: %v", err)
				}
			}
			if tc.refused {
				kc.addPVC(claim("other", "mine", "m", "pvc-3"))
				if rec := a.step(t, "pvc-3"); rec.State != reclaimerv1.State_STATE_PENDING || p.calls() != 1 {
					t.Fatalf("with a claim asking for the volume: %v, DeleteVolume calls %d", rec, p.calls())
				}
			}
			j.expire("a") // a stops
			if err := kc.DeleteVolume(t.Context(), "pvc-3", v.UID); err != nil {
				t.Fatal(err)
			}

			b := newReplica(t, "b", kc, j, p, config{})
			b.takeOver(t.Context())
			p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
			b.handle(t.Context(), "pvc-3")
			rec, err := b.lookup(t.Context(), "pvc-3")
			if err != nil || rec == nil || rec.State != tc.state || p.calls() != tc.calls || j.len() != 0 {
				t.Fatalf("record %v (%v), DeleteVolume calls %d, journal records %d; want %s after %d calls, nothing journaled",
					rec, err, p.calls(), j.len(), tc.state, tc.calls)
			}
		})
	}
}

// Volumes of provisioners volplane does not serve are another deleter's:
// nothing is journaled, nothing reported, the volume stays Released.
func TestDeleteLeftToOtherDeleters(t *testing.T) {
	for name, v := range map[string]*corev1.PersistentVolume{
		"other provisioner": releasedPV("a", corev1.PersistentVolumeReclaimDelete, withProvisionedBy("example.com/csi")),
		"other CSI driver":  releasedPV("b", corev1.PersistentVolumeReclaimDelete, withCSI("ebs.csi.aws.com")),
	} {
		t.Run(name, func(t *testing.T) {
			kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
			r := newReplica(t, "me", kc, j, p, config{})
			kc.addPV(v)
			rec := r.start(t, v)
			if rec.State != reclaimerv1.State_STATE_SKIPPED || j.len() != 0 || r.queue.Len() != 0 || len(r.drain()) != 0 || p.calls() != 0 {
				t.Errorf("record %v, journal %d, queue %d, DeleteVolume calls %d", rec, j.len(), r.queue.Len(), p.calls())
			}
		})
	}
}

// A volume SKIPPED as another deleter's is reclaimed as soon as the
// provisioner serves its driver, not when the record of the skip expires
// (RecordTTL, 10 minutes by default): issue 39's loose end.
func TestSkippedVolumeReclaimedOnceItsDriverIsServed(t *testing.T) {
	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	r := newReplica(t, "me", kc, j, p, config{ttl: time.Hour})
	v := releasedPV("pvc-ebs", corev1.PersistentVolumeReclaimDelete, withCSI("ebs.csi.aws.com"), withProvisionedBy("ebs.csi.aws.com"))
	kc.addPV(v)
	if rec := r.start(t, v); rec.State != reclaimerv1.State_STATE_SKIPPED {
		t.Fatalf("before the driver is served: %v", rec)
	}
	if rec := r.start(t, v); rec.State != reclaimerv1.State_STATE_SKIPPED || j.len() != 0 {
		t.Fatalf("asked again, nothing changed: %v, journal %d", rec, j.len())
	}
	p.mu.Lock()
	p.drivers = append(p.drivers, &provisionerv1.Driver{DriverName: "ebs.csi.aws.com", ProvisionerName: "ebs.csi.aws.com", Ready: true})
	p.mu.Unlock()
	r.drivers.Refresh(t.Context()) // the served drivers' next refresh
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	rec := r.start(t, v)
	if rec.State != reclaimerv1.State_STATE_PENDING || j.len() != 1 {
		t.Fatalf("once the driver is served: %v, journal %d; want a PENDING, journaled reclaim", rec, j.len())
	}
}

// The short chaos run's lost Delete volume: a claim deleted while the CSI
// driver restarts. The provisioner then lists the driver's endpoint
// without a name (GetPluginInfo fails), so the volume's driver was missing
// from its list and the reclaim was SKIPPED as another deleter's: final,
// not journaled, and answered from memory to every hand-over of the
// binder for RecordTTL (10 minutes), long after the driver was back. The
// volume stayed Released. It must wait for the driver instead, journaled
// and retried, and be deleted once the driver is identified again.
func TestDeleteWhileTheDriverRestarts(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	p := &fakeProvisioner{drivers: []*provisionerv1.Driver{{Endpoint: "unix:///csi/csi.sock",
		Message: "GetPluginInfo: rpc error: code = Unavailable desc = connection refused"}}}
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	r := newReplica(t, "me", kc, j, p, config{})
	v := releasedPV("pvc-1", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver))
	kc.addPV(v)
	rec := r.start(t, v)
	if rec.State != reclaimerv1.State_STATE_PENDING || j.len() != 1 || !strings.Contains(rec.Message, "waiting for the provisioner to identify the CSI driver at unix:///csi/csi.sock") {
		t.Fatalf("while the driver restarts: record %v, journal records %d", rec, j.len())
	}
	if rec := r.step(t, "pvc-1"); rec.State != reclaimerv1.State_STATE_PENDING || p.calls() != 0 {
		t.Fatalf("a step while the driver restarts: record %v, %d DeleteVolume calls", rec, p.calls())
	}
	// The driver is back and probed; the binder hands the volume over
	// again (its resync), and the retry deletes it.
	p.mu.Lock()
	p.drivers = servedDev().drivers
	p.mu.Unlock()
	r.drivers.Refresh(t.Context())
	r.start(t, kc.pv("pvc-1"))
	if rec := r.step(t, "pvc-1"); rec.State != reclaimerv1.State_STATE_SUCCEEDED || p.calls() != 1 || kc.pv("pvc-1") != nil || j.len() != 0 {
		t.Fatalf("once the driver is back: record %v, %d DeleteVolume calls, journal records %d", rec, p.calls(), j.len())
	}
}

// A volume nothing can delete is said once, at info level, when it turns
// Failed (its Event is the warning); its retries, kube-controller-manager's
// retry at every sync, are logged at debug level (issue 39's loose end:
// each one was an info line). No warning: test/e2e's
// TestHostPathVolumeOfAClaimBoundElsewhereFails wants none.
func TestAFailedVolumeIsLoggedOnce(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{})
	var logs syncedLog
	r.log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	v := releasedPV("static", corev1.PersistentVolumeReclaimDelete, withHostPath("/data/static"))
	kc.addPV(v)
	r.start(t, v)
	for range 3 {
		r.step(t, "static")
	}
	out := logs.String()
	if n := strings.Count(out, `level=INFO msg="volume Failed" volume=static`); n != 1 {
		t.Errorf("%d lines that the volume is Failed, want 1:\n%s", n, out)
	}
	if strings.Contains(out, "level=WARN") {
		t.Errorf("a warning about a volume nothing can delete:\n%s", out)
	}
	if n := strings.Count(out, `level=DEBUG msg="reclaim step failed; retrying" volume=static`); n != 3 {
		t.Errorf("%d debug lines of the retries, want 3:\n%s", n, out)
	}
	if strings.Contains(out, `level=INFO msg="reclaim step failed`) {
		t.Errorf("a retry of a Failed volume at info level:\n%s", out)
	}
}

// syncedLog is a log sink written by the replica and read by the test.
type syncedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestDeleteOfAStaticHostPathFails(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{})
	v := releasedPV("static", corev1.PersistentVolumeReclaimDelete, withHostPath("/data/static"))
	kc.addPV(v)
	r.start(t, v)
	rec := r.step(t, "static")
	want := "host_path deleter only supports /tmp/.+ but received provided /data/static"
	if rec.State != reclaimerv1.State_STATE_FAILED || rec.Message != want || rec.Method != reclaimerv1.Method_METHOD_UNSUPPORTED {
		t.Fatalf("record %v", rec)
	}
	if got := kc.pv("static"); got.Status.Phase != corev1.VolumeFailed || got.Status.Message != want {
		t.Errorf("volume status %+v", got.Status)
	}
	if events := r.drain(); !slices.Equal(events, []string{"Warning VolumeFailedDelete " + want}) {
		t.Errorf("events %q", events)
	}
	// Retried, but the Event is not repeated while nothing changes.
	r.step(t, "static")
	if events := r.drain(); len(events) != 0 {
		t.Errorf("repeated events %q", events)
	}
	// An administrator switches to Retain: the reclaim ends.
	kc.mu.Lock()
	kc.pvs["static"].Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	kc.mu.Unlock()
	if rec := r.step(t, "static"); rec.State != reclaimerv1.State_STATE_RETAINED || j.len() != 0 {
		t.Errorf("after the policy changed: %v, journal %d", rec, j.len())
	}
}

func files(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// Node-local Recycle scrubs the directory, then makes the volume
// Available. Before that the guard refuses while a live claim points at
// the volume or a pod uses the released claim; data is never touched then.
func TestNodeLocalRecycleAndItsGuard(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{mode: RecycleNodeLocal, nodeName: "node-a"})
	dir := t.TempDir()
	write(t, filepath.Join(dir, ".hidden"), "x")
	write(t, filepath.Join(dir, "a", "b", "c"), "x")
	v := releasedPV("hp", corev1.PersistentVolumeReclaimRecycle, withHostPath(dir))
	kc.addPV(v)

	steps := []struct {
		name   string
		setup  func()
		refuse string
		event  string
	}{
		{"the claim still exists", func() { kc.addPVC(claim("ns", "data", "claim-uid", "hp")) }, "claim ns/data (uid claim-uid) still exists", ""},
		{"a claim recreated with the same name asks for the volume", func() { kc.addPVC(claim("ns", "data", "new-uid", "hp")) }, "claim ns/data (uid new-uid) asks for this volume", ""},
		{"another claim asks for the volume", func() { kc.deletePVC("ns", "data"); kc.addPVC(claim("other", "wants-it", "x-uid", "hp")) }, "claim other/wants-it", ""},
		{"a pod uses the released claim", func() {
			kc.deletePVC("other", "wants-it")
			kc.addPod(podUsing("ns", "app", "data", corev1.PodRunning))
		}, "Volume is used by pods: ns/app", "Normal VolumeFailedRecycle Volume is used by pods: ns/app"},
	}
	r.start(t, v)
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.setup()
			rec := r.step(t, "hp")
			if rec.State != reclaimerv1.State_STATE_PENDING || !strings.Contains(rec.Message, s.refuse) || rec.NextAttemptTime == nil {
				t.Errorf("record %v, want a refusal with %q", rec, s.refuse)
			}
			if len(r.scrubs) != 0 || len(files(t, dir)) != 2 {
				t.Fatalf("scrubbed while refused: %v", r.scrubs)
			}
			if events := r.drain(); s.event != "" && !hasEvent(events, s.event) || s.event == "" && len(events) > 0 {
				t.Errorf("events %q, want %q", events, s.event)
			}
		})
	}
	// A terminated pod no longer counts.
	kc.setPodPhase("ns", "app", corev1.PodSucceeded)
	rec := r.step(t, "hp")
	if rec.State != reclaimerv1.State_STATE_SUCCEEDED || len(r.scrubs) != 1 || len(files(t, dir)) != 0 {
		t.Fatalf("record %v, scrubs %v, files %v", rec, r.scrubs, files(t, dir))
	}
	got := kc.pv("hp")
	if got.Spec.ClaimRef != nil || got.Status.Phase != corev1.VolumeAvailable || got.Annotations[kube.AnnBoundByController] != "" {
		t.Errorf("volume %+v / %+v", got.Spec.ClaimRef, got.Status)
	}
	if events := r.drain(); !slices.Equal(events, []string{"Normal VolumeRecycled Volume recycled"}) {
		t.Errorf("events %q", events)
	}
	if j.len() != 0 {
		t.Error("the journal record outlived the reclaim")
	}
}

// A volume a user pre-bound to a claim keeps the claim's name when
// recycled (only the UID goes), as Kubernetes does.
func TestRecycleKeepsAUsersPreBind(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{mode: RecycleNodeLocal, nodeName: "node-a"})
	v := releasedPV("pre", corev1.PersistentVolumeReclaimRecycle, withHostPath(t.TempDir()), func(v *corev1.PersistentVolume) { v.Annotations = map[string]string{} })
	kc.addPV(v)
	r.start(t, v)
	if rec := r.step(t, "pre"); rec.State != reclaimerv1.State_STATE_SUCCEEDED {
		t.Fatalf("record %v", rec)
	}
	got := kc.pv("pre")
	if got.Spec.ClaimRef == nil || got.Spec.ClaimRef.Name != "data" || got.Spec.ClaimRef.UID != "" || got.Status.Phase != corev1.VolumeAvailable {
		t.Errorf("volume %+v %+v", got.Spec.ClaimRef, got.Status)
	}
}

func TestNodeLocalScrubFailureFailsTheVolume(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{mode: RecycleNodeLocal, nodeName: "node-a"})
	v := releasedPV("gone-dir", corev1.PersistentVolumeReclaimRecycle, withHostPath(filepath.Join(t.TempDir(), "missing")))
	kc.addPV(v)
	r.start(t, v)
	rec := r.step(t, "gone-dir")
	if rec.State != reclaimerv1.State_STATE_FAILED || !strings.HasPrefix(rec.Message, "Recycle failed: ") {
		t.Fatalf("record %v", rec)
	}
	if got := kc.pv("gone-dir"); got.Status.Phase != corev1.VolumeFailed || got.Spec.ClaimRef == nil {
		t.Errorf("volume %+v", got)
	}
	if events := r.drain(); !hasEvent(events, "Warning VolumeFailedRecycle Recycle failed: ") {
		t.Errorf("events %q", events)
	}
}

// Recycler-pod mode: the pod is created once, then its status decides.
func TestRecyclerPodLifecycle(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{namespace: "default"})
	v := releasedPV("nfs-1", corev1.PersistentVolumeReclaimRecycle, withNFS())
	kc.addPV(v)
	r.start(t, v)

	rec := r.step(t, "nfs-1")
	if rec.State != reclaimerv1.State_STATE_RUNNING || rec.RecyclerPod != "default/recycler-for-nfs-1" || rec.RecyclerPodUid == "" {
		t.Fatalf("record %v", rec)
	}
	// Syncs while the pod runs change nothing.
	r.step(t, "nfs-1")
	if len(kc.created) != 1 || kc.pv("nfs-1").Status.Phase != corev1.VolumeReleased {
		t.Fatalf("pods created %v", kc.created)
	}

	// The pod fails: the volume goes Failed, the pod is deleted.
	kc.setPodPhase("default", "recycler-for-nfs-1", corev1.PodFailed)
	kc.mu.Lock()
	kc.pods["default/recycler-for-nfs-1"].Status.Message = "scrub: permission denied"
	kc.mu.Unlock()
	rec = r.step(t, "nfs-1")
	if rec.State != reclaimerv1.State_STATE_FAILED || !strings.Contains(rec.Message, "permission denied") || rec.RecyclerPod != "" {
		t.Fatalf("record %v", rec)
	}
	if kc.pod("default", "recycler-for-nfs-1") != nil || kc.pv("nfs-1").Status.Phase != corev1.VolumeFailed {
		t.Fatal("the failed pod was kept, or the volume is not Failed")
	}
	if events := r.drain(); !hasEvent(events, "Warning VolumeFailedRecycle Recycle failed: recycler pod default/recycler-for-nfs-1 failed") {
		t.Errorf("events %q", events)
	}

	// The retry starts a new pod; this one succeeds.
	rec = r.step(t, "nfs-1")
	if len(kc.created) != 2 || rec.State != reclaimerv1.State_STATE_RUNNING {
		t.Fatalf("record %v, pods created %v", rec, kc.created)
	}
	kc.setPodPhase("default", "recycler-for-nfs-1", corev1.PodSucceeded)
	rec = r.step(t, "nfs-1")
	if rec.State != reclaimerv1.State_STATE_SUCCEEDED || kc.pod("default", "recycler-for-nfs-1") != nil {
		t.Fatalf("record %v", rec)
	}
	if got := kc.pv("nfs-1"); got.Status.Phase != corev1.VolumeAvailable || got.Spec.ClaimRef != nil {
		t.Errorf("volume %+v", got)
	}
	if events := r.drain(); !hasEvent(events, "Normal VolumeRecycled Volume recycled") {
		t.Errorf("events %q", events)
	}
}

// A claim appearing while the recycler pod runs keeps the claimRef: the
// volume is not made Available under it.
func TestRecyclerPodClaimAppearsWhileItRuns(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{})
	v := releasedPV("nfs-2", corev1.PersistentVolumeReclaimRecycle, withNFS())
	kc.addPV(v)
	r.start(t, v)
	r.step(t, "nfs-2")
	kc.addPVC(claim("ns", "data", "new-uid", "nfs-2"))
	kc.setPodPhase("default", "recycler-for-nfs-2", corev1.PodSucceeded)
	rec := r.step(t, "nfs-2")
	if rec.State != reclaimerv1.State_STATE_PENDING || !rec.DataRemoved || !strings.Contains(rec.Message, "asks for this volume") {
		t.Fatalf("record %v", rec)
	}
	if got := kc.pv("nfs-2"); got.Spec.ClaimRef == nil || got.Status.Phase != corev1.VolumeReleased {
		t.Fatalf("volume %+v", got)
	}
	kc.deletePVC("ns", "data")
	if rec := r.step(t, "nfs-2"); rec.State != reclaimerv1.State_STATE_SUCCEEDED || len(kc.created) != 1 {
		t.Fatalf("record %v, pods %v", rec, kc.created)
	}
}

// Two replicas asked for the same volume: one acts, the other answers with
// its state.
func TestTwoReplicasActOnce(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	a := newReplica(t, "a", kc, j, nil, config{})
	b := newReplica(t, "b", kc, j, nil, config{})
	v := releasedPV("shared", corev1.PersistentVolumeReclaimRecycle, withNFS())
	kc.addPV(v)
	ra, rb := a.start(t, v), b.start(t, v)
	if ra.Owner != "a" || rb.Owner != "a" {
		t.Fatalf("owners %q and %q, want a for both", ra.Owner, rb.Owner)
	}
	a.step(t, "shared")
	b.handle(t.Context(), "shared")
	if rb := b.start(t, v); rb.Owner != "a" || rb.State != reclaimerv1.State_STATE_RUNNING || rb.RecyclerPod == "" {
		t.Fatalf("b sees %v", rb)
	}
	if len(kc.created) != 1 || b.queue.Len() != 0 {
		t.Fatalf("pods created %v", kc.created)
	}
}

// A replica that stops leaves its reclaim in the journal; another one takes
// it over and resumes from the recorded step: the recycler pod is watched,
// not created again.
func TestTakeoverResumes(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	a := newReplica(t, "a", kc, j, nil, config{})
	v := releasedPV("resume", corev1.PersistentVolumeReclaimRecycle, withNFS())
	kc.addPV(v)
	a.start(t, v)
	a.step(t, "resume")
	j.expire("a") // a's lease is gone

	b := newReplica(t, "b", kc, j, nil, config{})
	b.takeOver(t.Context())
	rec := b.heldRecord("resume")
	if rec == nil || rec.Owner != "b" || rec.RecyclerPod != "default/recycler-for-resume" {
		t.Fatalf("b holds %v", rec)
	}
	b.step(t, "resume")
	if len(kc.created) != 1 {
		t.Fatalf("pods created %v", kc.created)
	}
	// Were a still running, its writes would be fenced off (and it stops
	// when its session is lost).
	if err := a.save(t.Context(), a.heldRecord("resume")); !errors.Is(err, errSuperseded) || a.heldRecord("resume") != nil {
		t.Errorf("a's write after losing the lock: %v", err)
	}
	kc.setPodPhase("default", "recycler-for-resume", corev1.PodSucceeded)
	if rec := b.step(t, "resume"); rec.State != reclaimerv1.State_STATE_SUCCEEDED {
		t.Fatalf("record %v", rec)
	}
	if len(kc.created) != 1 || kc.pv("resume").Status.Phase != corev1.VolumeAvailable {
		t.Error("not recycled exactly once")
	}
}

// A node-local replica leaves the orphaned reclaim of another node's local
// volume to that node's reclaimer.
func TestTakeoverLeavesOtherNodesVolumes(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	onB := newReplica(t, "on-b", kc, j, nil, config{mode: RecycleNodeLocal, nodeName: "node-b"})
	v := releasedPV("local-b", corev1.PersistentVolumeReclaimRecycle, withLocal(t.TempDir(), "node-b"))
	kc.addPV(v)
	if rec := onB.start(t, v); rec.Method != reclaimerv1.Method_METHOD_NODE_LOCAL {
		t.Fatalf("record %v", rec)
	}
	j.expire("on-b")
	onA := newReplica(t, "on-a", kc, j, nil, config{mode: RecycleNodeLocal, nodeName: "node-a"})
	onA.takeOver(t.Context())
	if onA.heldRecord("local-b") != nil || j.len() != 1 {
		t.Fatal("node-a took over node-b's local volume")
	}
}

// A volume released again (recycled, bound, released) is a new reclaim;
// a recreated volume is another one too.
func TestNewReleaseIsANewReclaim(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{mode: RecycleNodeLocal, nodeName: "n"})
	v := releasedPV("again", corev1.PersistentVolumeReclaimRecycle, withHostPath(t.TempDir()))
	kc.addPV(v)
	r.start(t, v)
	if rec := r.step(t, "again"); rec.State != reclaimerv1.State_STATE_SUCCEEDED {
		t.Fatal(rec)
	}
	// Bound to another claim and released again.
	next := kc.pv("again")
	next.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "second", UID: "second-uid"}
	next.Annotations = map[string]string{kube.AnnBoundByController: "yes"}
	next.Status.Phase = corev1.VolumeReleased
	kc.addPV(next)
	rec := r.start(t, next)
	if rec.State != reclaimerv1.State_STATE_PENDING || rec.ClaimUid != "second-uid" {
		t.Fatalf("record %v", rec)
	}
	if rec := r.step(t, "again"); rec.State != reclaimerv1.State_STATE_SUCCEEDED || len(r.scrubs) != 2 {
		t.Fatalf("record %v, scrubs %v", rec, r.scrubs)
	}
}

// A reclaim whose volume is bound again, or gone, is cancelled.
func TestReclaimCancelled(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	r := newReplica(t, "me", kc, j, nil, config{})
	v := releasedPV("c", corev1.PersistentVolumeReclaimRecycle, withNFS())
	kc.addPV(v)
	r.start(t, v)
	r.step(t, "c")
	kc.mu.Lock()
	kc.pvs["c"].Status.Phase = corev1.VolumeBound
	kc.mu.Unlock()
	rec := r.step(t, "c")
	if rec.State != reclaimerv1.State_STATE_CANCELLED || !strings.Contains(rec.Message, "Bound") || j.len() != 0 {
		t.Fatalf("record %v", rec)
	}
	if kc.pod("default", "recycler-for-c") != nil {
		t.Error("the recycler pod of a cancelled reclaim was kept")
	}
}

// Changes that arrive while a failed reclaim backs off (a recycler pod
// deleted, the binder's resync) do not bring the next attempt forward;
// RetryReclaim does.
func TestBackoffIsKept(t *testing.T) {
	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, Message: "disk busy"}, nil)
	r := newReplica(t, "me", kc, j, p, config{})
	r.limiter = workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Hour, time.Hour)
	r.queue = workqueue.NewTypedRateLimitingQueue(r.limiter)
	v := releasedPV("slow", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver))
	kc.addPV(v)
	r.start(t, v)
	if rec := r.step(t, "slow"); rec.State != reclaimerv1.State_STATE_FAILED || rec.NextAttemptTime.AsTime().Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("record %v", rec)
	}
	r.step(t, "slow")
	if p.calls() != 1 {
		t.Fatalf("DeleteVolume called %d times during the backoff", p.calls())
	}
	// The policy changes: planned again at once.
	kc.mu.Lock()
	kc.pvs["slow"].Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	kc.mu.Unlock()
	r.start(t, kc.pv("slow"))
	if rec := r.step(t, "slow"); rec.State != reclaimerv1.State_STATE_RETAINED {
		t.Fatalf("after the policy changed: %v", rec)
	}

	v2 := releasedPV("slow-2", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver))
	kc.addPV(v2)
	r.start(t, v2)
	r.step(t, "slow-2")
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	if _, err := r.retryNow(t.Context(), "slow-2"); err != nil {
		t.Fatal(err)
	}
	if rec := r.step(t, "slow-2"); rec.State != reclaimerv1.State_STATE_SUCCEEDED {
		t.Fatalf("after RetryReclaim: %v", rec)
	}
}

// TestDropFinalizer: the finalizer is removed from the volume as read; a
// copy that is out of date is read again, and a volume recreated under
// the same name keeps its finalizer.
func TestDropFinalizer(t *testing.T) {
	withFinalizer := func(v *corev1.PersistentVolume) {
		v.Finalizers = []string{"kubernetes.io/pv-protection", kube.FinalizerExternalProvisioner}
	}
	for _, tc := range []struct {
		name  string
		stale bool // the copy predates a change of the volume
		other bool // the volume was recreated with another UID
		want  []string
	}{
		{"as read", false, false, []string{"kubernetes.io/pv-protection"}},
		{"stale copy", true, false, []string{"kubernetes.io/pv-protection"}},
		{"recreated", true, true, []string{"kubernetes.io/pv-protection", kube.FinalizerExternalProvisioner}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc := newFakeCluster()
			c := newReplica(t, "me", kc, newFakeJournal(), nil, config{}).controller
			kc.addPV(releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI("csi.example.com"), withFinalizer))
			read := kc.pv("v")
			if tc.stale {
				cur := kc.pv("v")
				cur.Labels = map[string]string{"changed": "yes"}
				if tc.other {
					kc.mu.Lock()
					delete(kc.pvs, "v")
					kc.mu.Unlock()
					cur.UID = "uid-recreated"
					kc.addPV(cur)
				} else if _, err := kc.UpdateVolume(t.Context(), cur); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.dropFinalizer(t.Context(), read); err != nil {
				t.Fatal(err)
			}
			if got := kc.pv("v"); got == nil || !slices.Equal(got.Finalizers, tc.want) {
				t.Fatalf("finalizers %v, want %v", got.GetFinalizers(), tc.want)
			}
		})
	}
}
