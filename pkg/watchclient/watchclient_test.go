package watchclient_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/volplane/volplane/pkg/watchclient"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// script is a fake watcher: each stream plays the next scripted list of
// events, then fails (or, for the last one, waits).
type script struct {
	watcherv1.UnimplementedWatcherServiceServer
	mu           sync.Mutex
	streams      [][]*watcherv1.WatchResponse
	requests     []*watcherv1.WatchRequest
	rejectResume bool
}

func (s *script) Watch(req *watcherv1.WatchRequest, st grpc.ServerStreamingServer[watcherv1.WatchResponse]) error {
	s.mu.Lock()
	s.requests = append(s.requests, req)
	if s.rejectResume && req.ResumeAfter != nil {
		s.rejectResume = false
		s.mu.Unlock()
		return status.Error(codes.InvalidArgument, "cursor from the future")
	}
	if len(s.streams) == 0 {
		s.mu.Unlock()
		<-st.Context().Done()
		return nil
	}
	evs := s.streams[0]
	s.streams = s.streams[1:]
	s.mu.Unlock()
	for _, ev := range evs {
		if err := st.Send(ev); err != nil {
			return err
		}
	}
	return status.Error(codes.Unavailable, "stream broken on purpose")
}

func ev(t watcherv1.EventType, key string, seq uint64) *watcherv1.WatchResponse {
	return &watcherv1.WatchResponse{Type: t, Kind: watcherv1.Kind_KIND_PERSISTENT_VOLUME, Key: key, Cursor: &watcherv1.Cursor{Epoch: "e1", Sequence: seq}}
}

type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) add(s string) { r.mu.Lock(); r.log = append(r.log, s); r.mu.Unlock() }
func (r *recorder) Reset()       { r.add("reset") }
func (r *recorder) Synced()      { r.add("synced") }
func (r *recorder) Event(e *watcherv1.WatchResponse) error {
	r.add(e.Type.String()[len("EVENT_TYPE_"):] + " " + e.Key)
	return nil
}
func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

