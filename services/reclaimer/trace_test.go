package reclaimer

import (
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// TestReclaimSpans: with a tracer, each attempt at a Delete is a reclaim
// span (a replica's attempts at one reclaim in one trace), its
// DeleteVolume call and the PV's deletion its children, every span naming
// the volume and the UID of the claim it served; the provisioner's call
// carries the trace on; the last attempt says the reclaim SUCCEEDED.
func TestReclaimSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })

	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, Message: "driver timed out"}, nil)
	r := newReplica(t, "me", kc, j, p, config{})
	r.tracer = tp.Tracer("test")
	v := releasedPV("pvc-1", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver),
		func(v *corev1.PersistentVolume) { v.Finalizers = []string{kube.FinalizerExternalProvisioner} })
	kc.addPV(v)
	r.start(t, v)
	if rec := r.step(t, "pvc-1"); rec.State != reclaimerv1.State_STATE_RUNNING {
		t.Fatalf("first attempt: %v", rec)
	}
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	if rec := r.step(t, "pvc-1"); rec.State != reclaimerv1.State_STATE_SUCCEEDED {
		t.Fatalf("second attempt: %v", rec)
	}

	spans := exp.GetSpans()
	var names []string
	for _, s := range spans {
		names = append(names, s.Name)
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[string(a.Key)] = a.Value.String()
		}
		if attrs["volplane.volume.name"] != "pvc-1" || attrs["volplane.claim.uid"] != "claim-uid" {
			t.Errorf("span %s attributes %v: want the volume and the claim's UID", s.Name, attrs)
		}
		if s.SpanContext.TraceID() != spans[0].SpanContext.TraceID() {
			t.Errorf("span %s in trace %s, the first in %s", s.Name, s.SpanContext.TraceID(), spans[0].SpanContext.TraceID())
		}
		if s.EndTime.Before(s.StartTime) {
			t.Errorf("span %s is negative", s.Name)
		}
	}
	// Children end before their parent: the exporter gets them first.
	want := "DeleteVolume,reclaim,DeleteVolume,delete PV,reclaim"
	if strings.Join(names, ",") != want {
		t.Fatalf("spans %v, want %s", names, want)
	}
	last := spans[4]
	for _, child := range spans[2:4] {
		if child.Parent.SpanID() != last.SpanContext.SpanID() {
			t.Errorf("%s is not a child of its attempt", child.Name)
		}
	}
	var state string
	for _, a := range last.Attributes {
		if a.Key == "volplane.reclaim.state" {
			state = a.Value.String()
		}
	}
	if state != "STATE_SUCCEEDED" {
		t.Errorf("last attempt's state %q", state)
	}
	for i, tr := range p.traces {
		if tr != spans[0].SpanContext.TraceID() {
			t.Errorf("DeleteVolume call %d in trace %s, want %s", i, tr, spans[0].SpanContext.TraceID())
		}
	}
}

// A replica that takes a reclaim over goes on in the trace of the first
// attempt, made by the replica that stopped (issue 39's loose end: it
// started a new trace). The API's answers do not show the journaled
// trace parent.
func TestTakeoverContinuesTheTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_IN_BACKGROUND, Message: "driver timed out"}, nil)
	a := newReplica(t, "a", kc, j, p, config{})
	a.tracer = tp.Tracer("a")
	v := releasedPV("pvc-1", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver),
		func(v *corev1.PersistentVolume) { v.Finalizers = []string{kube.FinalizerExternalProvisioner} })
	kc.addPV(v)
	a.start(t, v)
	rec := a.step(t, "pvc-1")
	if rec.State != reclaimerv1.State_STATE_RUNNING || rec.TraceParent == "" {
		t.Fatalf("first attempt: %v", rec)
	}
	if answer(rec).TraceParent != "" {
		t.Errorf("the API's answer shows the journaled trace parent")
	}
	first := exp.GetSpans()[0].SpanContext.TraceID()
	j.expire("a") // a stops

	b := newReplica(t, "b", kc, j, p, config{})
	b.tracer = tp.Tracer("b")
	b.takeOver(t.Context())
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	b.handle(t.Context(), "pvc-1")
	spans := exp.GetSpans()
	if len(spans) < 4 {
		t.Fatalf("%d spans", len(spans))
	}
	for _, s := range spans {
		if s.SpanContext.TraceID() != first {
			t.Errorf("span %s (%s) in trace %s, the first attempt's is %s", s.Name, s.InstrumentationScope.Name, s.SpanContext.TraceID(), first)
		}
	}
}

// Without a tracer the span helpers allocate nothing.
func TestNoTracerAllocatesNothing(t *testing.T) {
	c := &controller{entries: map[string]*entry{}}
	r := &reclaimerv1.Reclaim{VolumeName: "pv", ClaimUid: "u"}
	ctx := t.Context()
	if n := testing.AllocsPerRun(100, func() {
		actx, sp := c.startAttempt(ctx, "pv", r)
		_, child := c.startSpan(actx, spanDeleteVolume, r)
		endSpan(child, nil)
		endAttempt(sp, r, nil)
	}); n != 0 {
		t.Errorf("%v allocations per attempt without a tracer", n)
	}
}
