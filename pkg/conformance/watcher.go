package conformance

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

func watcherChecks() []Check {
	kube := []string{"kube"}
	return []Check{
		{Name: "watch-invalid-argument", run: checkWatchInvalid,
			Doc: "Watch answers InvalidArgument for a kind it does not know, an encoding it does not know, and a resume_after cursor of its own epoch ahead of its newest event."},
		{Name: "get-status", run: checkWatcherStatus,
			Doc: "GetStatus answers an epoch, becomes synced, and holds oldest_sequence <= sequence+1; the epoch is the one its streams carry."},
		{Name: "initial-list", run: checkInitialList,
			Doc: "Watch without a cursor sends RESET, one ADDED per object (no key twice; each with its kind, key, object in Kubernetes protobuf and resourceVersion), SYNCED, all with the same cursor of the watcher's epoch; an object created before the stream opened arrives, in the list or (when the watcher had not seen it yet) as ADDED right after SYNCED (with --kubeconfig)."},
		{Name: "kinds-filter", Needs: kube, run: checkKindsFilter,
			Doc: "Watch with kinds = [KIND_STORAGE_CLASS] lists and streams StorageClasses only: volumes and claims created meanwhile send nothing, a class created after them arrives."},
		{Name: "json-encoding", Needs: kube, run: checkJSONEncoding,
			Doc: "Watch with ENCODING_JSON sends Kubernetes JSON objects (apiVersion, kind, metadata matching the key), in the list and live."},
		{Name: "live-order", Needs: kube, run: checkLiveOrder,
			Doc: "After SYNCED, every event is newer (strictly increasing sequence, same epoch), and per object the events come in the order of its changes: ADDED, then UPDATED with each change in order, then DELETED carrying the last state; nothing follows DELETED."},
		{Name: "resume", Needs: kube, run: checkResume,
			Doc: "A stream resumed with resume_after = the cursor of the last event processed (after SYNCED, or SYNCED itself) while the watcher holds the events after it gets exactly the events it missed, in order, then live events: no RESET, no SYNCED, no loss."},
		{Name: "progress-marks", Needs: kube, run: checkProgressMarks,
			Doc: "Watch with progress_marks and kinds = [KIND_STORAGE_CLASS], while only a volume and a claim change: PROGRESS marks (no kind, key or object; in the stream's epoch; sequences never going back, and no event at or below a mark's) until one reaches the sequence GetStatus reports after those changes; resumed from that mark's cursor, no RESET, and the next class change arrives. A stream that did not ask for marks never gets one (every other check)."},
		{Name: "relist-unknown-epoch", run: checkRelistEpoch,
			Doc: "A resume_after cursor of another epoch (another replica or process) gets RESET, the full list and SYNCED in the watcher's own epoch."},
		{Name: "relist-cursor-too-old", Needs: kube, run: checkRelistTooOld,
			Doc: "A resume_after cursor whose later events the watcher no longer holds gets RESET, the full list and SYNCED (the suite writes up to --watcher-history-writes updates to push the cursor out of the watcher's history; skipped if that is not enough)."},
	}
}

func (t *T) watcher() watcherv1.WatcherServiceClient {
	return watcherv1.NewWatcherServiceClient(t.s.conn)
}

// stream is an open Watch whose every event is checked by streamRules.
type stream struct {
	t      *T
	cancel context.CancelFunc
	rules  *streamRules
	events chan received
	// last is the cursor of the last event received.
	last *watcherv1.Cursor
}

type received struct {
	ev  *watcherv1.WatchResponse
	err error
}

