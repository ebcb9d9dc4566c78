package watcher

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// errStopping ends the streams of a watcher that shuts down.
var errStopping = status.Error(codes.Unavailable, "the watcher is shutting down; subscribe again with your last cursor")

// batch is how many events a subscriber copies out of the ring per lock.
const batch = 512

// Progress marks (WatchRequest.progress_marks): once a stream has sent
// everything, a mark follows within markAfterSkip when events of other
// kinds were skipped since the last mark, and markIdle after the last
// message otherwise.
const (
	markAfterSkip = 200 * time.Millisecond
	markIdle      = time.Second
)

// markTiming is when progress marks are due; tests shorten it.
type markTiming struct {
	afterSkip, idle time.Duration
}

type server struct {
	watcherv1.UnimplementedWatcherServiceServer
	hub     *hub
	log     *slog.Logger
	nextSub atomic.Uint64
	// stopping is closed when the watcher shuts down: streams end at once
	// (subscribers resume elsewhere or after the restart) instead of
	// holding the graceful stop.
	stopping <-chan struct{}
	// marks: zero means markAfterSkip and markIdle.
	marks markTiming
}

func parseKinds(kinds []watcherv1.Kind) (kindSet, error) {
	var s kindSet
	if len(kinds) == 0 {
		// The storage kinds; pods only for those who ask.
		s[watcherv1.Kind_KIND_PERSISTENT_VOLUME] = true
		s[watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM] = true
		s[watcherv1.Kind_KIND_STORAGE_CLASS] = true
		return s, nil
	}
	for _, k := range kinds {
		switch k {
		case watcherv1.Kind_KIND_PERSISTENT_VOLUME, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_STORAGE_CLASS, watcherv1.Kind_KIND_POD:
			s[k] = true
		default:
			return s, status.Errorf(codes.InvalidArgument, "kinds: %v is not a kind the watcher serves; use KIND_PERSISTENT_VOLUME, KIND_PERSISTENT_VOLUME_CLAIM, KIND_STORAGE_CLASS or KIND_POD, or none for the three storage kinds", k)
		}
	}
	return s, nil
}

// Watch streams the log to one subscriber; see the package documentation
// for the resume contract.
func (s *server) Watch(req *watcherv1.WatchRequest, st grpc.ServerStreamingServer[watcherv1.WatchResponse]) error {
	kinds, err := parseKinds(req.GetKinds())
	if err != nil {
		return err
	}
	enc := req.GetEncoding()
	switch enc {
	case watcherv1.Encoding_ENCODING_UNSPECIFIED, watcherv1.Encoding_ENCODING_PROTOBUF, watcherv1.Encoding_ENCODING_JSON:
	default:
		return status.Errorf(codes.InvalidArgument, "encoding: %v is unknown; use ENCODING_PROTOBUF (default) or ENCODING_JSON", enc)
	}
	shard, err := parseShard(req.GetClaimShard())
	if err != nil {
		return err
	}
	ctx := st.Context()
	h := s.hub
	select {
	case <-h.syncedCh:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-s.stopping:
		return errStopping
	}

	log := s.log.With("subscriber", s.nextSub.Add(1))
	c := req.GetResumeAfter()
	next, resync, err := s.subscribe(c)
	if err != nil {
		return err
	}
	defer s.unsubscribe()
	if resync && c != nil {
		log.Info("subscriber cannot resume; sending a full list", "cursor_epoch", c.GetEpoch(), "cursor_sequence", c.GetSequence(), "epoch", h.epoch)
	}
	log.Info("subscriber connected", "kinds", kindNames(kinds), "claims", shard, "encoding", enc, "resume", !resync, "after", next)
	w := &subscription{s: s, st: st, log: log, kinds: kinds, shard: shard, enc: enc, next: next, cursor: next, resync: resync,
		marks: req.GetProgressMarks(), timing: s.markTiming()}
	if w.marks {
		w.due = time.NewTimer(w.timing.idle)
		defer w.due.Stop()
	}
	return w.run(ctx)
}

