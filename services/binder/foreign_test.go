package binder

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
)

// value is a counter's value.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestBindingChanges(t *testing.T) {
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Annotations: map[string]string{"other": "x"}}}
	bound := claim.DeepCopy()
	bound.Spec.VolumeName = "pv"
	bound.Annotations = map[string]string{"other": "y", kube.AnnBindCompleted: "yes", kube.AnnBoundByController: "yes"}
	bound.Status.Phase = corev1.ClaimBound
	names := func(fs []field) []string {
		var out []string
		for _, f := range fs {
			out = append(out, f.name)
		}
		return out
	}
	if got := names(claimBindingChanges(claim, bound)); !slices.Equal(got, []string{"spec.volumeName", kube.AnnBindCompleted, kube.AnnBoundByController, "status.phase"}) {
		t.Errorf("claim bound: %v", got)
	}
	relabeled := claim.DeepCopy()
	relabeled.Annotations["other"] = "z"
	relabeled.Labels = map[string]string{"a": "b"}
	if got := claimBindingChanges(claim, relabeled); len(got) != 0 {
		t.Errorf("no binding field changed: %v", names(got))
	}

	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv"}}
	claimed := pv.DeepCopy()
	claimed.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: "c", UID: "u1"}
	if got := names(volumeBindingChanges(pv, claimed)); !slices.Equal(got, []string{"spec.claimRef"}) {
		t.Errorf("claimRef set: %v", got)
	}
	reclaimed := claimed.DeepCopy()
	reclaimed.Spec.ClaimRef.UID = "u2"
	reclaimed.Status.Phase = corev1.VolumeBound
	if got := names(volumeBindingChanges(claimed, reclaimed)); !slices.Equal(got, []string{"spec.claimRef", "status.phase"}) {
		t.Errorf("claimRef UID and phase: %v", got)
	}
	if got := volumeBindingChanges(claimed, claimed.DeepCopy()); len(got) != 0 {
		t.Errorf("nothing changed: %v", names(got))
	}
}

// managed is a managedFields entry of manager owning fieldsJSON.
func managed(manager, subresource, fieldsJSON string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: subresource,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fieldsJSON)}
}

func TestOwners(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{
		managed("kubectl-create", "", `{"f:spec":{"f:accessModes":{},"f:resources":{"f:requests":{".":{},"f:storage":{}}}}}`),
		managed("kube-controller-manager", "", `{"f:metadata":{"f:annotations":{".":{},"f:pv.kubernetes.io/bind-completed":{}}},"f:spec":{"f:volumeName":{}}}`),
		managed("binder", "status", `{"f:status":{"f:phase":{}}}`),
		managed("broken", "", `not json`),
	}
	for _, tc := range []struct {
		f    field
		want []string
	}{
		{fieldVolumeName, []string{"kube-controller-manager"}},
		{fieldBindCompleted, []string{"kube-controller-manager"}},
		{fieldBoundByControl, nil},
		{fieldPhase, []string{"binder"}},
		{fieldClaimRef, nil},
	} {
		if got := owners(mf, tc.f); !slices.Equal(got, tc.want) {
			t.Errorf("%s: owners %v, want %v", tc.f.name, got, tc.want)
		}
	}
}

