package timeline

import (
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/status"
)

// Default bounds of a Store.
const (
	// DefaultClaims is how many claims a store keeps spans for.
	DefaultClaims = 10000
	// DefaultSpansPerClaim is how many spans it keeps per claim: a claim
	// that binds at once takes about 6, one provisioned about 10, each
	// retry 3 more.
	DefaultSpansPerClaim = 32
	// MaxClaims and MaxSpansPerClaim bound the flags (a store at both
	// maxima holds about 1.3 GB of spans).
	MaxClaims        = 1 << 20
	MaxSpansPerClaim = 1024
)

// shardsFor is how many independently locked parts a store of claims
// claims has: one for a small store, so that its bound and its eviction
// order are exact; 16 for a large one, whose bound is then per part (the
// claims are spread over them by a hash of the UID, so each part evicts
// its own least recently recorded claim).
func shardsFor(claims int) int {
	if claims < 1024 {
		return 1
	}
	return largeStoreParts
}

// largeStoreParts is how many parts a store of 1024 claims or more has.
const largeStoreParts = 16

// Span is one recorded step.
type Span struct {
	// Name is the step: queued, sync, reserve, provision, CreateVolume, ...
	Name string
	// Code is the step's gRPC code or outcome, when it has one.
	Code string
	// Detail says what happened, in words.
	Detail string
	// Start and End are the step's times (Unix nanoseconds).
	Start, End int64
	// TraceID is the OpenTelemetry trace of the step; zero without tracing.
	TraceID trace.TraceID
}

// StartTime and EndTime are the span's times.
func (s Span) StartTime() time.Time { return time.Unix(0, s.Start) }

// EndTime is when the span ended.
func (s Span) EndTime() time.Time { return time.Unix(0, s.End) }

// Duration is how long the step took.
func (s Span) Duration() time.Duration { return time.Duration(s.End - s.Start) }

// Store keeps the recent spans of a bounded number of claims. Its methods
// are safe for concurrent use; a nil *Store records nothing.
type Store struct {
	perClaim int
	tracer   trace.Tracer // nil: no OpenTelemetry
	seed     maphash.Seed
	shards   []shard
	now      func() time.Time
}

type shard struct {
	mu     sync.Mutex
	max    int
	claims map[string]*entry
	// lru: the shard's claims, most recently recorded into first.
	head, tail *entry
}

// entry is one claim's spans: a ring that grows up to perClaim, then
// overwrites its oldest.
type entry struct {
	uid        string
	spans      []Span
	next       int // where the next span goes once the ring is full
	dropped    int
	trace      trace.SpanContext // the claim's trace in this service
	prev, succ *entry
}

// New returns a store of at most claims claims and perClaim spans each
// (0: the defaults). tracer, when not nil, also gets every span (see
// Start); nil records in memory only.
func New(claims, perClaim int, tracer trace.Tracer) *Store {
	if claims <= 0 {
		claims = DefaultClaims
	}
	if perClaim <= 0 {
		perClaim = DefaultSpansPerClaim
	}
	n := shardsFor(claims)
	s := &Store{perClaim: perClaim, tracer: tracer, seed: maphash.MakeSeed(), now: time.Now, shards: make([]shard, n)}
	per := (claims + n - 1) / n
	for i := range s.shards {
		s.shards[i].max = per
		s.shards[i].claims = make(map[string]*entry)
	}
	return s
}

// Tracing reports whether spans also go to OpenTelemetry.
func (s *Store) Tracing() bool { return s != nil && s.tracer != nil }

// Tracer is the store's OpenTelemetry tracer: nil without tracing, and
// for a nil store. For steps that belong to no claim timeline the API
// serves (the reclaimer's, after the claim is gone), which go to
// OpenTelemetry only.
func (s *Store) Tracer() trace.Tracer {
	if s == nil {
		return nil
	}
	return s.tracer
}

func (s *Store) shard(uid string) *shard {
	if len(s.shards) == 1 {
		return &s.shards[0]
	}
	return &s.shards[maphash.String(s.seed, uid)%uint64(len(s.shards))]
}

// Step is a span being recorded: Start returns it, End records it.
type Step struct {
	s     *Store
	uid   string
	name  string
	start int64
	otel  trace.Span // nil without tracing
}

// Start begins a span named name for the claim with UID uid. With
// tracing, it also starts an OpenTelemetry span, child of ctx's span or,
// when ctx has none, of the claim's trace in this service, and the
// returned context carries it (pass it to the calls the step makes, so
// that their trace follows); without, ctx is returned as is. An empty uid
// or a nil store records nothing.
func (s *Store) Start(ctx context.Context, uid, name string) (context.Context, Step) {
	if s == nil || uid == "" {
		return ctx, Step{}
	}
	st := Step{s: s, uid: uid, name: name, start: s.now().UnixNano()}
	if s.tracer != nil {
		ctx, st.otel = s.tracer.Start(s.parent(ctx, uid), name, trace.WithAttributes(attribute.String("volplane.claim.uid", uid)))
	}
	return ctx, st
}

