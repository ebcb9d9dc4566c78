// Package timeline records, per claim, the steps a volplane service took
// for it, each with its start and end, so that "why did this claim take
// 40 seconds?" has an answer: the binder serves a claim's timeline merged
// from every service's (GET /v1/namespaces/{ns}/claims/{name}:timeline,
// kubectl volplane timeline pvc NAME).
//
// A Store is bounded twice: by claims (Options.Claims, --timeline-claims;
// the claim recorded into least recently is evicted first) and by spans
// per claim (Options.SpansPerClaim, --timeline-spans-per-claim; a claim's
// oldest span is overwritten first and counted as dropped). Spans are
// small fixed records (name, code, detail, two times, a trace ID) kept by
// value in a per-claim ring, the store is split into shards that each have
// their own lock, and recording a span allocates nothing once the claim's
// ring has grown: the hot path of a bind pays a lock, a map lookup and a
// copy per step.
//
// A span's detail is what the step found or decided, worded as explain
// words it; callers never put a StorageClass parameter, a Secret or a
// request body in it.
//
// When an OTLP endpoint is configured (Options.OTLPEndpoint,
// --otlp-endpoint), each recorded span is also an OpenTelemetry span:
// Start begins one, its End ends it. A claim's spans in one service share
// one trace (the first span's), and the trace context crosses volplane's
// gRPC calls (pkg/grpcutil propagates it as W3C traceparent metadata), so
// the binder's provisioning call, the provisioner's work and its CSI
// CreateVolume call are one trace. Without an endpoint no exporter or
// tracer provider is created and nothing is exported. Store.Tracer gives
// the tracer alone, to a service whose steps go to OpenTelemetry only (the
// reclaimer's, which belong to a deleted claim).
package timeline
