package timeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/spf13/pflag"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// clock is a settable time for a store.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func testStore(claims, perClaim int) (*Store, *clock) {
	s := New(claims, perClaim, nil)
	c := &clock{t: time.Unix(1000, 0)}
	s.now = c.now
	return s, c
}

func names(spans []Span) []string {
	out := make([]string, len(spans))
	for i, sp := range spans {
		out[i] = sp.Name
	}
	return out
}

func TestBounds(t *testing.T) {
	t.Run("claims: least recently recorded is evicted", func(t *testing.T) {
		s, _ := testStore(3, 4)
		ctx := t.Context()
		for _, uid := range []string{"a", "b", "c"} {
			_, st := s.Start(ctx, uid, "sync")
			st.End("", "")
		}
		// a is recorded into again: b is now the oldest.
		_, st := s.Start(ctx, "a", "bind")
		st.End("", "")
		_, st = s.Start(ctx, "d", "sync")
		st.End("", "")
		if got := s.Len(); got != 3 {
			t.Fatalf("Len = %d, want 3", got)
		}
		if sp, _ := s.Spans("b"); sp != nil {
			t.Errorf("b was not evicted: %v", names(sp))
		}
		for _, uid := range []string{"a", "c", "d"} {
			if sp, _ := s.Spans(uid); len(sp) == 0 {
				t.Errorf("%s was evicted", uid)
			}
		}
		if sp, _ := s.Spans("a"); len(sp) != 2 {
			t.Errorf("a has %v, want sync and bind", names(sp))
		}
	})
	t.Run("an evicted claim's entry starts empty when reused", func(t *testing.T) {
		s, _ := testStore(1, 4)
		for i := range 3 {
			s.Add(t.Context(), "old", fmt.Sprint("s", i), time.Unix(1, 0), time.Unix(2, 0), "", "")
		}
		s.Add(t.Context(), "new", "only", time.Unix(1, 0), time.Unix(2, 0), "", "")
		sp, dropped := s.Spans("new")
		if len(sp) != 1 || sp[0].Name != "only" || dropped != 0 {
			t.Errorf("new = %v dropped %d, want [only] 0", names(sp), dropped)
		}
	})
	t.Run("spans per claim: oldest overwritten and counted", func(t *testing.T) {
		s, c := testStore(10, 3)
		for i := range 5 {
			_, st := s.Start(t.Context(), "a", fmt.Sprint("s", i))
			c.t = c.t.Add(time.Second)
			st.End("", "")
		}
		sp, dropped := s.Spans("a")
		if got, want := fmt.Sprint(names(sp)), "[s2 s3 s4]"; got != want || dropped != 2 {
			t.Errorf("spans %s dropped %d, want %s 2", got, dropped, want)
		}
	})
	t.Run("defaults", func(t *testing.T) {
		s := New(0, 0, nil)
		if s.perClaim != DefaultSpansPerClaim || len(s.shards)*s.shards[0].max < DefaultClaims {
			t.Errorf("perClaim %d, %d shards of %d", s.perClaim, len(s.shards), s.shards[0].max)
		}
	})
	t.Run("a large store's shards hold the bound between them", func(t *testing.T) {
		s := New(4096, 2, nil)
		for i := range 10000 {
			s.Add(t.Context(), fmt.Sprint("uid-", i), "x", time.Unix(1, 0), time.Unix(2, 0), "", "")
		}
		if n := s.Len(); n > 4096 || n < 4096-16 {
			t.Errorf("Len = %d, want about 4096 and never more", n)
		}
	})
}

