package watchclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/volplane/volplane/pkg/logging"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// Handler receives the stream. Calls never overlap.
type Handler interface {
	// Reset announces a full list: every object follows as ADDED, then
	// Synced. Objects the list does not mention no longer exist.
	Reset()
	// Event delivers one ADDED, UPDATED or DELETED event. An error is
	// logged; the stream goes on (a broken object must not stop the rest).
	Event(ev *watcherv1.WatchResponse) error
	// Synced marks the end of a full list.
	Synced()
}

// Watcher is one watcher replica.
type Watcher struct {
	// Name identifies the replica in logs (its address).
	Name string
	// Conn is a connection to it.
	Conn grpc.ClientConnInterface
}

// Defaults of Options.
const (
	DefaultStallTimeout  = 5 * time.Second
	DefaultProbeInterval = time.Second
)

// MinStaleAfter is the least age at which a consumer may call its view
// stale (Status.Stale) with the default probe interval: FreshAt moves at
// most once per probe, so a view that is perfectly current is up to one
// interval old before the next probe, and a bound below two intervals
// would call it stale between probes.
const MinStaleAfter = 2 * DefaultProbeInterval

// Options configures Run and RunFailover.
type Options struct {
	// Kinds to subscribe to; empty means the three storage kinds
	// (KIND_POD only when listed).
	Kinds []watcherv1.Kind
	// Encoding of the objects; default protobuf.
	Encoding watcherv1.Encoding
	// Logger; default slog.Default().
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the reconnect delay after every
	// replica failed in turn; defaults 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// StallTimeout is how long a stream may make no progress (see the
	// package documentation) before it is abandoned; default
	// DefaultStallTimeout.
	StallTimeout time.Duration
	// ProbeInterval is how often the watcher of an open stream is probed;
	// default DefaultProbeInterval.
	ProbeInterval time.Duration
	// Status, when set, is kept up to date with the stream's freshness.
	Status *Status
	// Shard, when set, asks for the claims of one shard only (see Shard);
	// no stream opens before its first Set. Nil asks for every claim.
	Shard *Shard
}

// Status is how current the handler's view is; safe for concurrent use.
// The zero value is ready to use and reports nothing fresh.
type Status struct {
	fresh   atomic.Int64 // unix nanoseconds; 0: never
	watcher atomic.Pointer[string]
	epoch   atomic.Pointer[string]
}