func serve(t *testing.T, s *script) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	watcherv1.RegisterWatcherServiceServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func run(t *testing.T, s *script, want int) ([]string, []*watcherv1.WatchRequest) {
	t.Helper()
	cc := serve(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	r := &recorder{}
	done := make(chan error)
	go func() {
		done <- watchclient.Run(ctx, cc, watchclient.Options{MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}, r)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(r.snapshot()) < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Run returned %v, want context.Canceled", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return r.snapshot(), s.requests
}

func TestResumesAfterTheLastDeliveredEvent(t *testing.T) {
	s := &script{streams: [][]*watcherv1.WatchResponse{
		{ev(watcherv1.EventType_EVENT_TYPE_RESET, "", 2), ev(watcherv1.EventType_EVENT_TYPE_ADDED, "a", 2), ev(watcherv1.EventType_EVENT_TYPE_ADDED, "b", 2),
			ev(watcherv1.EventType_EVENT_TYPE_SYNCED, "", 2), ev(watcherv1.EventType_EVENT_TYPE_UPDATED, "a", 3)},
		{ev(watcherv1.EventType_EVENT_TYPE_DELETED, "b", 4)},
	}}
	log, reqs := run(t, s, 6)
	want := []string{"reset", "ADDED a", "ADDED b", "synced", "UPDATED a", "DELETED b"}
	if len(log) != len(want) {
		t.Fatalf("handler saw %v, want %v", log, want)
	}
	for i := range want {
		if log[i] != want[i] {
			t.Fatalf("handler saw %v, want %v", log, want)
		}
	}
	if reqs[0].ResumeAfter != nil {
		t.Errorf("first stream resumed from %v", reqs[0].ResumeAfter)
	}
	if c := reqs[1].ResumeAfter; c == nil || c.Epoch != "e1" || c.Sequence != 3 {
		t.Errorf("second stream resumed after %v, want e1/3", c)
	}
	if reqs[0].Encoding != watcherv1.Encoding_ENCODING_PROTOBUF {
		t.Errorf("encoding %v, want protobuf by default", reqs[0].Encoding)
	}
}

func TestStreamBrokenDuringTheListStartsOver(t *testing.T) {
	s := &script{streams: [][]*watcherv1.WatchResponse{
		{ev(watcherv1.EventType_EVENT_TYPE_RESET, "", 5), ev(watcherv1.EventType_EVENT_TYPE_ADDED, "a", 5)},
		{ev(watcherv1.EventType_EVENT_TYPE_RESET, "", 6), ev(watcherv1.EventType_EVENT_TYPE_ADDED, "a", 6), ev(watcherv1.EventType_EVENT_TYPE_SYNCED, "", 6)},
	}}
	log, reqs := run(t, s, 5)
	if len(reqs) < 2 || reqs[1].ResumeAfter != nil {
		t.Fatalf("a stream broken before SYNCED must start over without a cursor; requests %v", reqs)
	}
	if len(log) != 5 || log[2] != "reset" || log[4] != "synced" {
		t.Fatalf("handler saw %v", log)
	}
}

func TestRejectedCursorStartsOver(t *testing.T) {
	s := &script{rejectResume: true, streams: [][]*watcherv1.WatchResponse{
		{ev(watcherv1.EventType_EVENT_TYPE_RESET, "", 1), ev(watcherv1.EventType_EVENT_TYPE_SYNCED, "", 1)},
		{ev(watcherv1.EventType_EVENT_TYPE_RESET, "", 9), ev(watcherv1.EventType_EVENT_TYPE_SYNCED, "", 9)},
	}}
	log, reqs := run(t, s, 4)
	if len(reqs) < 3 || reqs[1].ResumeAfter == nil || reqs[2].ResumeAfter != nil {
		t.Fatalf("after InvalidArgument on the cursor the client must list again; requests %v", reqs)
	}
	if len(log) != 4 {
		t.Fatalf("handler saw %v", log)
	}
}

// stalled is a fake watcher whose stream sends a list and then nothing,
// while GetStatus reports newer events: the stream is stuck.
type stalled struct {
	watcherv1.UnimplementedWatcherServiceServer
	epoch string
	head  uint64
	// after, when set, holds every stream until it is closed.
	after <-chan struct{}
	mu    sync.Mutex
	calls int
	first chan struct{} // closed at the first stream
}

func (s *stalled) Watch(req *watcherv1.WatchRequest, st grpc.ServerStreamingServer[watcherv1.WatchResponse]) error {
	s.mu.Lock()
	s.calls++
	if s.calls == 1 && s.first != nil {
		close(s.first)
	}
	s.mu.Unlock()
	if s.after != nil {
		select {
		case <-s.after:
		case <-st.Context().Done():
			return nil
		}
	}
	cur := &watcherv1.Cursor{Epoch: s.epoch, Sequence: 1}
	for _, typ := range []watcherv1.EventType{watcherv1.EventType_EVENT_TYPE_RESET, watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.EventType_EVENT_TYPE_SYNCED} {
		key := ""
		if typ == watcherv1.EventType_EVENT_TYPE_ADDED {
			key = s.epoch + "-object"
		}
		if err := st.Send(&watcherv1.WatchResponse{Type: typ, Kind: watcherv1.Kind_KIND_PERSISTENT_VOLUME, Key: key, Cursor: cur}); err != nil {
			return err
		}
	}
	<-st.Context().Done()
	return nil
}

func (s *stalled) GetStatus(context.Context, *watcherv1.GetStatusRequest) (*watcherv1.GetStatusResponse, error) {
	return &watcherv1.GetStatusResponse{Epoch: s.epoch, Sequence: s.head, Synced: true}, nil
}

func serveWatcher(t *testing.T, srv watcherv1.WatcherServiceServer) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	watcherv1.RegisterWatcherServiceServer(s, srv)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// A stream that stops delivering while its watcher has newer events is
// abandoned for the other watcher, and Status says the view went stale
// meanwhile and fresh again after the move.
func TestStalledStreamFailsOver(t *testing.T) {
	stuck := &stalled{epoch: "stuck", head: 100, first: make(chan struct{})} // always behind
	// The healthy watcher answers only once the stuck one was tried, so
	// the client goes through the stuck one whichever it starts with.
	healthy := &stalled{epoch: "healthy", head: 1, after: stuck.first}
	watchers := []watchclient.Watcher{{Name: "stuck", Conn: serveWatcher(t, stuck)}, {Name: "healthy", Conn: serveWatcher(t, healthy)}}
	var st watchclient.Status
	r := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- watchclient.RunFailover(ctx, watchers, watchclient.Options{StallTimeout: 300 * time.Millisecond, ProbeInterval: 20 * time.Millisecond, MinBackoff: time.Millisecond, Status: &st}, r)
	}()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(10 * time.Second)
	for st.Watcher() != "healthy" || st.Stale(100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("on watcher %q, fresh at %v; handler saw %v", st.Watcher(), st.FreshAt(), r.snapshot())
		}
		time.Sleep(5 * time.Millisecond)
	}
	log := r.snapshot()
	if len(log) < 6 || log[1] != "ADDED stuck-object" || log[len(log)-2] != "ADDED healthy-object" {
		t.Fatalf("handler saw %v, want the stuck watcher's list, then the healthy one's", log)
	}
	// The healthy watcher is caught up: the client stays on it.
	n := len(log)
	until := time.Now().Add(time.Second)
	for time.Now().Before(until) {
		if w := st.Watcher(); w != "healthy" {
			t.Fatalf("moved off the healthy watcher to %q", w)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := r.snapshot(); len(got) != n {
		t.Fatalf("the healthy stream was restarted: %v", got[n:])
	}
	if st.Stale(100 * time.Millisecond) {
		t.Fatalf("a caught-up stream is stale: fresh at %v", st.FreshAt())
	}
}

// The client asks for progress marks; a mark is not an event for the
// handler, and the next stream resumes after it.
func TestProgressMarkAdvancesTheCursor(t *testing.T) {
	s := &script{streams: [][]*watcherv1.WatchResponse{
		{ev(watcherv1.EventType_EVENT_TYPE_RESET, "", 2), ev(watcherv1.EventType_EVENT_TYPE_ADDED, "a", 2), ev(watcherv1.EventType_EVENT_TYPE_SYNCED, "", 2),
			ev(watcherv1.EventType_EVENT_TYPE_UPDATED, "a", 3), {Type: watcherv1.EventType_EVENT_TYPE_PROGRESS, Cursor: &watcherv1.Cursor{Epoch: "e1", Sequence: 9}}},
		{ev(watcherv1.EventType_EVENT_TYPE_DELETED, "a", 10)},
	}}
	log, reqs := run(t, s, 5)
	want := []string{"reset", "ADDED a", "synced", "UPDATED a", "DELETED a"}
	if strings.Join(log, ",") != strings.Join(want, ",") {
		t.Fatalf("handler saw %v, want %v", log, want)
	}
	if !reqs[0].ProgressMarks {
		t.Error("the client did not ask for progress marks")
	}
	if c := reqs[1].ResumeAfter; c == nil || c.Epoch != "e1" || c.Sequence != 9 {
		t.Errorf("second stream resumed after %v, want e1/9 (the mark)", c)
	}
}

// marking is a fake watcher whose head moves all the time with events of a
// kind its subscriber did not ask for: the stream sends a list, then only
// progress marks up to the head.
type marking struct {
	watcherv1.UnimplementedWatcherServiceServer
	head  atomic.Uint64
	calls atomic.Int32
	every time.Duration // between marks; 0 means 20ms
}

func (m *marking) Watch(req *watcherv1.WatchRequest, st grpc.ServerStreamingServer[watcherv1.WatchResponse]) error {
	m.calls.Add(1)
	cur := func() *watcherv1.Cursor { return &watcherv1.Cursor{Epoch: "e1", Sequence: m.head.Load()} }
	list := cur()
	for _, typ := range []watcherv1.EventType{watcherv1.EventType_EVENT_TYPE_RESET, watcherv1.EventType_EVENT_TYPE_SYNCED} {
		if err := st.Send(&watcherv1.WatchResponse{Type: typ, Cursor: list}); err != nil {
			return err
		}
	}
	every := m.every
	if every == 0 {
		every = 20 * time.Millisecond
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-st.Context().Done():
			return nil
		}
		if !req.ProgressMarks {
			continue
		}
		if err := st.Send(&watcherv1.WatchResponse{Type: watcherv1.EventType_EVENT_TYPE_PROGRESS, Cursor: cur()}); err != nil {
			return err
		}
	}
}

func (m *marking) GetStatus(context.Context, *watcherv1.GetStatusRequest) (*watcherv1.GetStatusResponse, error) {
	// Every probe finds newer events (of the other kind).
	return &watcherv1.GetStatusResponse{Epoch: "e1", Sequence: m.head.Add(10), Synced: true}, nil
}

// Events of kinds the subscriber did not ask for move the watcher's head
// all the time; with progress marks the stream is caught up all the same:
// it stays fresh and is never abandoned.
func TestOtherKindsAreNoStall(t *testing.T) {
	m := &marking{}
	var st watchclient.Status
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- watchclient.Run(ctx, serveWatcher(t, m), watchclient.Options{StallTimeout: 300 * time.Millisecond, ProbeInterval: 20 * time.Millisecond, MinBackoff: time.Millisecond, Status: &st}, &recorder{})
	}()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(10 * time.Second)
	for st.Stale(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stream never turned fresh")
		}
		time.Sleep(5 * time.Millisecond)
	}
	until := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(until) {
		if st.Stale(200 * time.Millisecond) {
			t.Fatalf("stale while caught up with every mark: fresh at %v", st.FreshAt())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := m.calls.Load(); n != 1 {
		t.Fatalf("%d streams, want the first one kept", n)
	}
}

// A stream that keeps up is fresh as of its watcher's last probe as soon as
// a mark reaches the head that probe found: FreshAt lags by about one probe
// interval, not two.
func TestFreshWithinAProbeInterval(t *testing.T) {
	const interval = 500 * time.Millisecond
	m := &marking{every: 10 * time.Millisecond}
	var st watchclient.Status
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- watchclient.Run(ctx, serveWatcher(t, m), watchclient.Options{StallTimeout: 5 * time.Second, ProbeInterval: interval, MinBackoff: time.Millisecond, Status: &st}, &recorder{})
	}()
	defer func() {
		cancel()
		<-done
	}()
	deadline := time.Now().Add(10 * time.Second)
	for st.Stale(interval) {
		if time.Now().After(deadline) {
			t.Fatal("the stream never turned fresh")
		}
		time.Sleep(5 * time.Millisecond)
	}
	worst := time.Duration(0)
	until := time.Now().Add(3 * time.Second)
	for time.Now().Before(until) {
		worst = max(worst, time.Since(st.FreshAt()))
		time.Sleep(5 * time.Millisecond)
	}
	if worst > interval*3/2 {
		t.Fatalf("FreshAt lagged by up to %s with a probe every %s and a mark every 10ms", worst, interval)
	}
	t.Logf("FreshAt lagged by at most %s", worst)
}

