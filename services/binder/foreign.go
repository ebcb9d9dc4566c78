package binder

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/kube"
)

// DefaultForeignBinderManagers are the field managers of other binders:
// kube-controller-manager's persistentvolume-binder-controller writes as
// "kube-controller-manager" (the API server names an Update's manager
// after its client's user agent).
var DefaultForeignBinderManagers = []string{"kube-controller-manager"}

// ReasonForeignBinder is the Warning Event on a claim or volume that
// another binder bound or changed.
const ReasonForeignBinder = "ForeignBinder"

// Rate limits of the foreign-binder warnings.
const (
	// foreignReadEvery spaces the API reads of changed objects: at most 10
	// a second, whatever happens.
	foreignReadEvery = 100 * time.Millisecond
	// foreignEventEvery is how often one object gets the Event again.
	foreignEventEvery = 10 * time.Minute
	// foreignLogEvery is how often the warning is logged per manager.
	foreignLogEvery = time.Minute
	// foreignBacklog is how many changes wait for their read; more are
	// dropped (the next change says it again).
	foreignBacklog = 256
	// foreignRemembered bounds the objects remembered for the Event limit.
	foreignRemembered = 10000
	// foreignSettle is how long a change waits before it is checked: the
	// watch event of this replica's own write may come before the
	// write's answer, which then says it was this replica's (known).
	foreignSettle = time.Second
)

var foreignBindsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "volplane_binder_foreign_binds_total",
	Help: "Binding writes another binder made to claims and volumes this replica owns (a claim's volumeName, bind annotations or phase; a volume's claimRef, annotation or phase), by that binder's field manager and the object's kind. Anything but 0: turn the other binder off.",
}, []string{"manager", "kind"})

// field is a binding field, as its path in managedFields (FieldsV1).
type field struct {
	name string   // as a user reads it: "spec.volumeName"
	path []string // "f:spec", "f:volumeName"
}

var (
	fieldVolumeName     = field{"spec.volumeName", []string{"f:spec", "f:volumeName"}}
	fieldClaimRef       = field{"spec.claimRef", []string{"f:spec", "f:claimRef"}}
	fieldPhase          = field{"status.phase", []string{"f:status", "f:phase"}}
	fieldBindCompleted  = field{kube.AnnBindCompleted, []string{"f:metadata", "f:annotations", "f:" + kube.AnnBindCompleted}}
	fieldBoundByControl = field{kube.AnnBoundByController, []string{"f:metadata", "f:annotations", "f:" + kube.AnnBoundByController}}
)

// claimBindingChanges are the binding fields whose value differs between
// two versions of a claim.
func claimBindingChanges(old, cur *corev1.PersistentVolumeClaim) []field {
	var out []field
	if old.Spec.VolumeName != cur.Spec.VolumeName {
		out = append(out, fieldVolumeName)
	}
	if annChanged(old.Annotations, cur.Annotations, kube.AnnBindCompleted) {
		out = append(out, fieldBindCompleted)
	}
	if annChanged(old.Annotations, cur.Annotations, kube.AnnBoundByController) {
		out = append(out, fieldBoundByControl)
	}
	if old.Status.Phase != cur.Status.Phase {
		out = append(out, fieldPhase)
	}
	return out
}

// volumeBindingChanges are the binding fields whose value differs between
// two versions of a volume.
func volumeBindingChanges(old, cur *corev1.PersistentVolume) []field {
	var out []field
	a, b := old.Spec.ClaimRef, cur.Spec.ClaimRef
	if (a == nil) != (b == nil) || a != nil && (a.Namespace != b.Namespace || a.Name != b.Name || a.UID != b.UID) {
		out = append(out, fieldClaimRef)
	}
	if annChanged(old.Annotations, cur.Annotations, kube.AnnBoundByController) {
		out = append(out, fieldBoundByControl)
	}
	if old.Status.Phase != cur.Status.Phase {
		out = append(out, fieldPhase)
	}
	return out
}

func annChanged(a, b map[string]string, key string) bool {
	x, okx := a[key]
	y, oky := b[key]
	return okx != oky || x != y
}

// owners are the field managers that own f in managedFields: for an
// Update, the last writer that changed its value.
func owners(mf []metav1.ManagedFieldsEntry, f field) []string {
	var out []string
	for _, e := range mf {
		if e.FieldsV1 == nil {
			continue
		}
		var fields map[string]any
		if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err != nil {
			continue
		}
		node, ok := any(fields), true
		for _, p := range f.path {
			m, isMap := node.(map[string]any)
			if !isMap {
				ok = false
				break
			}
			if node, ok = m[p]; !ok {
				break
			}
		}
		if ok {
			out = append(out, e.Manager)
		}
	}
	return out
}

// foreignChange is a change of binding fields, seen on the stream, that
// this replica did not make itself as far as its cache knows.
type foreignChange struct {
	kind            string // "claim" or "volume"
	namespace, name string
	uid             types.UID
	rv              string // the changed version's resourceVersion
	fields          []field
	seen            time.Time // when observe queued it
}