// FreshAt is the latest time at which the handler had been given every
// event the watcher had then (zero before the first full list).
func (s *Status) FreshAt() time.Time {
	n := s.fresh.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Stale reports whether the view is older than maxAge (or was never
// fresh).
func (s *Status) Stale(maxAge time.Duration) bool {
	n := s.fresh.Load()
	return n == 0 || time.Since(time.Unix(0, n)) > maxAge
}

// Watcher is the name of the replica streaming now ("" when none).
func (s *Status) Watcher() string {
	if p := s.watcher.Load(); p != nil {
		return *p
	}
	return ""
}

// Epoch is the epoch of the replica streaming now ("" before its first
// event).
func (s *Status) Epoch() string {
	if p := s.epoch.Load(); p != nil {
		return *p
	}
	return ""
}

// markFresh moves FreshAt forward to t (never back).
func (s *Status) markFresh(t time.Time) {
	n := t.UnixNano()
	for {
		old := s.fresh.Load()
		if old >= n || s.fresh.CompareAndSwap(old, n) {
			return
		}
	}
}

// Run subscribes through cc and delivers events to h until ctx ends; it
// then returns ctx's error.
func Run(ctx context.Context, cc grpc.ClientConnInterface, o Options, h Handler) error {
	return RunFailover(ctx, []Watcher{{Name: "watcher", Conn: cc}}, o, h)
}

// RunFailover subscribes to one of the watchers at a time and delivers
// events to h until ctx ends; it then returns ctx's error. It moves to
// another replica when the stream breaks or stalls (see the package
// documentation).
func RunFailover(ctx context.Context, watchers []Watcher, o Options, h Handler) error {
	if len(watchers) == 0 {
		return errors.New("watchclient: no watcher to subscribe to")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(10*time.Second, o.MinBackoff)
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.Encoding == watcherv1.Encoding_ENCODING_UNSPECIFIED {
		o.Encoding = watcherv1.Encoding_ENCODING_PROTOBUF
	}
	if o.Status == nil {
		o.Status = &Status{}
	}
	// One warning when the stream breaks, one info line when a stream
	// delivers again (from this replica or another), the retries between
	// at Debug.
	s := &subscription{o: o, h: h, watchers: make([]replica, len(watchers)), outage: logging.NewOutage(o.Logger, "watcher")}
	for i, w := range watchers {
		s.watchers[i] = replica{name: w.Name, client: watcherv1.NewWatcherServiceClient(w.Conn), health: healthpb.NewHealthClient(w.Conn)}
	}
	// Replicas of a subscriber spread over the watchers.
	next := rand.IntN(len(watchers))
	backoff := o.MinBackoff
	failed := 0 // replicas that failed in a row without progress
	for {
		w := s.choose(ctx, next)
		progressed, err := s.stream(ctx, w)
		if ctx.Err() != nil {
			o.Status.watcher.Store(nil)
			return ctx.Err()
		}
		if errors.Is(err, errReshard) {
			// Not a failure: the same replica lists the new shard at once.
			o.Logger.Info("claim shard changed; listing again", "watcher", s.watchers[w].name)
			next = w
			continue
		}
		if progressed {
			backoff, failed = o.MinBackoff, 0
		} else {
			failed++
		}
		next = (w + 1) % len(s.watchers)
		if failed < len(s.watchers) && len(s.watchers) > 1 {
			s.outage.Failed(fmt.Errorf("watch stream ended: %w", err), "watcher", s.watchers[w].name, "next", s.watchers[next].name)
			continue
		}
		s.outage.Failed(fmt.Errorf("watch stream ended: %w", err), "watcher", s.watchers[w].name, "retry_in", backoff, "resume", s.cursor != nil)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			o.Status.watcher.Store(nil)
			return ctx.Err()
		}
		backoff = min(2*backoff, o.MaxBackoff)
		failed = 0
	}
}

type replica struct {
	name   string
	client watcherv1.WatcherServiceClient
	health healthpb.HealthClient
}

type subscription struct {
	o        Options
	h        Handler
	watchers []replica
	// outage reports the stream's breaks and recoveries.
	outage *logging.Outage
	// cursor is the last event delivered after a SYNCED; nil means the
	// next stream must start with a full list. It is sent to whichever
	// replica is next: only the replica of its epoch resumes it.
	cursor *watcherv1.Cursor
	// shard is the claim shard of the stream under way or last opened
	// (with Options.Shard).
	shard *watcherv1.ClaimShard
}

// serviceName is the watcher's service in gRPC health.
var serviceName = watcherv1.WatcherService_ServiceDesc.ServiceName

// serving asks replica i whether it serves; a replica without the health
// service counts as serving.
func (s *subscription) serving(ctx context.Context, i int, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := s.watchers[i].health.Check(ctx, &healthpb.HealthCheckRequest{Service: serviceName})
	if status.Code(err) == codes.Unimplemented {
		return true
	}
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// choose returns the first replica from start on that is SERVING, or start
// when none is (then the stream waits for it).
func (s *subscription) choose(ctx context.Context, start int) int {
	if len(s.watchers) == 1 {
		return start
	}
	for k := range s.watchers {
		i := (start + k) % len(s.watchers)
		if s.serving(ctx, i, s.o.ProbeInterval) {
			return i
		}
	}
	return start
}

// progress is what the prober and the receiving side share.
type progress struct {
	lastSeq  atomic.Uint64 // sequence of the newest event or mark received
	lastRecv atomic.Int64  // unix nanoseconds of the newest message received
	epoch    atomic.Pointer[string]
	listing  atomic.Bool  // inside RESET … SYNCED, or before the first event
	caughtUp atomic.Int64 // unix nanoseconds of the latest probe the stream had caught up with

	mu sync.Mutex
	// pending are probes of a SERVING watcher whose newest sequence the
	// stream had not reached yet, oldest first (heads never decrease).
	pending []sample
}

// sample is what a probe found: the watcher's newest sequence at a time.
type sample struct {
	at   time.Time
	head uint64
}

// maxPending bounds the probes waiting for the stream to catch up; the
// oldest go first (FreshAt then lags more, never less, than it could).
const maxPending = 32

// wait records a probe the stream has not caught up with yet, then
// resolves what the stream has reached meanwhile.
func (p *progress) wait(smp sample, st *Status) {
	p.mu.Lock()
	if len(p.pending) == maxPending {
		p.pending = p.pending[1:]
	}
	p.pending = append(p.pending, smp)
	p.mu.Unlock()
	p.reached(st)
}

// reached resolves the probes whose newest sequence the stream has now
// reached: the view was current as of the latest of them. Called on every
// message received, and by wait.
func (p *progress) reached(st *Status) {
	if p.listing.Load() {
		return
	}
	seq := p.lastSeq.Load()
	p.mu.Lock()
	var at time.Time
	i := 0
	for ; i < len(p.pending) && p.pending[i].head <= seq; i++ {
		at = p.pending[i].at
	}
	p.pending = p.pending[i:]
	p.mu.Unlock()
	if !at.IsZero() {
		p.caught(at)
		st.markFresh(at)
	}
}

// caught moves caughtUp forward to t.
func (p *progress) caught(t time.Time) {
	n := t.UnixNano()
	for {
		old := p.caughtUp.Load()
		if old >= n || p.caughtUp.CompareAndSwap(old, n) {
			return
		}
	}
}

// errStalled ends a stream that the prober gave up on.
var errStalled = errors.New("the watcher stream stalled")

// stream runs one stream on replica w until it breaks; progressed says
// whether it delivered anything.
func (s *subscription) stream(ctx context.Context, w int) (progressed bool, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rep := s.watchers[w]
	req := &watcherv1.WatchRequest{Kinds: s.o.Kinds, Encoding: s.o.Encoding, ProgressMarks: true}
	if s.o.Shard != nil {
		if req.ClaimShard, err = s.awaitShard(ctx, cancel); err != nil {
			return false, err
		}
	}
	s.o.Status.watcher.Store(&rep.name)
	if s.cursor != nil {
		req.ResumeAfter = proto.Clone(s.cursor).(*watcherv1.Cursor)
	}
	opened := time.Now()
	waiting := time.AfterFunc(s.o.StallTimeout, func() { s.notOpened(rep.name) })
	st, err := rep.client.Watch(ctx, req, grpc.WaitForReady(true))
	waiting.Stop()
	if err != nil {
		return false, err
	}
	r := s.newReceiver(opened)
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		s.probe(ctx, w, &r.p, cancel)
	}()
	defer func() { cancel(nil); <-probeDone }()
	for {
		ev, err := st.Recv()
		if err != nil {
			return progressed, s.streamEnded(ctx, rep.name, err)
		}
		if !progressed {
			s.outage.Recovered("watcher", rep.name)
		}
		progressed = true
		r.receive(ev)
	}
}

// notOpened reports a stream that has not opened within StallTimeout: the
// watcher is down, or not up yet when the subscriber starts. The Watch
// call waits for the connection (WaitForReady) and returns no error
// meanwhile, so without this the outage would have no line at all; the
// stream's first delivery ends it ("reachable again").
func (s *subscription) notOpened(watcher string) {
	s.outage.Failed(fmt.Errorf("no stream opened within %s: the watcher is not reachable", s.o.StallTimeout), "watcher", watcher)
}

// awaitShard waits until the binder owns a shard, and returns it. The
// stream is then canceled (errReshard) as soon as the wanted shard
// changes, since a stream delivers only the shard it was opened for.
func (s *subscription) awaitShard(ctx context.Context, cancel context.CancelCauseFunc) (*watcherv1.ClaimShard, error) {
	shard, changed := s.o.Shard.wanted()
	for shard == nil {
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		shard, changed = s.o.Shard.wanted()
	}
	if s.shard != nil && !proto.Equal(s.shard, shard) {
		// A resumed stream would never send the claims gained.
		s.cursor = nil
	}
	s.shard = shard
	s.o.Shard.opened(shard)
	go func() {
		select {
		case <-changed:
			cancel(errReshard)
		case <-ctx.Done():
		}
	}()
	return shard, nil
}

// streamEnded is the error a stream ended with, told as its cause: a
// stall or a reshard rather than the cancellation they caused. A resume
// cursor the watcher refused is dropped, so the next stream lists again.
func (s *subscription) streamEnded(ctx context.Context, watcher string, err error) error {
	if c := context.Cause(ctx); errors.Is(c, errStalled) || errors.Is(c, errReshard) {
		err = c
	}
	if errors.Is(err, io.EOF) {
		err = errors.New("the watcher closed the stream")
	}
	if status.Code(err) == codes.InvalidArgument && s.cursor != nil {
		// The watcher cannot resume from our cursor: start over.
		s.o.Logger.Warn("the watcher rejected the resume cursor; listing again", "watcher", watcher, "error", err)
		s.cursor = nil
	}
	return err
}

// receiver is what one stream keeps while it receives: the progress the
// prober reads, whether the view is synced, and when the list in
// progress began (zero when none is).
type receiver struct {
	s         *subscription
	p         progress
	synced    bool
	listStart time.Time
}

// newReceiver starts the receiving side of a stream opened at opened:
// resumed (synced) when the subscription has a cursor, listing otherwise.
func (s *subscription) newReceiver(opened time.Time) *receiver {
	r := &receiver{s: s, synced: s.cursor != nil, listStart: opened}
	r.p.lastRecv.Store(opened.UnixNano())
	r.p.caughtUp.Store(opened.UnixNano())
	if r.synced {
		r.p.lastSeq.Store(s.cursor.GetSequence())
		r.p.epoch.Store(&s.cursor.Epoch)
	}
	r.p.listing.Store(!r.synced)
	return r
}

// receive handles one message of the stream.
func (r *receiver) receive(ev *watcherv1.WatchResponse) {
	s := r.s
	if c := ev.GetCursor(); c != nil {
		r.p.lastSeq.Store(c.GetSequence())
		if e := r.p.epoch.Load(); e == nil || *e != c.GetEpoch() {
			epoch := c.GetEpoch()
			r.p.epoch.Store(&epoch)
			s.o.Status.epoch.Store(&epoch)
		}
	}
	r.p.lastRecv.Store(time.Now().UnixNano())
	switch ev.Type {
	case watcherv1.EventType_EVENT_TYPE_RESET:
		r.reset()
	case watcherv1.EventType_EVENT_TYPE_SYNCED:
		r.listed(ev)
	case watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.EventType_EVENT_TYPE_UPDATED, watcherv1.EventType_EVENT_TYPE_DELETED:
		if err := s.h.Event(ev); err != nil {
			s.o.Logger.Error("handle watch event", "kind", ev.Kind, "key", ev.Key, "type", ev.Type, "error", err)
		}
		if r.synced {
			s.cursor = ev.Cursor
		}
	case watcherv1.EventType_EVENT_TYPE_PROGRESS:
		// Every event of our kinds up to its cursor has been
		// delivered: the stream is caught up to there (the prober
		// reads lastSeq), and a resume may start from it.
		if r.synced {
			s.cursor = ev.Cursor
		}
	default:
		s.o.Logger.Warn("unknown watch event type; ignored", "type", ev.Type)
	}
	r.p.reached(s.o.Status)
}

// reset starts a list over: the watcher sends the whole view again.
func (r *receiver) reset() {
	r.synced = false
	r.p.listing.Store(true)
	r.s.cursor = nil
	if r.listStart.IsZero() {
		r.listStart = time.Now() // a RESET in the middle of a stream
	}
	r.s.h.Reset()
}

// listed ends a list (SYNCED): the view is whole as of the list's start.
func (r *receiver) listed(ev *watcherv1.WatchResponse) {
	s := r.s
	r.synced = true
	s.cursor = ev.Cursor
	s.h.Synced()
	if s.shard != nil {
		// After Synced: the view holds the shard's claims now.
		s.o.Shard.delivered(s.shard)
	}
	r.p.listing.Store(false)
	// The list holds every event the watcher had when the stream was
	// opened (or, mid-stream, when RESET came).
	s.o.Status.markFresh(r.listStart)
	r.listStart = time.Time{}
}

// probe checks replica w every ProbeInterval while its stream runs: it
// moves Status.FreshAt forward when the handler has every event the
// watcher had at the probe, and ends the stream (errStalled) when it makes
// no progress for StallTimeout.
func (s *subscription) probe(ctx context.Context, w int, p *progress, stop context.CancelCauseFunc) {
	rep := s.watchers[w]
	t := time.NewTicker(s.o.ProbeInterval)
	defer t.Stop()
	var (
		lastOK      = time.Now() // the last probe that answered
		lastServing = time.Now() // the last probe that found it SERVING
		statusless  bool         // GetStatus unimplemented: judge by events only
	)
	check := func() {
		now := time.Now()
		serving := s.serving(ctx, w, s.o.ProbeInterval)
		if serving {
			lastServing = now
		}
		if statusless {
			if serving && !p.listing.Load() {
				s.o.Status.markFresh(now)
			}
		} else {
			pctx, cancel := context.WithTimeout(ctx, s.o.ProbeInterval)
			st, err := rep.client.GetStatus(pctx, &watcherv1.GetStatusRequest{})
			cancel()
			switch {
			case status.Code(err) == codes.Unimplemented:
				statusless = true
				lastOK = now
			case err != nil:
			default:
				lastOK = now
				e := p.epoch.Load()
				sameEpoch := e == nil || *e == st.GetEpoch()
				switch {
				case !sameEpoch:
					// The replica restarted under the stream: the stream
					// will break; nothing to measure.
				case p.lastSeq.Load() >= st.GetSequence():
					p.caught(now)
					if serving && !p.listing.Load() {
						s.o.Status.markFresh(now)
					}
				case serving:
					// Fresh as of now once the stream reaches this head
					// (with an event or a progress mark).
					p.wait(sample{at: now, head: st.GetSequence()}, s.o.Status)
				}
			}
		}
		caughtUp := time.Unix(0, p.caughtUp.Load())
		lastEvent := time.Unix(0, p.lastRecv.Load())
		var why string
		switch {
		case now.Sub(lastOK) > s.o.StallTimeout:
			why = "the watcher does not answer probes"
		case !statusless && now.Sub(caughtUp) > s.o.StallTimeout && now.Sub(lastEvent) > s.o.StallTimeout:
			why = "the watcher has events the stream does not deliver"
		case now.Sub(lastServing) > s.o.StallTimeout && s.otherServing(ctx, w):
			why = "the watcher is not serving and another one is"
		}
		if why != "" {
			s.o.Logger.Warn("abandoning the watch stream", "watcher", rep.name, "why", why, "last_sequence", p.lastSeq.Load())
			stop(errStalled)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}

// otherServing reports whether a replica other than w is SERVING.
func (s *subscription) otherServing(ctx context.Context, w int) bool {
	for i := range s.watchers {
		if i != w && s.serving(ctx, i, s.o.ProbeInterval) {
			return true
		}
	}
	return false
}
