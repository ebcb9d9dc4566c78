package conformance

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// streamRules checks one Watch stream event by event against the
// watcher's contract (services/watcher/doc.go):
//
//   - a stream opened without a cursor, or one the watcher cannot resume,
//     starts with RESET; RESET is followed by ADDED events, one per object
//     (no key twice), and SYNCED, all carrying the RESET's cursor; RESET
//     may come again at any point (a subscriber that fell behind) and
//     starts a new list;
//   - outside a list there are only ADDED, UPDATED and DELETED events, of
//     the epoch of the last RESET (or of the cursor resumed), with
//     sequences strictly increasing and above the list's cursor (or the
//     resumed cursor);
//   - every object event has a kind the request asked for, a key
//     ("namespace/name" for claims, "name" otherwise), the object in the
//     requested encoding with that key, and its resourceVersion;
//   - PROGRESS comes only to a stream that asked for progress marks, never
//     inside a list, with no kind, key or object, in the stream's epoch,
//     never behind the last sequence seen; the next event is after it.
type streamRules struct {
	kinds    map[watcherv1.Kind]bool
	encoding watcherv1.Encoding
	marks    bool // the request asked for progress marks

	started bool
	epoch   string
	seq     uint64 // the last sequence seen (or resumed from)
	inList  bool
	list    *watcherv1.Cursor
	listed  map[string]bool
}

// newStreamRules checks a stream of req.
func newStreamRules(req *watcherv1.WatchRequest) *streamRules {
	r := &streamRules{kinds: map[watcherv1.Kind]bool{}, encoding: req.GetEncoding(), marks: req.GetProgressMarks()}
	for _, k := range req.GetKinds() {
		r.kinds[k] = true
	}
	if len(r.kinds) == 0 {
		for _, k := range []watcherv1.Kind{watcherv1.Kind_KIND_PERSISTENT_VOLUME, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, watcherv1.Kind_KIND_STORAGE_CLASS} {
			r.kinds[k] = true
		}
	}
	if c := req.GetResumeAfter(); c != nil {
		r.epoch, r.seq = c.GetEpoch(), c.GetSequence()
	}
	return r
}

// observe checks the next event; it returns what is wrong with it.
func (r *streamRules) observe(ev *watcherv1.WatchResponse) error {
	first := !r.started
	r.started = true
	c := ev.GetCursor()
	if c.GetEpoch() == "" {
		return fmt.Errorf("%s event without a cursor epoch", ev.GetType())
	}
	switch ev.GetType() {
	case watcherv1.EventType_EVENT_TYPE_RESET:
		if ev.GetKind() != watcherv1.Kind_KIND_UNSPECIFIED || ev.GetKey() != "" || len(ev.GetObject()) > 0 {
			return fmt.Errorf("RESET carries a kind, key or object: %v", ev)
		}
		if c.GetEpoch() == r.epoch && c.GetSequence() < r.seq {
			return fmt.Errorf("RESET at sequence %d, behind the %d already seen in epoch %s", c.GetSequence(), r.seq, r.epoch)
		}
		r.inList, r.list, r.listed = true, c, map[string]bool{}
		r.epoch, r.seq = c.GetEpoch(), c.GetSequence()
		return nil
	case watcherv1.EventType_EVENT_TYPE_SYNCED:
		if !r.inList {
			return fmt.Errorf("SYNCED outside a list (no RESET before it)")
		}
		if !sameCursor(c, r.list) {
			return fmt.Errorf("SYNCED cursor %v, not the RESET's %v", c, r.list)
		}
		if ev.GetKind() != watcherv1.Kind_KIND_UNSPECIFIED || ev.GetKey() != "" {
			return fmt.Errorf("SYNCED carries a kind or key: %v", ev)
		}
		r.inList = false
		return nil
	case watcherv1.EventType_EVENT_TYPE_PROGRESS:
		switch {
		case !r.marks:
			return fmt.Errorf("PROGRESS on a stream that did not ask for progress marks")
		case first && r.epoch == "":
			return fmt.Errorf("a stream opened without a cursor starts with PROGRESS, not RESET")
		case r.inList:
			return fmt.Errorf("PROGRESS inside a list (only ADDED until SYNCED)")
		case ev.GetKind() != watcherv1.Kind_KIND_UNSPECIFIED || ev.GetKey() != "" || len(ev.GetObject()) > 0:
			return fmt.Errorf("PROGRESS carries a kind, key or object: %v", ev)
		case c.GetEpoch() != r.epoch:
			return fmt.Errorf("PROGRESS in epoch %s, the stream's is %s", c.GetEpoch(), r.epoch)
		case c.GetSequence() < r.seq:
			return fmt.Errorf("PROGRESS at sequence %d, behind the %d already seen", c.GetSequence(), r.seq)
		}
		r.seq = c.GetSequence()
		return nil
	case watcherv1.EventType_EVENT_TYPE_ADDED, watcherv1.EventType_EVENT_TYPE_UPDATED, watcherv1.EventType_EVENT_TYPE_DELETED:
	default:
		return fmt.Errorf("event of type %v", ev.GetType())
	}
	if first && r.epoch == "" {
		return fmt.Errorf("a stream opened without a cursor starts with %s, not RESET", ev.GetType())
	}
	if err := r.checkObject(ev); err != nil {
		return err
	}
	if r.inList {
		if ev.GetType() != watcherv1.EventType_EVENT_TYPE_ADDED {
			return fmt.Errorf("%s of %s inside the list (only ADDED until SYNCED)", ev.GetType(), ev.GetKey())
		}
		if !sameCursor(c, r.list) {
			return fmt.Errorf("listed ADDED of %s has cursor %v, not the RESET's %v", ev.GetKey(), c, r.list)
		}
		k := ev.GetKind().String() + " " + ev.GetKey()
		if r.listed[k] {
			return fmt.Errorf("the list holds %s twice", k)
		}
		r.listed[k] = true
		return nil
	}
	if c.GetEpoch() != r.epoch {
		return fmt.Errorf("%s of %s in epoch %s, the stream's is %s (a new epoch comes only after RESET)", ev.GetType(), ev.GetKey(), c.GetEpoch(), r.epoch)
	}
	if c.GetSequence() <= r.seq {
		return fmt.Errorf("%s of %s at sequence %d, not after %d", ev.GetType(), ev.GetKey(), c.GetSequence(), r.seq)
	}
	r.seq = c.GetSequence()
	return nil
}

