package watcher

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// event is one change in the watcher's log. It keeps the object only in
// Kubernetes protobuf (encoded once, when the event is appended: every
// subscriber, and the binder is always one, needs it): a decoded object
// takes several times the memory, and the log holds up to HistorySize
// events. JSON is made from the protobuf at most once, on demand.
type event struct {
	seq uint64
	// observed is when the informer delivered the change (Unix
	// nanoseconds): WatchResponse.observed_unix_nano.
	observed int64
	typ      watcherv1.EventType
	kind     watcherv1.Kind
	key      string
	rv       string
	pb       []byte
	// obj is kept only when it could not be encoded (the error is
	// reported to subscribers of every encoding).
	obj   kube.Object
	pbErr error

	jsonOnce sync.Once
	json     []byte
	jsonErr  error
}

func newEvent(typ watcherv1.EventType, kind watcherv1.Kind, key string, obj kube.Object, rv string) *event {
	// One clock read per event, in the struct the event needs anyway:
	// no allocation of its own.
	e := &event{typ: typ, kind: kind, key: key, rv: rv, observed: time.Now().UnixNano()}
	if e.pb, e.pbErr = kube.EncodeProto(obj); e.pbErr != nil {
		e.obj = obj
	}
	return e
}

// encode returns the object in the requested encoding.
func (e *event) encode(enc watcherv1.Encoding) ([]byte, error) {
	if enc != watcherv1.Encoding_ENCODING_JSON {
		return e.pb, e.pbErr
	}
	e.jsonOnce.Do(func() {
		if e.pbErr != nil {
			e.jsonErr = e.pbErr
			return
		}
		if e.kind == watcherv1.Kind_KIND_POD {
			e.json, e.jsonErr = podJSON(e.pb)
			return
		}
		var obj kube.Object
		if obj, e.jsonErr = decode(e.kind, e.pb); e.jsonErr == nil {
			e.json, e.jsonErr = kube.EncodeJSON(obj)
		}
	})
	return e.json, e.jsonErr
}

func decode(kind watcherv1.Kind, b []byte) (kube.Object, error) {
	switch kind {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME:
		return kube.DecodeVolume(b)
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		return kube.DecodeClaim(b)
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		return kube.DecodeStorageClass(b)
	}
	return nil, fmt.Errorf("no decoder for %v", kind)
}

// hub is the watcher's ordered log: every informer event gets the next
// sequence number, goes into a ring of the last events (for subscribers
// that resume) and updates the current state (for full lists). One lock
// covers all three, so a list and its sequence number always agree.
type hub struct {
	mu     sync.Mutex
	epoch  string
	head   uint64   // sequence of the newest event; 0 before the first
	ring   []*event // the newest len(ring) events at most; ring[seq%cap]
	stored int      // how many events the ring holds
	state  map[watcherv1.Kind]map[string]*event
	// notify is closed and replaced on every append: subscribers wait on
	// it instead of each holding a buffer.
	notify      chan struct{}
	synced      bool
	syncedCh    chan struct{}
	subscribers int
	// counts of appended events by kind and type, for metrics.
	appended [numKinds][4]uint64
}

func newHub(history int) *hub {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &hub{
		epoch:  hex.EncodeToString(b),
		ring:   make([]*event, history),
		notify: make(chan struct{}),
		state: map[watcherv1.Kind]map[string]*event{
			watcherv1.Kind_KIND_PERSISTENT_VOLUME:       {},
			watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM: {},
			watcherv1.Kind_KIND_STORAGE_CLASS:           {},
			watcherv1.Kind_KIND_POD:                     {},
		},
		syncedCh: make(chan struct{}),
	}
}

// append records a change. For DELETED, obj is the last known state.
func (h *hub) append(typ watcherv1.EventType, kind watcherv1.Kind, key string, obj kube.Object, rv string) {
	e := newEvent(typ, kind, key, obj, rv) // outside the lock
	h.mu.Lock()
	defer h.mu.Unlock()
	h.head++
	if int(kind) < len(h.appended) && int(typ) < len(h.appended[0]) {
		h.appended[kind][typ]++
	}
	e.seq = h.head
	h.ring[h.head%uint64(len(h.ring))] = e
	h.stored = min(h.stored+1, len(h.ring))
	if typ == watcherv1.EventType_EVENT_TYPE_DELETED {
		delete(h.state[kind], key)
	} else {
		h.state[kind][key] = e
	}
	close(h.notify)
	h.notify = make(chan struct{})
}

// markSynced records that the informers have listed everything.
func (h *hub) markSynced() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.synced {
		h.synced = true
		close(h.syncedCh)
	}
}

// oldest is the sequence of the oldest event still in the ring; head+1
// when the ring is empty. The caller holds mu.
func (h *hub) oldest() uint64 { return h.head - uint64(h.stored) + 1 }

// snapshot returns every current object of the kinds and the sequence
// it is consistent with. The caller holds mu.
func (h *hub) snapshot(kinds kindSet) ([]*event, uint64) {
	n := 0
	for k, m := range h.state {
		if kinds.has(k) {
			n += len(m)
		}
	}
	out := make([]*event, 0, n)
	// Classes first, then volumes, then claims, then pods: a subscriber
	// that acts during the list sees what claims refer to before the
	// claims, and the claims before the pods that use them.
	for _, k := range []watcherv1.Kind{watcherv1.Kind_KIND_STORAGE_CLASS, watcherv1.Kind_KIND_PERSISTENT_VOLUME, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_POD} {
		if !kinds.has(k) {
			continue
		}
		for _, e := range h.state[k] {
			out = append(out, e)
		}
	}
	return out, h.head
}

// since returns up to max events after seq, whether seq is still covered
// by the ring (false: the subscriber fell behind), and a channel closed on
// the next append. The caller holds mu.
func (h *hub) since(seq uint64, max int) (evs []*event, ok bool, wait <-chan struct{}) {
	if seq+1 < h.oldest() {
		return nil, false, nil
	}
	for s := seq + 1; s <= h.head && len(evs) < max; s++ {
		evs = append(evs, h.ring[s%uint64(len(h.ring))])
	}
	return evs, true, h.notify
}

func (h *hub) counts() (pvs, pvcs, classes, pods int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.state[watcherv1.Kind_KIND_PERSISTENT_VOLUME]), len(h.state[watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM]), len(h.state[watcherv1.Kind_KIND_STORAGE_CLASS]), len(h.state[watcherv1.Kind_KIND_POD])
}

// numKinds bounds the Kind values the watcher serves.
const numKinds = int(watcherv1.Kind_KIND_POD) + 1

// kindSet is a subscriber's filter.
type kindSet [numKinds]bool

func (s kindSet) has(k watcherv1.Kind) bool { return int(k) < len(s) && s[k] }