// syncedBuffer is a log sink written by the subscriber and read by the
// test.
type syncedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A watcher that is down when the subscriber starts is an outage like
// one that goes down later: one warning while no stream opens, one info
// line when the stream delivers (issue 39's loose end: the Watch call
// waits for the connection without an error, so nothing was logged).
func TestWatcherDownAtStartIsAnOutage(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens yet
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	var logs syncedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	r := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- watchclient.RunFailover(ctx, []watchclient.Watcher{{Name: "w0", Conn: cc}},
			watchclient.Options{StallTimeout: 200 * time.Millisecond, MinBackoff: time.Millisecond, Logger: log}, r)
	}()
	defer func() {
		cancel()
		<-done
	}()
	waitLog(t, &logs, `level=WARN msg="watcher unreachable"`)
	if !strings.Contains(logs.String(), "no stream opened within 200ms") {
		t.Errorf("the warning does not say why:\n%s", logs.String())
	}
	s := &script{streams: [][]*watcherv1.WatchResponse{{ev(watcherv1.EventType_EVENT_TYPE_SYNCED, "", 1)}}}
	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("the port was taken meanwhile: %v", err)
	}
	srv := grpc.NewServer()
	watcherv1.RegisterWatcherServiceServer(srv, s)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	waitLog(t, &logs, `level=INFO msg="watcher reachable again"`)
	// (The scripted stream breaks after its list: a second outage.)
	before, _, _ := strings.Cut(logs.String(), `msg="watcher reachable again"`)
	if n := strings.Count(before, `level=WARN msg="watcher unreachable"`); n != 1 {
		t.Errorf("%d warnings before the stream delivered, want 1:\n%s", n, logs.String())
	}
}

// waitLog waits until logs hold want.
func waitLog(t *testing.T, logs *syncedBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in:\n%s", want, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
