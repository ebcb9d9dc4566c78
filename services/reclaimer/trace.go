package reclaimer

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
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
// The attempts at one reclaim share the trace of its first, whichever
// replica makes them: the first's span context is journaled with the
// reclaim (trace_parent, W3C traceparent), so a replica that takes the
// reclaim over goes on in the same trace.
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
// key: in the trace of the earlier attempts at the same reclaim when there
// were some (this replica's, or the journaled trace_parent of a replica
// that stopped), else as the first, whose context the record keeps.
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
	if !prev.IsValid() {
		prev = parseTraceParent(r.GetTraceParent())
	}
	if prev.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, prev)
	}
	ctx, sp := c.startSpan(ctx, spanReclaim, r, trace.WithAttributes(
		attribute.String("volplane.reclaim.policy", r.GetPolicy()),
		attribute.Int("volplane.reclaim.attempt", int(r.GetAttempts())+1)))
	first := prev
	if !first.IsValid() {
		first = sp.SpanContext()
	}
	// Journaled with the reclaim's next save, whichever copy saves it.
	r.TraceParent = formatTraceParent(first)
	c.mu.Lock()
	if e := c.entries[key]; e != nil {
		if !e.trace.IsValid() {
			e.trace = first
		}
		if e.held && e.rec != nil && sameReclaim(e.rec, r) {
			e.rec.TraceParent = r.TraceParent
		}
	}
	c.mu.Unlock()
	return ctx, sp
}

// formatTraceParent writes a span context as a W3C traceparent.
func formatTraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// parseTraceParent reads a W3C traceparent; anything else is no context.
func parseTraceParent(s string) trace.SpanContext {
	parts := strings.Split(s, "-")
	if len(parts) != 4 || parts[0] != "00" {
		return trace.SpanContext{}
	}
	tid, err1 := trace.TraceIDFromHex(parts[1])
	sid, err2 := trace.SpanIDFromHex(parts[2])
	flags, err3 := hex.DecodeString(parts[3])
	if err1 != nil || err2 != nil || err3 != nil || len(flags) != 1 {
		return trace.SpanContext{}
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.TraceFlags(flags[0]), Remote: true})
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