// foreignBinders notices another binder (kube-controller-manager's, left
// on) binding the claims and volumes this replica owns, and says so
// instead of fighting it silently: a Warning Event ForeignBinder on the
// object, volplane_binder_foreign_binds_total, and a warning in the log.
//
// The watcher's stream carries no managedFields (most of an object's
// bytes), so a binding field that changed without this replica's own
// write having been cached first is read back from the API server, whose
// managedFields name the manager that last changed it. Those reads are
// spaced (at most 10 a second, a bounded backlog), the Event comes at most
// once per object per 10 minutes, the log line once a minute per manager.
type foreignBinders struct {
	managers []string
	client   kubernetes.Interface
	recorder record.EventRecorder
	log      *slog.Logger
	changes  chan foreignChange
	every    time.Duration
	now      func() time.Time
	// known reports whether an API response gave this replica that
	// version of the object (its own write's answer, or a read of it):
	// such a change is not read back. nil: every change is.
	known  func(types.UID, string) bool
	settle time.Duration // see foreignSettle

	mu         sync.Mutex
	evented    map[types.UID]time.Time
	logged     map[string]time.Time
	suppressed map[string]int
}

func newForeignBinders(managers []string, client kubernetes.Interface, recorder record.EventRecorder, log *slog.Logger) *foreignBinders {
	return &foreignBinders{
		managers: managers, client: client, recorder: recorder, log: log,
		changes: make(chan foreignChange, foreignBacklog), every: foreignReadEvery, now: time.Now, settle: foreignSettle,
		evented: map[types.UID]time.Time{}, logged: map[string]time.Time{}, suppressed: map[string]int{},
	}
}

// observe queues a change for a read; it never blocks.
func (f *foreignBinders) observe(ch foreignChange) {
	if f == nil || len(ch.fields) == 0 {
		return
	}
	ch.seen = f.now()
	select {
	case f.changes <- ch:
	default:
	}
}

// run reads the queued changes back, one per interval, until ctx ends.
func (f *foreignBinders) run(ctx context.Context) {
	t := time.NewTicker(f.every)
	defer t.Stop()
	for {
		select {
		case ch := <-f.changes:
			if !f.wait(ctx, ch) {
				return
			}
			f.check(ctx, ch)
		case <-ctx.Done():
			return
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// wait lets a change settle (foreignSettle) before its check, so that
// the answer of this replica's own write is known by then; false when ctx
// ended.
func (f *foreignBinders) wait(ctx context.Context, ch foreignChange) bool {
	d := ch.seen.Add(f.settle).Sub(f.now())
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// check reads the object and reports each changed field a foreign binder
// owns. A change to a version an API response gave this replica (known)
// is this replica's own and is not read: under load the watch event of a
// write comes before its answer (issue 40: 0.1-0.27 reads of volumes per
// claim).
func (f *foreignBinders) check(ctx context.Context, ch foreignChange) {
	if f.known != nil && ch.rv != "" && f.known(ch.uid, ch.rv) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var (
		obj runtime.Object
		mf  []metav1.ManagedFieldsEntry
		uid types.UID
		err error
	)
	switch ch.kind {
	case "claim":
		var c *corev1.PersistentVolumeClaim
		if c, err = f.client.CoreV1().PersistentVolumeClaims(ch.namespace).Get(ctx, ch.name, metav1.GetOptions{}); err == nil {
			obj, mf, uid = c, c.ManagedFields, c.UID
		}
	default:
		var v *corev1.PersistentVolume
		if v, err = f.client.CoreV1().PersistentVolumes().Get(ctx, ch.name, metav1.GetOptions{}); err == nil {
			obj, mf, uid = v, v.ManagedFields, v.UID
		}
	}
	if err != nil {
		if !apierrors.IsNotFound(err) {
			f.log.Debug("cannot read a changed object back to see who changed it", "kind", ch.kind, "namespace", ch.namespace, "name", ch.name, "error", err)
		}
		return
	}
	if uid != ch.uid {
		return // another object of the same name by now
	}
	byManager := map[string][]string{}
	for _, fl := range ch.fields {
		for _, m := range owners(mf, fl) {
			if slices.Contains(f.managers, m) {
				byManager[m] = append(byManager[m], fl.name)
			}
		}
	}
	for m, fields := range byManager {
		f.report(obj, ch, m, fields)
	}
}

// report says that manager changed fields of obj: the metric always, the
// Event and the log line within their limits.
func (f *foreignBinders) report(obj runtime.Object, ch foreignChange, manager string, fields []string) {
	foreignBindsTotal.WithLabelValues(manager, ch.kind).Inc()
	now := f.now()
	f.mu.Lock()
	event := now.Sub(f.evented[ch.uid]) >= foreignEventEvery
	if event {
		if len(f.evented) >= foreignRemembered {
			for uid, at := range f.evented {
				if now.Sub(at) >= foreignEventEvery {
					delete(f.evented, uid)
				}
			}
		}
		if len(f.evented) < foreignRemembered {
			f.evented[ch.uid] = now
		}
	}
	logIt := now.Sub(f.logged[manager]) >= foreignLogEvery
	suppressed := f.suppressed[manager]
	if logIt {
		f.logged[manager], f.suppressed[manager] = now, 0
	} else {
		f.suppressed[manager]++
	}
	f.mu.Unlock()
	what := ch.kind + " " + ch.name
	if ch.namespace != "" {
		what = ch.kind + " " + ch.namespace + "/" + ch.name
	}
	msg := fmt.Sprintf("%s also binds volumes: it set %s of this %s. Turn its binder off (kube-controller-manager --controllers=*,-persistentvolume-binder-controller): two binders undo each other's work",
		manager, strings.Join(fields, ", "), ch.kind)
	if event {
		f.recorder.Event(obj, corev1.EventTypeWarning, ReasonForeignBinder, msg)
	}
	if logIt {
		f.log.Warn("another binder is active on the claims and volumes volplane binds: turn it off (kube-controller-manager --controllers=*,-persistentvolume-binder-controller)",
			"manager", manager, "object", what, "fields", fields, "more_since_last_warning", suppressed)
	}
}