// subscribe counts a new subscriber and says where its stream starts:
// after the sequence next of the cursor c, or (resync) with a full list.
// A cursor ahead of the watcher's newest event is InvalidArgument.
func (s *server) subscribe(c *watcherv1.Cursor) (next uint64, resync bool, err error) {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subscribers++
	if c == nil || c.GetEpoch() != h.epoch {
		return 0, true, nil
	}
	if c.GetSequence() > h.head {
		h.subscribers--
		return 0, false, status.Errorf(codes.InvalidArgument, "resume_after: sequence %d is ahead of the watcher's newest event %d in epoch %s; resume from a cursor the watcher sent", c.GetSequence(), h.head, h.epoch)
	}
	if c.GetSequence()+1 >= h.oldest() {
		return c.GetSequence(), false, nil
	}
	return 0, true, nil
}

// subscription is one Watch stream being served.
type subscription struct {
	s     *server
	st    grpc.ServerStreamingServer[watcherv1.WatchResponse]
	log   *slog.Logger
	kinds kindSet
	shard *claimShard // nil: every claim
	enc   watcherv1.Encoding

	next     uint64    // the last sequence sent or skipped
	resync   bool      // a full list is due
	sent     int       // messages sent, for the disconnect log
	cursor   uint64    // the sequence of the last message sent
	lastSend time.Time // when the last message was sent
	lastMark time.Time // when the last progress mark was sent
	marks    bool
	timing   markTiming
	due      *time.Timer // the next progress mark, with marks
}

// run sends the stream until the subscriber goes, ctx ends or the
// watcher stops.
func (w *subscription) run(ctx context.Context) error {
	h := w.s.hub
	for {
		if w.resync {
			if err := w.sendList(); err != nil {
				return w.gone(err)
			}
		}
		h.mu.Lock()
		evs, ok, wait := h.since(w.next, batch)
		h.mu.Unlock()
		if !ok {
			w.log.Warn("subscriber fell behind the watcher's history; sending a full list", "last_sent", w.next)
			w.resync = true
			continue
		}
		if err := w.sendEvents(evs); err != nil {
			return w.gone(err)
		}
		if len(evs) > 0 {
			continue
		}
		// Everything up to next has been sent or skipped.
		markDue, err := w.markIfDue()
		if err != nil {
			return w.gone(err)
		}
		select {
		case <-wait:
		case <-markDue:
		case <-ctx.Done():
			return w.gone(status.FromContextError(ctx.Err()).Err())
		case <-w.s.stopping:
			return w.gone(errStopping)
		}
	}
}

func (w *subscription) gone(err error) error {
	w.log.Info("subscriber disconnected", "sent", w.sent, "last_sequence", w.next, "error", err)
	return err
}

// sendList sends a full list of the subscriber's kinds.
func (w *subscription) sendList() error {
	h := w.s.hub
	h.mu.Lock()
	objs, seq := h.snapshot(w.kinds)
	h.mu.Unlock()
	if w.shard != nil {
		// Outside the lock: hashing every claim takes a while.
		kept := objs[:0]
		for _, e := range objs {
			if w.shard.sends(e.kind, e.key) {
				kept = append(kept, e)
			}
		}
		objs = kept
	}
	if err := w.s.sendList(w.st, objs, seq, w.enc); err != nil {
		return err
	}
	w.next, w.resync = seq, false
	w.cursor, w.lastSend = seq, time.Now()
	w.sent += len(objs) + 2
	return nil
}

// sendEvents sends the events of the subscriber's kinds.
func (w *subscription) sendEvents(evs []*event) error {
	for _, e := range evs {
		w.next = e.seq
		if !w.kinds.has(e.kind) || !w.shard.sends(e.kind, e.key) {
			continue
		}
		if err := w.s.send(w.st, e, e.typ, e.seq, w.enc); err != nil {
			return err
		}
		w.cursor, w.lastSend = e.seq, time.Now()
		w.sent++
	}
	return nil
}