func TestOrderAndContent(t *testing.T) {
	s, c := testStore(10, 10)
	ctx := t.Context()
	t0 := c.t
	_, outer := s.Start(ctx, "a", "provision")
	c.t = c.t.Add(10 * time.Millisecond)
	_, inner := s.Start(ctx, "a", "CreateVolume")
	c.t = c.t.Add(2 * time.Second)
	inner.EndErr(status.Error(codes.DeadlineExceeded, "timed out"), "")
	c.t = c.t.Add(time.Millisecond)
	outer.EndErr(nil, "FINISHED")
	// Recorded late, started first.
	s.Add(ctx, "a", "seen", t0.Add(-time.Second), t0, "", "created → seen")

	sp, _ := s.Spans("a")
	if got, want := fmt.Sprint(names(sp)), "[seen provision CreateVolume]"; got != want {
		t.Fatalf("order %s, want %s", got, want)
	}
	cv := sp[2]
	if cv.Code != "DeadlineExceeded" || cv.Detail == "" || cv.Duration() != 2*time.Second {
		t.Errorf("CreateVolume = %+v", cv)
	}
	if p := sp[1]; p.Code != "OK" || p.Detail != "FINISHED" || !p.StartTime().Equal(t0) || p.Duration() != 2011*time.Millisecond {
		t.Errorf("provision = %+v", p)
	}
	if sp, d := s.Spans("unknown"); sp != nil || d != 0 {
		t.Errorf("unknown claim: %v %d", sp, d)
	}
}

func TestNothingRecorded(t *testing.T) {
	var s *Store
	ctx, st := s.Start(t.Context(), "a", "x")
	st.End("", "")
	st.EndErr(errors.New("x"), "")
	s.Add(ctx, "a", "x", time.Now(), time.Now(), "", "")
	if sp, _ := s.Spans("a"); sp != nil || s.Len() != 0 || s.Tracing() {
		t.Error("a nil store recorded")
	}
	live := New(10, 10, nil)
	_, st = live.Start(t.Context(), "", "x")
	st.End("", "")
	if live.Len() != 0 {
		t.Error("a span without a claim UID was recorded")
	}
	if ctx2, _ := live.Start(ctx, "a", "x"); ctx2 != ctx {
		t.Error("without tracing, Start changed the context")
	}
}

func TestConcurrentRecording(t *testing.T) {
	s := New(64, 8, nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				uid := fmt.Sprint("uid-", (g*7+i)%100)
				_, st := s.Start(context.Background(), uid, "sync")
				st.End("OK", "")
				if i%50 == 0 {
					s.Spans(uid)
				}
			}
		}()
	}
	wg.Wait()
	if n := s.Len(); n != 64 {
		t.Errorf("Len = %d, want 64", n)
	}
	for i := range 100 {
		sp, _ := s.Spans(fmt.Sprint("uid-", i))
		if len(sp) > 8 {
			t.Errorf("claim %d has %d spans, more than 8", i, len(sp))
		}
	}
}

func TestTracing(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	s := New(10, 10, tp.Tracer("test"))
	ctx := t.Context()
	if !s.Tracing() {
		t.Fatal("Tracing() = false with a tracer")
	}
	// Two steps without a parent span: one trace for the claim.
	_, st := s.Start(ctx, "a", "queued")
	st.End("", "")
	s.Add(ctx, "a", "seen", time.Now().Add(-time.Second), time.Now(), "", "")
	// A step whose context carries it: its child shares the trace.
	cctx, outer := s.Start(ctx, "a", "provision")
	_, inner := s.Start(cctx, "a", "CreateVolume")
	inner.End("OK", "")
	outer.End("", "")
	// Another claim: another trace.
	_, other := s.Start(ctx, "b", "queued")
	other.End("", "")

	got := exp.GetSpans()
	if len(got) != 5 {
		t.Fatalf("%d spans exported, want 5", len(got))
	}
	trace := got[0].SpanContext.TraceID()
	for _, sp := range got[:4] {
		if sp.SpanContext.TraceID() != trace {
			t.Errorf("span %s of claim a is in trace %s, want %s", sp.Name, sp.SpanContext.TraceID(), trace)
		}
	}
	if got[4].SpanContext.TraceID() == trace {
		t.Error("claim b shares claim a's trace")
	}
	if got[2].Parent.SpanID() != got[3].SpanContext.SpanID() {
		t.Error("CreateVolume is not provision's child")
	}
	sp, _ := s.Spans("a")
	for _, r := range sp {
		if r.TraceID != trace {
			t.Errorf("recorded %s has trace %s, want %s", r.Name, r.TraceID, trace)
		}
	}
}

func TestOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		o    Options
		errs int
	}{
		"defaults":          {Options{}, 0},
		"plaintext":         {Options{OTLPEndpoint: "http://collector:4317"}, 0},
		"tls":               {Options{OTLPEndpoint: "https://collector:4317"}, 0},
		"no scheme":         {Options{OTLPEndpoint: "collector:4317"}, 1},
		"a path":            {Options{OTLPEndpoint: "http://collector:4317/v1/traces"}, 1},
		"negative claims":   {Options{Claims: -1}, 1},
		"too many spans":    {Options{SpansPerClaim: MaxSpansPerClaim + 1}, 1},
		"everything wrong":  {Options{Claims: MaxClaims + 1, SpansPerClaim: -1, OTLPEndpoint: "grpc://x"}, 3},
		"at the maximums":   {Options{Claims: MaxClaims, SpansPerClaim: MaxSpansPerClaim}, 0},
		"empty host":        {Options{OTLPEndpoint: "http://"}, 1},
		"not a url at all":  {Options{OTLPEndpoint: "::"}, 1},
		"https with a port": {Options{OTLPEndpoint: "https://10.0.0.1:4317/"}, 0},
		"off":               {Options{Off: true}, 0},
		"off but exporting": {Options{Off: true, OTLPEndpoint: "http://collector:4317"}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			if errs := tc.o.Validate(); len(errs) != tc.errs {
				t.Errorf("Validate = %v, want %d errors", errs, tc.errs)
			}
		})
	}
	t.Run("--timeline=false: no store", func(t *testing.T) {
		var o Options
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		o.AddFlags(fs)
		if err := fs.Parse([]string{"--timeline=false"}); err != nil {
			t.Fatal(err)
		}
		if !o.Off {
			t.Fatal("--timeline=false left the timeline on")
		}
		s, shutdown, err := o.Open(t.Context(), "binder", "m")
		if err != nil || s != nil {
			t.Fatalf("Open = %v, %v; want no store", s, err)
		}
		if err := shutdown(t.Context()); err != nil {
			t.Error(err)
		}
		for _, args := range [][]string{{"--timeline"}, {"--timeline=true"}, {}} {
			o := Options{Off: true}
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(args); err != nil {
				t.Fatal(err)
			}
			if o.Off != (len(args) == 0) {
				t.Errorf("%v: Off = %v", args, o.Off)
			}
		}
		bad := pflag.NewFlagSet("t", pflag.ContinueOnError)
		bad.SetOutput(io.Discard)
		new(Options).AddFlags(bad)
		if err := bad.Parse([]string{"--timeline=maybe"}); err == nil {
			t.Error("--timeline=maybe accepted")
		}
	})
	t.Run("no endpoint: no tracing", func(t *testing.T) {
		s, shutdown, err := Options{}.Open(t.Context(), "binder", "m")
		if err != nil {
			t.Fatal(err)
		}
		if s.Tracing() {
			t.Error("tracing without an endpoint")
		}
		if err := shutdown(t.Context()); err != nil {
			t.Error(err)
		}
	})
}

func BenchmarkRecord(b *testing.B) {
	s := New(DefaultClaims, DefaultSpansPerClaim, nil)
	uids := make([]string, 4096)
	for i := range uids {
		uids[i] = fmt.Sprintf("3f2c1e0a-0000-4000-8000-%012d", i)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			_, st := s.Start(ctx, uids[i%len(uids)], "sync")
			st.End("OK", "bound")
			i++
		}
	})
}

func BenchmarkNilStore(b *testing.B) {
	var s *Store
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, st := s.Start(ctx, "uid", "sync")
		st.End("OK", "bound")
	}
}
