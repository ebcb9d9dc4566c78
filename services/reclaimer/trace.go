package reclaimer

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Reclaim steps go to OpenTelemetry only (with --otlp-endpoint), not to a
// claim timeline: a reclaim runs after its claim is deleted, and the
// timeline API finds a claim by name through the binder that holds it,
// which a deleted claim no longer has. Each attempt (one sync) is a
// reclaim span, with the steps that take time as its children: DeleteVolume
// (the provisioner's call, which carries the trace on: pkg/grpcutil), delete
// PV, recycler pod, scrub. Every span names the volume and the claim it
// last served (volplane.claim.uid: the claimRef's UID, the key of that
// claim's timeline and of the binder's and provisioner's spans for it), so
// a trace backend answers "why did this deletion take 40 s?" by either.
// A replica's attempts at one reclaim share the trace of its first.
//
// Span names.
const (
	spanReclaim      = "reclaim"
	spanDeleteVolume = "DeleteVolume"
	spanDeletePV     = "delete PV"
	spanRecyclerPod  = "recycler pod"
	spanScrub        = "scrub"
)

// startSpan starts the span name of reclaim r, child of ctx's span; a
// no-op span without tracing (no allocation then).
func (c *controller) startSpan(ctx context.Context, name string, r *reclaimerv1.Reclaim, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if c.tracer == nil {
		return ctx, noop.Span{}
	}
	opts = append(opts, trace.WithAttributes(
		attribute.String("volplane.volume.name", r.GetVolumeName()),
		attribute.String("volplane.claim.uid", r.GetClaimUid()),
		attribute.String("volplane.claim", r.GetClaimNamespace()+"/"+r.GetClaimName()),
	))
	return c.tracer.Start(ctx, name, opts...)
}

// startAttempt starts the span of one sync of the held reclaim of volume
// key: in the trace of this replica's earlier attempts at the same reclaim
// when there were some.
func (c *controller) startAttempt(ctx context.Context, key string, r *reclaimerv1.Reclaim) (context.Context, trace.Span) {
	if c.tracer == nil {
		return ctx, noop.Span{}
	}
	c.mu.Lock()
	var prev trace.SpanContext
	if e := c.entries[key]; e != nil && e.rec != nil && sameReclaim(e.rec, r) {
		prev = e.trace
	}
	c.mu.Unlock()
	if prev.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, prev)
	}
	ctx, sp := c.startSpan(ctx, spanReclaim, r, trace.WithAttributes(
		attribute.String("volplane.reclaim.policy", r.GetPolicy()),
		attribute.Int("volplane.reclaim.attempt", int(r.GetAttempts())+1)))
	if !prev.IsValid() {
		c.mu.Lock()
		if e := c.entries[key]; e != nil && !e.trace.IsValid() {
			e.trace = sp.SpanContext()
		}
		c.mu.Unlock()
	}
	return ctx, sp
}

// endAttempt ends an attempt's span with where the reclaim stands.
func endAttempt(sp trace.Span, r *reclaimerv1.Reclaim, err error) {
	if !sp.IsRecording() {
		return
	}
	sp.SetAttributes(attribute.String("volplane.reclaim.state", r.GetState().String()),
		attribute.String("volplane.reclaim.method", r.GetMethod().String()),
		attribute.String("volplane.detail", r.GetMessage()))
	endSpan(sp, err)
}

// endSpan ends sp, marked as an error with err's message when err is not
// nil.
func endSpan(sp trace.Span, err error, opts ...trace.SpanEndOption) {
	if err != nil && sp.IsRecording() {
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End(opts...)
}

// addSpan records a step whose times are known after the fact (a
// recycler pod, from its creation to the sync that saw it end).
func (c *controller) addSpan(ctx context.Context, name string, r *reclaimerv1.Reclaim, start, end time.Time, detail string, err error) {
	if c.tracer == nil {
		return
	}
	if end.Before(start) {
		end = start // the pod's creationTimestamp is the API server's clock
	}
	_, sp := c.startSpan(ctx, name, r, trace.WithTimestamp(start), trace.WithAttributes(attribute.String("volplane.detail", detail)))
	endSpan(sp, err, trace.WithTimestamp(end))
}
