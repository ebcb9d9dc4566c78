package watchclient

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// DefaultStaleAfter is how long a subscriber's view may go without a live,
// caught-up stream before it counts as stale (Feed.Stale); it is also the
// stream's stall timeout. At least MinStaleAfter.
const DefaultStaleAfter = 5 * time.Second

// EventType is what happened to an object.
type EventType int

// The event types.
const (
	Added EventType = iota + 1
	Updated
	Deleted
)

func (t EventType) String() string {
	switch t {
	case Added:
		return "added"
	case Updated:
		return "updated"
	case Deleted:
		return "deleted"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is one change of one object, as a Feed delivers it.
type Event struct {
	Type EventType
	Kind watcherv1.Kind
	// Key is "namespace/name", or the name of a cluster-scoped object.
	Key string
	// Object is the object, decoded and slim (kube.Slim):
	// *corev1.PersistentVolume, *corev1.PersistentVolumeClaim,
	// *storagev1.StorageClass or *watcherv1.Pod. For Deleted it is the
	// tombstone: the object's last state as the watcher saw it, whose UID
	// says which object is gone (a newer one may hold the key already).
	// Nil when Vanished.
	Object any
	// ResourceVersion is the object's, as the watcher sent it.
	ResourceVersion string
	// Observed is when the watcher's informer delivered the change (the
	// watcher's clock, WatchResponse.observed_unix_nano); zero from a
	// watcher that predates the field, and when Vanished.
	Observed time.Time
	// Vanished marks a Deleted that a full list implies: the subscriber
	// held Key and the list no longer mentions it. The object was deleted
	// while the stream was down (or the replica streaming now has not seen
	// it yet); its last state and UID are unknown, so the subscriber drops
	// whatever it holds under Key and confirms no UID as gone.
	Vanished bool
}

// UID is the UID of the event's object; empty when Vanished.
func (e Event) UID() types.UID {
	switch o := e.Object.(type) {
	case metav1.Object:
		return o.GetUID()
	case *watcherv1.Pod:
		return types.UID(o.GetUid())
	}
	return ""
}

// Subscriber is the view a Feed keeps up to date. Calls never overlap.
type Subscriber interface {
	// Apply applies one event. An error is logged and the stream goes on
	// (a broken object must not stop the rest).
	Apply(Event) error
	// Keys lists the keys of kind the view holds, so that a full list
	// deletes those it does not mention.
	Keys(kind watcherv1.Kind) []string
}

// Relister is a Subscriber that is told when a full list has been applied.
type Relister interface {
	// Relisted is called at every SYNCED, after the deletions the list
	// implies. listed tells what the list mentioned; it is nil for a
	// SYNCED that no RESET announced (a watcher sends none).
	Relisted(listed Listed)
}

// Listed is what a full list mentioned: kind → key → true.
type Listed map[watcherv1.Kind]map[string]bool

// Feed turns the watcher stream into a Subscriber's events, and tells how
// current the subscriber's view is. It is the stream's one interpreter:
//
//   - every object is decoded and slim (kube.Slim) before the subscriber sees
//     it, ADDED and UPDATED as Added and Updated, DELETED as a Deleted
//     carrying the tombstone (the deleted object's last state);
//   - a full list (RESET, ADDED…, SYNCED) is applied as a replace: nothing
//     is dropped while it comes in, then every key the subscriber holds
//     (Subscriber.Keys) that the list did not mention gets a Vanished
//     Deleted, before Relister.Relisted;
//   - HasSynced, Relisting and Stale say whether the view may be trusted.
//
// A Feed is a Handler: run it with Dial or Run, or call Reset, Event and
// Synced yourself (tests).
type Feed struct {
	sub   Subscriber
	kinds []watcherv1.Kind

	status    Status
	synced    atomic.Bool // a full list has been applied
	relisting atomic.Bool // between a RESET and its SYNCED

	// listed is what the list under way mentioned; only the handler
	// (whose calls never overlap) touches it.
	listed Listed
}

var _ Handler = (*Feed)(nil)

// NewFeed returns a feed of sub for the kinds. The order of kinds is the
// order in which the deletions a full list implies are applied.
func NewFeed(sub Subscriber, kinds ...watcherv1.Kind) *Feed {
	return &Feed{sub: sub, kinds: kinds}
}

// Dial dials every watcher address and feeds the subscriber from one of
// them at a time (DialFailover) until ctx ends, which is not an error. The
// Feed sets o's Kinds, Encoding and Status.
func (f *Feed) Dial(ctx context.Context, addrs []string, tls grpcutil.TLSFiles, o Options) error {
	return DialFailover(ctx, addrs, tls, f.options(o), f)
}

// Run feeds the subscriber from one of the watchers at a time
// (RunFailover) until ctx ends; it then returns ctx's error. The Feed sets
// o's Kinds, Encoding and Status.
func (f *Feed) Run(ctx context.Context, watchers []Watcher, o Options) error {
	return RunFailover(ctx, watchers, f.options(o), f)
}

func (f *Feed) options(o Options) Options {
	o.Kinds = f.kinds
	o.Encoding = watcherv1.Encoding_ENCODING_PROTOBUF // what decode reads
	o.Status = &f.status
	return o
}

// Status is the stream's freshness (which watcher streams, FreshAt).
func (f *Feed) Status() *Status { return &f.status }

// HasSynced reports whether a full list has been applied.
func (f *Feed) HasSynced() bool { return f.synced.Load() }

// Relisting reports whether a full list is coming in: until its SYNCED
// the view still holds objects that the list will delete.
func (f *Feed) Relisting() bool { return f.relisting.Load() }

// Complete reports whether the view holds exactly what the watcher lists:
// a full list has been applied and no relist is under way.
func (f *Feed) Complete() bool { return f.HasSynced() && !f.Relisting() }

// Stale reports whether the view may be older than maxAge: no full list
// has been applied yet, or the stream was not caught up with a SERVING
// watcher within maxAge (Status.Stale). During a relist the view is not
// stale by itself: every object in it is at least as new as FreshAt, but
// objects deleted while the stream was down are still in it (Complete).
func (f *Feed) Stale(maxAge time.Duration) bool {
	return !f.HasSynced() || f.status.Stale(maxAge)
}

// StaleReason says why Stale(maxAge) holds; nil when it does not.
func (f *Feed) StaleReason(maxAge time.Duration) error {
	switch {
	case !f.Stale(maxAge):
		return nil
	case !f.HasSynced():
		if w := f.status.Watcher(); w != "" {
			return fmt.Errorf("the first full list from watcher %s is not in yet", w)
		}
		return errors.New("no watcher stream yet")
	}
	fresh := f.status.FreshAt()
	if fresh.IsZero() {
		return fmt.Errorf("not caught up with a serving watcher yet (watcher %q)", f.status.Watcher())
	}
	return fmt.Errorf("not caught up with a serving watcher since %s, over %s (watcher %q)", fresh.UTC().Format(time.RFC3339), maxAge, f.status.Watcher())
}

// Reset implements Handler: a full list follows. Nothing is dropped until
// its SYNCED, so the view is never empty meanwhile.
func (f *Feed) Reset() {
	f.relisting.Store(true)
	f.listed = make(Listed, len(f.kinds))
	for _, k := range f.kinds {
		f.listed[k] = map[string]bool{}
	}
}

// Event implements Handler: it decodes the object and applies the event.
// Kinds the feed was not made for are ignored.
func (f *Feed) Event(ev *watcherv1.WatchResponse) error {
	if f.listed != nil && ev.GetType() == watcherv1.EventType_EVENT_TYPE_ADDED {
		if m := f.listed[ev.GetKind()]; m != nil {
			m[ev.GetKey()] = true
		}
	}
	var typ EventType
	switch ev.GetType() {
	case watcherv1.EventType_EVENT_TYPE_ADDED:
		typ = Added
	case watcherv1.EventType_EVENT_TYPE_UPDATED:
		typ = Updated
	case watcherv1.EventType_EVENT_TYPE_DELETED:
		typ = Deleted
	default:
		return nil
	}
	if !f.serves(ev.GetKind()) {
		return nil
	}
	obj, err := decode(ev.GetKind(), ev.GetKey(), ev.GetObject())
	if err != nil {
		return err
	}
	out := Event{Type: typ, Kind: ev.GetKind(), Key: ev.GetKey(), Object: obj, ResourceVersion: ev.GetResourceVersion()}
	if ns := ev.GetObservedUnixNano(); ns > 0 {
		out.Observed = time.Unix(0, ns)
	}
	return f.sub.Apply(out)
}

// Synced implements Handler: a full list is complete. Every key the
// subscriber holds that the list did not mention was deleted while the
// stream was down: it gets a Vanished Deleted.
func (f *Feed) Synced() {
	listed := f.listed
	if listed != nil {
		for _, kind := range f.kinds {
			for _, k := range f.sub.Keys(kind) {
				if listed[kind][k] {
					continue
				}
				// Errors of a drop are the subscriber's to log; the rest
				// of the list is applied all the same.
				_ = f.sub.Apply(Event{Type: Deleted, Kind: kind, Key: k, Vanished: true})
			}
		}
		f.listed = nil
	}
	if r, ok := f.sub.(Relister); ok {
		r.Relisted(listed)
	}
	f.synced.Store(true)
	f.relisting.Store(false)
}

func (f *Feed) serves(kind watcherv1.Kind) bool {
	for _, k := range f.kinds {
		if k == kind {
			return true
		}
	}
	return false
}

// decode turns an event's object into its slim typed form.
func decode(kind watcherv1.Kind, key string, b []byte) (any, error) {
	switch kind {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME:
		v, err := kube.DecodeVolume(b)
		if err != nil {
			return nil, err
		}
		return kube.Slim(v), nil
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		c, err := kube.DecodeClaim(b)
		if err != nil {
			return nil, err
		}
		return kube.Slim(c), nil
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		sc, err := kube.DecodeStorageClass(b)
		if err != nil {
			return nil, err
		}
		return kube.Slim(sc), nil
	case watcherv1.Kind_KIND_POD:
		p := &watcherv1.Pod{}
		if err := proto.Unmarshal(b, p); err != nil {
			return nil, fmt.Errorf("decode pod %s: %w", key, err)
		}
		return p, nil
	}
	return nil, fmt.Errorf("decode %s %s: not a kind the feed decodes", kind, key)
}