// watch opens a stream; it ends with the check or close.
func (t *T) watch(req *watcherv1.WatchRequest) *stream {
	ctx, cancel := context.WithCancel(t.ctx)
	st, err := t.watcher().Watch(ctx, req)
	if err != nil {
		cancel()
		t.Fatalf("Watch: %s", describe(err))
	}
	s := &stream{t: t, cancel: cancel, rules: newStreamRules(req), events: make(chan received, 1024)}
	go func() {
		for {
			ev, err := st.Recv()
			select {
			case s.events <- received{ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func(context.Context) { cancel() })
	return s
}

func (s *stream) close() { s.cancel() }

// next returns the next event, checked; it fails the check when the
// stream ends or breaks the rules.
func (s *stream) next() *watcherv1.WatchResponse {
	select {
	case r := <-s.events:
		if r.err != nil {
			s.t.Fatalf("the stream ended: %s", describe(r.err))
		}
		if err := s.rules.observe(r.ev); err != nil {
			s.t.Fatalf("stream contract broken: %v", err)
		}
		s.last = r.ev.GetCursor()
		return r.ev
	case <-s.t.ctx.Done():
		s.t.Fatalf("no event within the check's time")
	}
	return nil
}

// firstError is the error the stream ends with before sending anything;
// nil if it sends an event.
func (s *stream) firstError() error {
	select {
	case r := <-s.events:
		return r.err
	case <-s.t.ctx.Done():
		s.t.Fatalf("Watch neither sent an event nor failed")
	}
	return nil
}

// list reads RESET, the list and SYNCED, and returns the listed events.
func (s *stream) list() []*watcherv1.WatchResponse {
	if ev := s.next(); ev.GetType() != watcherv1.EventType_EVENT_TYPE_RESET {
		s.t.Fatalf("the stream starts with %s, not RESET", ev.GetType())
	}
	var out []*watcherv1.WatchResponse
	for {
		ev := s.next()
		if ev.GetType() == watcherv1.EventType_EVENT_TYPE_SYNCED {
			return out
		}
		out = append(out, ev)
	}
}

// until collects the object events until done says so; RESET and SYNCED
// fail the check unless allowList.
func (s *stream) until(allowList bool, done func(ev *watcherv1.WatchResponse) bool) []*watcherv1.WatchResponse {
	var out []*watcherv1.WatchResponse
	for {
		ev := s.next()
		switch ev.GetType() {
		case watcherv1.EventType_EVENT_TYPE_RESET, watcherv1.EventType_EVENT_TYPE_SYNCED:
			if !allowList {
				s.t.Fatalf("unexpected %s (cursor %v) after %d events", ev.GetType(), ev.GetCursor(), len(out))
			}
			continue
		}
		out = append(out, ev)
		if done(ev) {
			return out
		}
	}
}

// arrives waits until an object created before the stream opened shows
// up: in the list, or, when the watcher had not seen it yet as the list
// was taken, as a live ADDED event.
func (s *stream) arrives(listed []*watcherv1.WatchResponse, kind watcherv1.Kind, key string) {
	added := is(watcherv1.EventType_EVENT_TYPE_ADDED, kind, key, "")
	for _, ev := range listed {
		if added(ev) {
			return
		}
	}
	s.t.Logf("%s was not in the list; waiting for its ADDED event", key)
	s.until(false, added)
}

// is matches an event of type typ about key (and gen, unless "").
func is(typ watcherv1.EventType, kind watcherv1.Kind, key, gen string) func(*watcherv1.WatchResponse) bool {
	return func(ev *watcherv1.WatchResponse) bool {
		if ev.GetType() != typ || ev.GetKind() != kind || ev.GetKey() != key {
			return false
		}
		return gen == "" || genOf(ev) == gen
	}
}

// genOf is the labelGen of an event's object ("" if none).
func genOf(ev *watcherv1.WatchResponse) string {
	var meta metav1.ObjectMeta
	switch ev.GetKind() {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME:
		o := &corev1.PersistentVolume{}
		if o.Unmarshal(ev.GetObject()) == nil {
			meta = o.ObjectMeta
		}
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		o := &corev1.PersistentVolumeClaim{}
		if o.Unmarshal(ev.GetObject()) == nil {
			meta = o.ObjectMeta
		}
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		o := &storagev1.StorageClass{}
		if o.Unmarshal(ev.GetObject()) == nil {
			meta = o.ObjectMeta
		}
	}
	return meta.Labels[labelGen]
}

func (t *T) status() *watcherv1.GetStatusResponse {
	st, err := t.watcher().GetStatus(t.ctx, &watcherv1.GetStatusRequest{})
	if err != nil {
		t.Fatalf("GetStatus: %s", describe(err))
	}
	return st
}

// syncedStatus waits until the watcher has synced.
func (t *T) syncedStatus() *watcherv1.GetStatusResponse {
	var st *watcherv1.GetStatusResponse
	t.Eventually("the watcher synced", func() string {
		var err error
		if st, err = t.watcher().GetStatus(t.ctx, &watcherv1.GetStatusRequest{}); err != nil {
			return t.retry("GetStatus", err)
		}
		if !st.GetSynced() {
			return "GetStatus says not synced"
		}
		return ""
	})
	return st
}

// markerClass creates a StorageClass for the watcher suite to write to.
func (t *T) markerClass() *storagev1.StorageClass {
	return t.createClass(handsOff, func(sc *storagev1.StorageClass) { sc.Labels[labelGen] = "0" })
}

// setGen writes labelGen of a class.
func (t *T) setGen(class string, gen int) {
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		sc, err := t.kube().StorageV1().StorageClasses().Get(t.ctx, class, metav1.GetOptions{})
		if err != nil {
			return err
		}
		sc.Labels[labelGen] = strconv.Itoa(gen)
		_, err = t.kube().StorageV1().StorageClasses().Update(t.ctx, sc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("update StorageClass %s: %v", class, err)
	}
}

func (t *T) deleteClass(name string) {
	if err := t.kube().StorageV1().StorageClasses().Delete(t.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete StorageClass %s: %v", name, err)
	}
}

func checkWatchInvalid(t *T) {
	st := t.syncedStatus()
	for _, tc := range []struct {
		what string
		req  *watcherv1.WatchRequest
	}{
		{"a kind it does not know", &watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind(99)}}},
		{"an encoding it does not know", &watcherv1.WatchRequest{Encoding: watcherv1.Encoding(99)}},
		{"a cursor of its epoch ahead of its newest event", &watcherv1.WatchRequest{ResumeAfter: &watcherv1.Cursor{Epoch: st.GetEpoch(), Sequence: st.GetSequence() + 1<<30}}},
	} {
		s := t.watch(tc.req)
		expectCode(t, "Watch with "+tc.what, s.firstError(), codes.InvalidArgument)
		s.close()
	}
}

func checkWatcherStatus(t *T) {
	st := t.syncedStatus()
	if st.GetEpoch() == "" {
		t.Errorf("GetStatus: no epoch")
	}
	if st.GetOldestSequence() > st.GetSequence()+1 {
		t.Errorf("GetStatus: oldest_sequence %d beyond sequence %d + 1", st.GetOldestSequence(), st.GetSequence())
	}
	s := t.watch(&watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_STORAGE_CLASS}})
	s.list()
	if s.last.GetEpoch() != st.GetEpoch() {
		t.Errorf("the stream's epoch %q is not GetStatus's %q", s.last.GetEpoch(), st.GetEpoch())
	}
	if again := t.status(); again.GetSequence() < s.last.GetSequence() {
		t.Errorf("GetStatus sequence %d behind the stream's %d", again.GetSequence(), s.last.GetSequence())
	}
}