// markIfDue sends a progress mark when one is due (with marks), and
// returns when the next one is.
func (w *subscription) markIfDue() (<-chan time.Time, error) {
	if !w.marks {
		return nil, nil
	}
	d := w.timing.untilMark(time.Now(), w.next > w.cursor, w.lastSend, w.lastMark)
	if d <= 0 {
		if err := w.st.Send(&watcherv1.WatchResponse{Type: watcherv1.EventType_EVENT_TYPE_PROGRESS, Cursor: &watcherv1.Cursor{Epoch: w.s.hub.epoch, Sequence: w.next}}); err != nil {
			return nil, err
		}
		w.cursor, w.lastSend, w.lastMark = w.next, time.Now(), time.Now()
		w.sent++
		d = w.timing.idle
	}
	w.due.Reset(d)
	return w.due.C, nil
}

func (s *server) markTiming() markTiming {
	t := s.marks
	if t.afterSkip <= 0 {
		t.afterSkip = markAfterSkip
	}
	if t.idle <= 0 {
		t.idle = markIdle
	}
	return t
}

// untilMark is how long until a progress mark is due for a stream that has
// sent everything: skipped says whether events were skipped since the last
// message sent.
func (t markTiming) untilMark(now time.Time, skipped bool, lastSend, lastMark time.Time) time.Duration {
	if skipped {
		return lastMark.Add(t.afterSkip).Sub(now)
	}
	return lastSend.Add(t.idle).Sub(now)
}

func (s *server) unsubscribe() {
	s.hub.mu.Lock()
	s.hub.subscribers--
	s.hub.mu.Unlock()
}

// sendList sends RESET, every object as ADDED, and SYNCED, all with the
// cursor the list is consistent with.
func (s *server) sendList(st grpc.ServerStreamingServer[watcherv1.WatchResponse], objs []*event, seq uint64, enc watcherv1.Encoding) error {
	cur := &watcherv1.Cursor{Epoch: s.hub.epoch, Sequence: seq}
	if err := st.Send(&watcherv1.WatchResponse{Type: watcherv1.EventType_EVENT_TYPE_RESET, Cursor: cur}); err != nil {
		return err
	}
	for _, e := range objs {
		if err := s.send(st, e, watcherv1.EventType_EVENT_TYPE_ADDED, seq, enc); err != nil {
			return err
		}
	}
	return st.Send(&watcherv1.WatchResponse{Type: watcherv1.EventType_EVENT_TYPE_SYNCED, Cursor: cur})
}

func (s *server) send(st grpc.ServerStreamingServer[watcherv1.WatchResponse], e *event, typ watcherv1.EventType, seq uint64, enc watcherv1.Encoding) error {
	b, err := e.encode(enc)
	if err != nil {
		// Not the subscriber's fault and not fatal to the others.
		s.log.Error("encode object; event skipped", "kind", e.kind, "key", e.key, "error", err)
		return nil
	}
	return st.Send(&watcherv1.WatchResponse{
		Type:             typ,
		Kind:             e.kind,
		Cursor:           &watcherv1.Cursor{Epoch: s.hub.epoch, Sequence: seq},
		Key:              e.key,
		Object:           b,
		ResourceVersion:  e.rv,
		ObservedUnixNano: e.observed,
	})
}

// GetStatus reports the log's position and size.
func (s *server) GetStatus(_ context.Context, _ *watcherv1.GetStatusRequest) (*watcherv1.GetStatusResponse, error) {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	return &watcherv1.GetStatusResponse{
		Epoch:                  h.epoch,
		Sequence:               h.head,
		OldestSequence:         h.oldest(),
		Synced:                 h.synced,
		PersistentVolumes:      int64(len(h.state[watcherv1.Kind_KIND_PERSISTENT_VOLUME])),
		PersistentVolumeClaims: int64(len(h.state[watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM])),
		StorageClasses:         int64(len(h.state[watcherv1.Kind_KIND_STORAGE_CLASS])),
		Pods:                   int64(len(h.state[watcherv1.Kind_KIND_POD])),
		Subscribers:            int32(h.subscribers),
	}, nil
}

func kindNames(k kindSet) string {
	var names []string
	for i, on := range k {
		if on {
			names = append(names, strings.TrimPrefix(watcherv1.Kind(i).String(), "KIND_"))
		}
	}
	return fmt.Sprint(names)
}