// A change another binder made is reported (Event, metric, log); one that
// volplane or a user made is not; the Event comes once per object per
// period, the metric every time.
func TestForeignBinderReported(t *testing.T) {
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "uid-c",
		Annotations: map[string]string{kube.AnnBindCompleted: "yes"},
		ManagedFields: []metav1.ManagedFieldsEntry{
			managed("kube-controller-manager", "", `{"f:metadata":{"f:annotations":{"f:pv.kubernetes.io/bind-completed":{}}},"f:spec":{"f:volumeName":{}}}`),
			managed("binder", "status", `{"f:status":{"f:phase":{}}}`),
		}},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv"}}
	volume := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv", UID: "uid-pv",
		ManagedFields: []metav1.ManagedFieldsEntry{managed("kubectl-edit", "", `{"f:spec":{"f:claimRef":{}}}`)}}}
	client := fake.NewSimpleClientset(claim, volume)
	rec := record.NewFakeRecorder(10)
	var logs strings.Builder
	f := newForeignBinders(DefaultForeignBinderManagers, client, rec, slog.New(slog.NewTextHandler(&logs, nil)))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.now = func() time.Time { return now }
	counter := foreignBindsTotal.WithLabelValues("kube-controller-manager", "claim")
	before := value(t, counter)
	ctx := t.Context()

	bound := foreignChange{kind: "claim", namespace: "ns", name: "c", uid: "uid-c", fields: []field{fieldVolumeName, fieldBindCompleted, fieldPhase}}
	f.check(ctx, bound)
	select {
	case e := <-rec.Events:
		for _, want := range []string{"Warning", ReasonForeignBinder, "kube-controller-manager", "spec.volumeName", kube.AnnBindCompleted, "persistentvolume-binder-controller"} {
			if !strings.Contains(e, want) {
				t.Errorf("event %q lacks %q", e, want)
			}
		}
		if strings.Contains(e, "status.phase") {
			t.Errorf("event %q blames the phase volplane set", e)
		}
	default:
		t.Fatal("no event")
	}
	if got := value(t, counter) - before; got != 1 {
		t.Errorf("metric +%v, want +1", got)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "manager=kube-controller-manager") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}

	// Again within the periods: counted, no second Event, no second line.
	now = now.Add(time.Minute - time.Second)
	f.check(ctx, bound)
	if len(rec.Events) != 0 {
		t.Errorf("a second event within %s: %q", foreignEventEvery, <-rec.Events)
	}
	if got := value(t, counter) - before; got != 2 {
		t.Errorf("metric +%v, want +2", got)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d warnings within a minute, want 1", n)
	}
	now = now.Add(foreignEventEvery)
	f.check(ctx, bound)
	if len(rec.Events) != 1 || !strings.Contains(logs.String(), "more_since_last_warning=1") {
		t.Errorf("after the periods: %d events, log:\n%s", len(rec.Events), logs.String())
	}
	<-rec.Events

	// Fields a user, or volplane itself, changed: nothing.
	for _, ch := range []foreignChange{
		{kind: "volume", name: "pv", uid: "uid-pv", fields: []field{fieldClaimRef}},
		{kind: "claim", namespace: "ns", name: "c", uid: "uid-c", fields: []field{fieldPhase}},
		// Another object by now (the UID differs), or gone.
		{kind: "claim", namespace: "ns", name: "c", uid: "uid-old", fields: []field{fieldVolumeName}},
		{kind: "claim", namespace: "ns", name: "gone", uid: "uid-gone", fields: []field{fieldVolumeName}},
	} {
		f.check(ctx, ch)
		if len(rec.Events) != 0 {
			t.Errorf("%+v: event %q", ch, <-rec.Events)
		}
	}
	if got := value(t, counter) - before; got != 3 {
		t.Errorf("metric +%v, want +3", got)
	}

	// A version an API response gave this replica (its own write, whose
	// watch event came first) is not read back at all.
	var known versions
	known.add("uid-c", "7")
	f.known = known.has
	reads := 0
	client.PrependReactor("get", "*", func(k8stesting.Action) (bool, runtime.Object, error) { reads++; return false, nil, nil })
	own := bound
	own.rv = "7"
	now = now.Add(foreignEventEvery)
	f.check(ctx, own)
	if reads != 0 || len(rec.Events) != 0 {
		t.Errorf("this replica's own version: %d reads, %d events, want none", reads, len(rec.Events))
	}
	own.rv = "8" // another version: read, and reported
	f.check(ctx, own)
	if reads != 1 || len(rec.Events) != 1 {
		t.Errorf("another version: %d reads, %d events, want 1 and 1", reads, len(rec.Events))
	}
}

// The versions remembered are bounded: the oldest are forgotten first.
func TestVersionsBounded(t *testing.T) {
	var v versions
	for i := range respondedVersions + 10 {
		v.add("u", strconv.Itoa(i))
	}
	if v.has("u", "0") || v.has("u", "9") || !v.has("u", "10") || !v.has("u", strconv.Itoa(respondedVersions+9)) {
		t.Error("not the newest versions kept")
	}
	if len(v.set) != respondedVersions {
		t.Errorf("%d versions held, want %d", len(v.set), respondedVersions)
	}
	v.add("", "1")
	v.add("u", "")
	if v.has("", "1") || v.has("u", "") {
		t.Error("an empty UID or version was remembered")
	}
}

// observe never blocks: past the backlog, changes are dropped; run reads
// them one per interval.
func TestForeignObserveNeverBlocks(t *testing.T) {
	f := newForeignBinders(DefaultForeignBinderManagers, fake.NewSimpleClientset(), record.NewFakeRecorder(1), slog.New(slog.NewTextHandler(io.Discard, nil)))
	f.every = time.Millisecond
	for range foreignBacklog * 3 {
		f.observe(foreignChange{kind: "claim", namespace: "ns", name: "c", fields: []field{fieldVolumeName}})
	}
	if len(f.changes) != foreignBacklog {
		t.Fatalf("backlog %d, want %d", len(f.changes), foreignBacklog)
	}
	f.observe(foreignChange{kind: "claim"}) // no field: not queued
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { f.run(ctx); close(done) }()
	waitFor(t, func() bool { return len(f.changes) == 0 })
	cancel()
	<-done
	var nilF *foreignBinders
	nilF.observe(foreignChange{kind: "claim", fields: []field{fieldVolumeName}}) // a binder without the check
}