func checkInitialList(t *T) {
	var marker string
	if t.kube() != nil {
		marker = t.markerClass().Name
	}
	st := t.syncedStatus()
	s := t.watch(&watcherv1.WatchRequest{})
	listed := s.list()
	if s.last.GetEpoch() != st.GetEpoch() {
		t.Errorf("the list's epoch %q is not GetStatus's %q", s.last.GetEpoch(), st.GetEpoch())
	}
	if marker == "" {
		t.Logf("no --kubeconfig: the list's content is not checked")
		return
	}
	s.arrives(listed, watcherv1.Kind_KIND_STORAGE_CLASS, marker)
}

func checkKindsFilter(t *T) {
	before := t.markerClass().Name
	s := t.watch(&watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_STORAGE_CLASS}})
	s.arrives(s.list(), watcherv1.Kind_KIND_STORAGE_CLASS, before)
	ns := t.namespace()
	t.createVolume(t.newVolume(t.s.name("pv"), t.s.name("class"), "1Mi"))
	t.createClaim(t.newClaim(ns, "filtered", t.s.name("class"), "1Mi"))
	after := t.markerClass().Name
	// streamRules fails the check on any event of another kind.
	s.until(false, is(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_STORAGE_CLASS, after, ""))
}

func checkJSONEncoding(t *T) {
	class := t.markerClass().Name
	s := t.watch(&watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_STORAGE_CLASS}, Encoding: watcherv1.Encoding_ENCODING_JSON})
	s.arrives(s.list(), watcherv1.Kind_KIND_STORAGE_CLASS, class)
	t.setGen(class, 1)
	s.until(false, func(ev *watcherv1.WatchResponse) bool {
		return ev.GetType() == watcherv1.EventType_EVENT_TYPE_UPDATED && ev.GetKey() == class && strings.Contains(string(ev.GetObject()), `"`+labelGen+`":"1"`)
	})
}