// parent is ctx, or when it carries no span, ctx with the claim's trace
// in this service as its remote parent.
func (s *Store) parent(ctx context.Context, uid string) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	sh := s.shard(uid)
	sh.mu.Lock()
	var sc trace.SpanContext
	if e := sh.claims[uid]; e != nil {
		sc = e.trace
	}
	sh.mu.Unlock()
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// End records the step, ended now, with its code and detail.
func (st Step) End(code, detail string) {
	if st.s == nil {
		return
	}
	end := st.s.now().UnixNano()
	var sc trace.SpanContext
	if st.otel != nil {
		sc = st.otel.SpanContext()
		if detail != "" {
			st.otel.SetAttributes(attribute.String("volplane.detail", detail))
		}
		if code != "" {
			st.otel.SetAttributes(attribute.String("volplane.code", code))
		}
		st.otel.End()
	}
	st.s.put(st.uid, Span{Name: st.name, Code: code, Detail: detail, Start: st.start, End: end, TraceID: sc.TraceID()}, sc)
}

// EndErr records the step, ended now: code is the gRPC code of err
// ("OK" for nil), detail err's message or, for nil, ok.
func (st Step) EndErr(err error, ok string) {
	if st.s == nil {
		return
	}
	if err == nil {
		st.End("OK", ok)
		return
	}
	if st.otel != nil {
		st.otel.SetStatus(codes.Error, "")
	}
	st.End(status.Code(err).String(), err.Error())
}

// Add records a span whose times are known (a wait measured after the
// fact: queued, seen, a backoff). With tracing, it is also an
// OpenTelemetry span with those times, child of ctx's span or of the
// claim's trace.
func (s *Store) Add(ctx context.Context, uid, name string, start, end time.Time, code, detail string) {
	if s == nil || uid == "" {
		return
	}
	var sc trace.SpanContext
	if s.tracer != nil {
		_, sp := s.tracer.Start(s.parent(ctx, uid), name, trace.WithTimestamp(start),
			trace.WithAttributes(attribute.String("volplane.claim.uid", uid), attribute.String("volplane.detail", detail)))
		sc = sp.SpanContext()
		sp.End(trace.WithTimestamp(end))
	}
	s.put(uid, Span{Name: name, Code: code, Detail: detail, Start: start.UnixNano(), End: end.UnixNano(), TraceID: sc.TraceID()}, sc)
}

// put stores sp as the claim's newest span.
func (s *Store) put(uid string, sp Span, sc trace.SpanContext) {
	sh := s.shard(uid)
	sh.mu.Lock()
	e := sh.claims[uid]
	if e == nil {
		e = sh.add(uid)
	} else {
		sh.touch(e)
	}
	if !e.trace.IsValid() && sc.IsValid() {
		e.trace = sc
	}
	if len(e.spans) < s.perClaim {
		e.spans = append(e.spans, sp)
	} else {
		e.spans[e.next] = sp
		e.next = (e.next + 1) % s.perClaim
		e.dropped++
	}
	sh.mu.Unlock()
}

// add makes the entry of a new claim, evicting the least recently
// recorded claim when the shard is full. Called with sh.mu held.
func (sh *shard) add(uid string) *entry {
	var e *entry
	if len(sh.claims) >= sh.max && sh.tail != nil {
		// Reuse the evicted claim's entry and its ring.
		e = sh.tail
		sh.unlink(e)
		delete(sh.claims, e.uid)
		*e = entry{spans: e.spans[:0]}
	} else {
		e = &entry{}
	}
	e.uid = uid
	sh.claims[uid] = e
	sh.pushFront(e)
	return e
}

func (sh *shard) touch(e *entry) {
	if sh.head == e {
		return
	}
	sh.unlink(e)
	sh.pushFront(e)
}

func (sh *shard) unlink(e *entry) {
	if e.prev != nil {
		e.prev.succ = e.succ
	} else {
		sh.head = e.succ
	}
	if e.succ != nil {
		e.succ.prev = e.prev
	} else {
		sh.tail = e.prev
	}
	e.prev, e.succ = nil, nil
}

func (sh *shard) pushFront(e *entry) {
	e.succ = sh.head
	if sh.head != nil {
		sh.head.prev = e
	}
	sh.head = e
	if sh.tail == nil {
		sh.tail = e
	}
}

// Spans returns a copy of the claim's spans by start time (then end time),
// and how many of its spans were overwritten by newer ones.
func (s *Store) Spans(uid string) ([]Span, int) {
	if s == nil {
		return nil, 0
	}
	sh := s.shard(uid)
	sh.mu.Lock()
	e := sh.claims[uid]
	if e == nil {
		sh.mu.Unlock()
		return nil, 0
	}
	out := make([]Span, 0, len(e.spans))
	out = append(out, e.spans[e.next:]...)
	out = append(out, e.spans[:e.next]...)
	dropped := e.dropped
	sh.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Span) int {
		if a.Start != b.Start {
			return cmpInt(a.Start, b.Start)
		}
		return cmpInt(a.End, b.End)
	})
	return out, dropped
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Len is how many claims the store holds spans for.
func (s *Store) Len() int {
	if s == nil {
		return 0
	}
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.claims)
		sh.mu.Unlock()
	}
	return n
}