func sameCursor(a, b *watcherv1.Cursor) bool {
	return a.GetEpoch() == b.GetEpoch() && a.GetSequence() == b.GetSequence()
}

// checkObject checks an object event's kind, key, object and
// resourceVersion.
func (r *streamRules) checkObject(ev *watcherv1.WatchResponse) error {
	if !r.kinds[ev.GetKind()] {
		return fmt.Errorf("%s of %s of kind %v, which the request did not ask for", ev.GetType(), ev.GetKey(), ev.GetKind())
	}
	if ev.GetKey() == "" || len(ev.GetObject()) == 0 || ev.GetResourceVersion() == "" {
		return fmt.Errorf("%s event without key, object or resource_version: %v", ev.GetType(), ev)
	}
	meta, err := decodeMeta(ev.GetKind(), r.encoding, ev.GetObject())
	if err != nil {
		return fmt.Errorf("%s of %s: %w", ev.GetType(), ev.GetKey(), err)
	}
	key := meta.Name
	if ev.GetKind() == watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM {
		key = meta.Namespace + "/" + meta.Name
	}
	if key != ev.GetKey() {
		return fmt.Errorf("%s event key %q, but its object is %q", ev.GetType(), ev.GetKey(), key)
	}
	if meta.ResourceVersion != ev.GetResourceVersion() {
		return fmt.Errorf("%s of %s: resource_version %q, the object's %q", ev.GetType(), key, ev.GetResourceVersion(), meta.ResourceVersion)
	}
	return nil
}

// decodeMeta decodes an event's object and returns its metadata.
func decodeMeta(kind watcherv1.Kind, enc watcherv1.Encoding, b []byte) (*metav1.ObjectMeta, error) {
	if enc == watcherv1.Encoding_ENCODING_JSON {
		var o struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return nil, fmt.Errorf("object is not JSON: %w", err)
		}
		want := map[watcherv1.Kind][2]string{
			watcherv1.Kind_KIND_PERSISTENT_VOLUME:       {"v1", "PersistentVolume"},
			watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM: {"v1", "PersistentVolumeClaim"},
			watcherv1.Kind_KIND_STORAGE_CLASS:           {"storage.k8s.io/v1", "StorageClass"},
		}[kind]
		if o.APIVersion != want[0] || o.Kind != want[1] {
			return nil, fmt.Errorf("JSON object of apiVersion %q kind %q, want %q %q", o.APIVersion, o.Kind, want[0], want[1])
		}
		return &o.Metadata, nil
	}
	switch kind {
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME:
		o := &corev1.PersistentVolume{}
		if err := o.Unmarshal(b); err != nil {
			return nil, fmt.Errorf("object is not a PersistentVolume in Kubernetes protobuf: %w", err)
		}
		return &o.ObjectMeta, nil
	case watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM:
		o := &corev1.PersistentVolumeClaim{}
		if err := o.Unmarshal(b); err != nil {
			return nil, fmt.Errorf("object is not a PersistentVolumeClaim in Kubernetes protobuf: %w", err)
		}
		return &o.ObjectMeta, nil
	case watcherv1.Kind_KIND_STORAGE_CLASS:
		o := &storagev1.StorageClass{}
		if err := o.Unmarshal(b); err != nil {
			return nil, fmt.Errorf("object is not a StorageClass in Kubernetes protobuf: %w", err)
		}
		return &o.ObjectMeta, nil
	}
	return nil, fmt.Errorf("kind %v", kind)
}