func checkLiveOrder(t *T) {
	ns := t.namespace()
	s := t.watch(&watcherv1.WatchRequest{})
	s.list()

	claim := t.newClaim(ns, "ordered", t.s.name("absent"), "1Mi")
	claim.Labels[labelGen] = "0"
	claim = t.createClaim(claim)
	pv := t.newVolume(t.s.name("pv"), t.s.name("class"), "1Mi")
	pv.Labels[labelGen] = "0"
	pv = t.createVolume(pv)
	setClaimGen := func(g int) {
		t.updateClaim(ns, claim.Name, func(c *corev1.PersistentVolumeClaim) { c.Labels[labelGen] = strconv.Itoa(g) })
	}
	setClaimGen(1)
	t.updateVolume(pv.Name, func(v *corev1.PersistentVolume) { v.Labels[labelGen] = "1" })
	setClaimGen(2)
	if err := t.kube().CoreV1().PersistentVolumes().Delete(t.ctx, pv.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete PersistentVolume %s: %v", pv.Name, err)
	}
	setClaimGen(3)
	t.deleteClaimWait(ns, claim.Name)

	claimKey, pvKey := ns+"/"+claim.Name, pv.Name
	deleted := map[string]bool{}
	events := s.until(false, func(ev *watcherv1.WatchResponse) bool {
		if ev.GetType() == watcherv1.EventType_EVENT_TYPE_DELETED && (ev.GetKey() == claimKey || ev.GetKey() == pvKey) {
			deleted[ev.GetKey()] = true
		}
		return len(deleted) == 2
	})
	for _, k := range []struct {
		key, last string
		kind      watcherv1.Kind
	}{{claimKey, "3", watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM}, {pvKey, "1", watcherv1.Kind_KIND_PERSISTENT_VOLUME}} {
		var seen []string
		gen := -1
		for _, ev := range events {
			if ev.GetKind() != k.kind || ev.GetKey() != k.key {
				continue
			}
			seen = append(seen, strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_")+" gen="+genOf(ev))
			g, _ := strconv.Atoi(genOf(ev))
			if g < gen {
				t.Errorf("%s: gen %d after gen %d: the changes of one object arrive out of order", k.key, g, gen)
			}
			gen = g
		}
		if len(seen) < 2 || !strings.HasPrefix(seen[0], "ADDED ") || seen[len(seen)-1] != "DELETED gen="+k.last {
			t.Errorf("events of %s: %v; want ADDED first, DELETED with the last state (gen=%s) last", k.key, seen, k.last)
		}
		for _, e := range seen[1 : len(seen)-1] {
			if !strings.HasPrefix(e, "UPDATED ") {
				t.Errorf("events of %s: %v; between ADDED and DELETED only UPDATED", k.key, seen)
				break
			}
		}
	}
}

func checkResume(t *T) {
	x := t.markerClass().Name
	s := t.watch(&watcherv1.WatchRequest{})
	s.list()
	synced := s.last
	t.setGen(x, 1)
	s.until(false, is(watcherv1.EventType_EVENT_TYPE_UPDATED, watcherv1.Kind_KIND_STORAGE_CLASS, x, "1"))
	cursor := s.last
	s.close()

	// Missed while disconnected.
	t.setGen(x, 2)
	y := t.markerClass().Name
	t.deleteClass(y)
	t.setGen(x, 3)

	resume := func(from *watcherv1.Cursor, what string, want []func(*watcherv1.WatchResponse) bool) {
		st := t.status()
		if st.GetEpoch() != from.GetEpoch() || st.GetOldestSequence() > from.GetSequence()+1 {
			t.Skipf("the watcher no longer holds the events after %v (GetStatus: epoch %s, oldest %d): resume not checked", from, st.GetEpoch(), st.GetOldestSequence())
		}
		r := t.watch(&watcherv1.WatchRequest{ResumeAfter: from})
		i := 0
		r.until(false, func(ev *watcherv1.WatchResponse) bool {
			if ev.GetCursor().GetSequence() <= from.GetSequence() {
				t.Fatalf("resumed after %d (%s), got sequence %d", from.GetSequence(), what, ev.GetCursor().GetSequence())
			}
			if want[i](ev) {
				i++
			}
			return i == len(want)
		})
		r.close()
	}
	updated := func(key, gen string) func(*watcherv1.WatchResponse) bool {
		return is(watcherv1.EventType_EVENT_TYPE_UPDATED, watcherv1.Kind_KIND_STORAGE_CLASS, key, gen)
	}
	// Every change missed, in order (other objects' events may come between).
	missed := []func(*watcherv1.WatchResponse) bool{
		updated(x, "2"),
		is(watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.Kind_KIND_STORAGE_CLASS, y, ""),
		is(watcherv1.EventType_EVENT_TYPE_DELETED, watcherv1.Kind_KIND_STORAGE_CLASS, y, ""),
		updated(x, "3"),
	}
	resume(cursor, "the last event processed", missed)
	resume(synced, "SYNCED", append([]func(*watcherv1.WatchResponse) bool{updated(x, "1")}, missed...))
}

func checkProgressMarks(t *T) {
	class := t.markerClass().Name
	kinds := []watcherv1.Kind{watcherv1.Kind_KIND_STORAGE_CLASS}
	s := t.watch(&watcherv1.WatchRequest{Kinds: kinds, ProgressMarks: true})
	s.arrives(s.list(), watcherv1.Kind_KIND_STORAGE_CLASS, class)
	listed := s.last.GetSequence()
	ns := t.namespace()
	t.createVolume(t.newVolume(t.s.name("pv"), t.s.name("class"), "1Mi"))
	t.createClaim(t.newClaim(ns, "marked", t.s.name("class"), "1Mi"))
	var head uint64
	t.Eventually("the watcher logged the volume and the claim", func() string {
		if head = t.status().GetSequence(); head < listed+2 {
			return fmt.Sprintf("GetStatus sequence %d, the list's %d", head, listed)
		}
		return ""
	})
	// streamRules fails the check on an event of another kind, or on a
	// mark that breaks the rules.
	evs := s.until(false, func(ev *watcherv1.WatchResponse) bool {
		return ev.GetType() == watcherv1.EventType_EVENT_TYPE_PROGRESS && ev.GetCursor().GetSequence() >= head
	})
	mark := evs[len(evs)-1].GetCursor()
	s.close()

	r := t.watch(&watcherv1.WatchRequest{Kinds: kinds, ProgressMarks: true, ResumeAfter: mark})
	t.setGen(class, 1)
	// until fails on RESET or SYNCED.
	r.until(false, is(watcherv1.EventType_EVENT_TYPE_UPDATED, watcherv1.Kind_KIND_STORAGE_CLASS, class, "1"))
}

func checkRelistEpoch(t *T) {
	st := t.syncedStatus()
	other := &watcherv1.Cursor{Epoch: "conformance-unknown-epoch", Sequence: 1}
	s := t.watch(&watcherv1.WatchRequest{ResumeAfter: other})
	s.list()
	if s.last.GetEpoch() != st.GetEpoch() {
		t.Errorf("the relist's epoch %q is not GetStatus's %q", s.last.GetEpoch(), st.GetEpoch())
	}
}

func checkRelistTooOld(t *T) {
	st := t.syncedStatus()
	var old *watcherv1.Cursor
	if st.GetOldestSequence() >= 2 {
		old = &watcherv1.Cursor{Epoch: st.GetEpoch(), Sequence: st.GetOldestSequence() - 2}
	} else {
		s := t.watch(&watcherv1.WatchRequest{Kinds: []watcherv1.Kind{watcherv1.Kind_KIND_STORAGE_CLASS}})
		s.list()
		old = s.last
		s.close()
		class := t.markerClass().Name
		for i := 1; ; i++ {
			if i > t.s.cfg.HistoryWrites {
				t.Skipf("the watcher still holds every event after %d writes: its history is longer than --watcher-history-writes", t.s.cfg.HistoryWrites)
			}
			t.setGen(class, i)
			if i%25 == 0 {
				if st = t.status(); st.GetOldestSequence() > old.GetSequence()+1 {
					break
				}
			}
		}
	}
	s := t.watch(&watcherv1.WatchRequest{ResumeAfter: old})
	s.list()
	if s.last.GetEpoch() != st.GetEpoch() || s.last.GetSequence() < old.GetSequence() {
		t.Errorf("the relist's cursor %v, want epoch %s and a sequence after %d", s.last, st.GetEpoch(), old.GetSequence())
	}
	t.Logf("resume after %v: relisted at %v", old, s.last)
}
