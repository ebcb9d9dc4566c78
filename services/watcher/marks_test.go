package watcher

import (
	"testing"
	"time"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

const typeProgress = watcherv1.EventType_EVENT_TYPE_PROGRESS

// expectMark reads progress marks until one reaches seq; each must be a
// bare mark of the watcher's epoch, never behind the one before.
func expectMark(t *testing.T, h *hub, s *subscriber, seq uint64) {
	t.Helper()
	var last uint64
	for {
		ev := s.recv()
		if ev.GetType() != typeProgress || ev.GetKind() != watcherv1.Kind_KIND_UNSPECIFIED || ev.GetKey() != "" || len(ev.GetObject()) > 0 || ev.GetCursor().GetEpoch() != h.epoch {
			t.Fatalf("got %v, want a progress mark up to %d", ev, seq)
		}
		got := ev.GetCursor().GetSequence()
		if got < last || got > seq {
			t.Fatalf("progress mark at %d after %d, want marks up to %d", got, last, seq)
		}
		if got == seq {
			return
		}
		last = got
	}
}

// A subscriber of claims that asked for progress marks learns, within the
// mark delay, that it has everything up to the watcher's newest event while
// only volumes change; it resumes from a mark; one that did not ask gets
// no mark.
func TestProgressMarksAfterSkippedEvents(t *testing.T) {
	h, s, _ := newTestServer(10_000, true)
	s.marks = markTiming{afterSkip: 10 * time.Millisecond, idle: time.Hour}
	h.append(typeAdded, kindPVC, "ns/c", claim("ns", "c", "1"), "1")
	marked := watch(t, s, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindPVC}, ProgressMarks: true})
	plain := watch(t, s, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindPVC}})
	expectList(t, h, marked, 1)
	expectList(t, h, plain, 1)

	addPVs(h, "pv", 3000)
	expectMark(t, h, marked, 3001)
	h.append(typeUpdated, kindPVC, "ns/c", claim("ns", "c", "2"), "2")
	expectEvent(t, h, marked.recv(), typeUpdated, "ns/c", 3002)
	// The other subscriber was sent nothing in between.
	expectEvent(t, h, plain.recv(), typeUpdated, "ns/c", 3002)

	// More volume churn, then a resume from the last mark: only what
	// came after it, no list.
	addPVs(h, "more", 100)
	expectMark(t, h, marked, 3102)
	marked.cancel()
	resumed := watch(t, s, &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{kindPVC}, ProgressMarks: true, ResumeAfter: &watcherv1.Cursor{Epoch: h.epoch, Sequence: 3102}})
	h.append(typeDeleted, kindPVC, "ns/c", claim("ns", "c", "3"), "3")
	ev := resumed.recv()
	if ev.GetType() == typeProgress {
		// A resumed stream that has nothing to send may mark first.
		if ev.GetCursor().GetSequence() > 3103 {
			t.Fatalf("mark %v ahead of the watcher", ev)
		}
		ev = resumed.recv()
	}
	expectEvent(t, h, ev, typeDeleted, "ns/c", 3103)
}

// A subscriber with progress marks that is caught up hears from the stream
// about every idle period even when nothing at all happens.
func TestProgressMarksWhileIdle(t *testing.T) {
	h, s, _ := newTestServer(100, true)
	s.marks = markTiming{afterSkip: time.Hour, idle: 20 * time.Millisecond}
	addPVs(h, "pv", 3)
	sub := watch(t, s, &watcherv1.WatchRequest{ProgressMarks: true})
	expectList(t, h, sub, 3)
	for range 3 {
		expectMark(t, h, sub, 3)
	}
	h.append(typeAdded, kindPV, "new", volume("new", "1"), "1")
	// Marks may come between, none past the newest event.
	for {
		ev := sub.recv()
		if ev.GetType() == typeProgress {
			if ev.GetCursor().GetSequence() > 4 {
				t.Fatalf("mark %v ahead of the watcher", ev)
			}
			continue
		}
		expectEvent(t, h, ev, typeAdded, "new", 4)
		break
	}
	expectMark(t, h, sub, 4)
}
