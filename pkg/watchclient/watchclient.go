// Package watchclient subscribes to the watcher service and keeps the
// subscription going: it reconnects with backoff after a broken stream and
// resumes after the last event it delivered, so that the handler sees
// every change exactly once and in order.
//
// The contract with the watcher:
//
//   - A stream without a cursor (or with one the watcher cannot resume:
//     another epoch after a watcher restart, or events already dropped
//     from its history) starts with RESET, then ADDED for every current
//     object, then SYNCED, then live changes.
//   - A stream with a cursor the watcher can resume delivers exactly the
//     events after it.
//   - A RESET may also arrive in the middle of a stream, when a slow
//     subscriber fell behind the watcher's history; a full list and
//     SYNCED follow.
//
// The client only resumes from a cursor taken after a SYNCED: a stream
// broken during the initial list starts over with a full list.
package watchclient

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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

// Options configures Run.
type Options struct {
	// Kinds to subscribe to; empty means all.
	Kinds []watcherv1.Kind
	// Encoding of the objects; default protobuf.
	Encoding watcherv1.Encoding
	// Logger; default slog.Default().
	Logger *slog.Logger
	// MinBackoff and MaxBackoff bound the reconnect delay; defaults 100ms
	// and 10s.
	MinBackoff, MaxBackoff time.Duration
}

// Run subscribes through cc and delivers events to h until ctx ends; it
// then returns ctx's error.
func Run(ctx context.Context, cc grpc.ClientConnInterface, o Options, h Handler) error {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(10*time.Second, o.MinBackoff)
	}
	if o.Encoding == watcherv1.Encoding_ENCODING_UNSPECIFIED {
		o.Encoding = watcherv1.Encoding_ENCODING_PROTOBUF
	}
	s := &subscription{client: watcherv1.NewWatcherServiceClient(cc), o: o, h: h}
	backoff := o.MinBackoff
	for {
		progressed, err := s.stream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if progressed {
			backoff = o.MinBackoff
		}
		o.Logger.Warn("watch stream ended; reconnecting", "error", err, "retry_in", backoff, "resume", s.cursor != nil)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, o.MaxBackoff)
	}
}

type subscription struct {
	client watcherv1.WatcherServiceClient
	o      Options
	h      Handler
	// cursor is the last event delivered after a SYNCED; nil means the
	// next stream must start with a full list.
	cursor *watcherv1.Cursor
}

// stream runs one stream until it breaks; progressed says whether it
// delivered anything.
func (s *subscription) stream(ctx context.Context) (progressed bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &watcherv1.WatchRequest{Kinds: s.o.Kinds, Encoding: s.o.Encoding}
	if s.cursor != nil {
		req.ResumeAfter = proto.Clone(s.cursor).(*watcherv1.Cursor)
	}
	st, err := s.client.Watch(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	synced := s.cursor != nil
	for {
		ev, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("the watcher closed the stream")
			}
			if status.Code(err) == codes.InvalidArgument && s.cursor != nil {
				// The watcher cannot resume from our cursor: start over.
				s.o.Logger.Warn("the watcher rejected the resume cursor; listing again", "error", err)
				s.cursor = nil
			}
			return progressed, err
		}
		progressed = true
		switch ev.Type {
		case watcherv1.EventType_EVENT_TYPE_RESET:
			synced = false
			s.cursor = nil
			s.h.Reset()
		case watcherv1.EventType_EVENT_TYPE_SYNCED:
			synced = true
			s.cursor = ev.Cursor
			s.h.Synced()
		case watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.EventType_EVENT_TYPE_UPDATED, watcherv1.EventType_EVENT_TYPE_DELETED:
			if err := s.h.Event(ev); err != nil {
				s.o.Logger.Error("handle watch event", "kind", ev.Kind, "key", ev.Key, "type", ev.Type, "error", err)
			}
			if synced {
				s.cursor = ev.Cursor
			}
		default:
			s.o.Logger.Warn("unknown watch event type; ignored", "type", ev.Type)
		}
	}
}
