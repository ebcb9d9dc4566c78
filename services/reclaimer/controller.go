package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/reclaimjournal"
	"github.com/volplane/volplane/pkg/served"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// journalTimeout bounds one etcd call.
const journalTimeout = 10 * time.Second

// config is what the controller needs of the Options.
type config struct {
	mode       RecycleMode
	nodeName   string
	prefixes   []string // RecyclePathPrefixes
	template   *corev1.Pod
	image      string
	namespace  string
	minTimeout time.Duration
	increment  time.Duration
	ttl        time.Duration
	// standalone: Options.Standalone (standalone.go).
	standalone bool
}

// entry is one volume's reclaim as this replica knows it.
type entry struct {
	rec *reclaimerv1.Reclaim
	// held: this replica holds the reclaim's journal lock and carries it
	// out; rec is what the journal holds.
	held bool
	// expires is when an entry that is not held (RETAINED, SKIPPED,
	// SUCCEEDED, CANCELLED) is forgotten.
	expires time.Time
	// wake: sync at once, even before the backoff ends (the volume's
	// policy changed).
	wake bool
	// refused: a Reclaim refused while a live claim pointed at the volume,
	// kept so GetReclaim says why; the next Reclaim decides afresh.
	refused bool
	// trace: the span context of this replica's first attempt at the
	// reclaim, whose trace its later attempts join (trace.go).
	trace trace.SpanContext
}

// controller carries out reclaims: a rate-limited work queue of volume
// names feeds the workers; each sync re-reads the volume and takes the
// next step of its reclaim.
type controller struct {
	log      *slog.Logger
	member   string
	kube     cluster
	journal  journal
	drivers  *served.Cache
	prov     provisioner // nil: no CSI volume is served
	recorder record.EventRecorder
	cfg      config
	limiter  workqueue.TypedRateLimiter[string]
	queue    workqueue.TypedRateLimitingInterface[string]
	now      func() time.Time
	// lost is closed when this replica's etcd session is gone: then no
	// step starts any more.
	lost  <-chan struct{}
	scrub func(dir string) error
	// tracer receives the reclaim steps' spans (trace.go); nil: none.
	tracer trace.Tracer

	// volumes serializes the journal writes and entry changes of one
	// volume's held reclaim (hold, save, finish); always taken before mu.
	volumes volumeLocks
	// mu guards entries; never held across I/O.
	mu      sync.Mutex
	entries map[string]*entry
}

func newController(log *slog.Logger, member string, kc cluster, j journal, drv *served.Cache, prov provisioner,
	recorder record.EventRecorder, cfg config, retryStart, retryMax time.Duration, lost <-chan struct{}) *controller {
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryStart, retryMax)
	return &controller{
		log: log, member: member, kube: kc, journal: j, drivers: drv, prov: prov, recorder: recorder, cfg: cfg,
		limiter: limiter,
		queue:   workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "reclaims"}),
		now:     time.Now, lost: lost, scrub: scrubDir,
		entries: map[string]*entry{},
	}
}

// preconditionError is a request that does not fit the volume's state
// (gRPC FailedPrecondition).
type preconditionError struct{ msg string }

func (e *preconditionError) Error() string { return e.msg }

// errVolumeNotFound: the volume named does not exist (gRPC NotFound).
var errVolumeNotFound = errors.New("volume not found")

// errJournal wraps failures to reach etcd (gRPC Unavailable).
var errJournal = errors.New("reclaim journal in etcd")

// errSuperseded: while a step ran, the record was replaced by a newer
// reclaim of the same volume, or this replica lost its lock.
var errSuperseded = errors.New("the reclaim record was superseded")

// recorded marks an error whose message the sync already wrote into the
// record, so the retry keeps it.
type recorded struct{ err error }

func (e recorded) Error() string { return e.err.Error() }
func (e recorded) Unwrap() error { return e.err }

func clone(r *reclaimerv1.Reclaim) *reclaimerv1.Reclaim { return proto.Clone(r).(*reclaimerv1.Reclaim) }

// sameReclaim: two records of one reclaim of one release of one volume.
func sameReclaim(a, b *reclaimerv1.Reclaim) bool {
	return a.VolumeUid == b.VolumeUid && a.ClaimUid == b.ClaimUid && proto.Equal(a.CreateTime, b.CreateTime)
}

func claimUID(v *corev1.PersistentVolume) string {
	if v.Spec.ClaimRef == nil {
		return ""
	}
	return string(v.Spec.ClaimRef.UID)
}

// reclaim starts (or joins) the reclaim of a Released volume and returns
// where it stands.
func (c *controller) reclaim(ctx context.Context, v *corev1.PersistentVolume) (*reclaimerv1.Reclaim, error) {
	switch v.Status.Phase {
	case corev1.VolumeReleased, corev1.VolumeFailed:
	default:
		return nil, &preconditionError{fmt.Sprintf("volume %q is %s: only a Released or Failed volume is reclaimed", v.Name, phaseName(v.Status.Phase))}
	}
	if claimUID(v) == "" {
		return nil, &preconditionError{fmt.Sprintf("volume %q has no claimRef with a UID: no claim was released", v.Name)}
	}
	if !kube.KnownReclaimPolicy(v.Spec.PersistentVolumeReclaimPolicy) {
		return nil, &preconditionError{fmt.Sprintf("volume %q has reclaim policy %q: set spec.persistentVolumeReclaimPolicy to Retain, Recycle or Delete",
			v.Name, v.Spec.PersistentVolumeReclaimPolicy)}
	}
	r := c.current(v)
	if r != nil && r.State != reclaimerv1.State_STATE_SKIPPED {
		return r, nil
	}
	// A SKIPPED volume is another deleter's only as long as volplane
	// serves none of its names: planned again (from the served drivers'
	// cache), it is reclaimed as soon as a driver that serves it is added,
	// not RecordTTL later.
	p := c.plan(ctx, v)
	if r != nil && p.state == reclaimerv1.State_STATE_SKIPPED {
		return r, nil
	}
	if !p.acts() {
		r := c.newRecord(v, p)
		c.remember(r)
		return r, nil
	}
	return c.own(ctx, v, p)
}

func phaseName(p corev1.PersistentVolumePhase) string {
	if p == "" {
		return "without a phase"
	}
	return string(p)
}

// current returns this replica's record of the volume's present release,
// or nil when there is none worth returning (a new reclaim must start).
func (c *controller) current(v *corev1.PersistentVolume) *reclaimerv1.Reclaim {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[v.Name]
	if e == nil || e.refused || e.rec.VolumeUid != string(v.UID) || e.rec.ClaimUid != claimUID(v) {
		return nil
	}
	policy := string(v.Spec.PersistentVolumeReclaimPolicy)
	if e.held {
		if e.rec.Policy != policy {
			e.wake = true // the policy changed: plan again now
			c.queue.Add(v.Name)
		}
		return clone(e.rec)
	}
	if e.rec.Policy != policy || !c.now().Before(e.expires) || e.rec.State == reclaimerv1.State_STATE_CANCELLED {
		return nil
	}
	return clone(e.rec)
}

func (c *controller) newRecord(v *corev1.PersistentVolume, p plan) *reclaimerv1.Reclaim {
	now := timestamppb.New(c.now())
	r := &reclaimerv1.Reclaim{
		VolumeName: v.Name, VolumeUid: string(v.UID), Policy: string(v.Spec.PersistentVolumeReclaimPolicy),
		State: p.state, Message: p.message, Method: p.method, Driver: p.driver, Owner: c.member,
		CreateTime: now, UpdateTime: now,
	}
	if ref := v.Spec.ClaimRef; ref != nil {
		r.ClaimNamespace, r.ClaimName, r.ClaimUid = ref.Namespace, ref.Name, string(ref.UID)
	}
	if p.acts() {
		r.State = reclaimerv1.State_STATE_PENDING
	}
	return r
}

// remember keeps a record that needs no work (RETAINED, SKIPPED) for
// RecordTTL. A reclaim this replica holds is never overwritten: its worker
// is asked to look again and finishes it.
func (c *controller) remember(r *reclaimerv1.Reclaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[r.VolumeName]; e != nil && e.held {
		c.queue.Add(r.VolumeName)
		return
	}
	c.entries[r.VolumeName] = &entry{rec: clone(r), expires: c.now().Add(c.cfg.ttl)}
	c.log.Info("reclaim recorded", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "policy", r.Policy, "state", r.State, "message", r.Message)
}

// own takes the reclaim's journal lock, records it and queues it. When
// another replica holds the lock, its record is returned and nothing is
// done here.
func (c *controller) own(ctx context.Context, v *corev1.PersistentVolume, p plan) (*reclaimerv1.Reclaim, error) {
	jctx, cancel := context.WithTimeout(ctx, journalTimeout)
	defer cancel()
	// The lock and any record left under it, in one etcd transaction.
	old, ok, err := c.journal.AcquireGet(jctx, reclaimjournal.Kind, v.Name, c.member)
	if errors.Is(err, coord.ErrReserved) {
		return c.othersReclaim(jctx, v, p)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: lock the reclaim of %s: %w", errJournal, v.Name, err)
	}
	var r *reclaimerv1.Reclaim
	if ok {
		// A record left by a replica that stopped: resume it when it is
		// this very release, so no step is done twice.
		if d, err := reclaimjournal.Decode(old); err == nil && d.VolumeUid == string(v.UID) && d.ClaimUid == claimUID(v) {
			r = d
			c.log.Info("resuming a journaled reclaim", "volume", v.Name, "state", d.State, "owner", old.Holder)
		}
	}
	if r == nil {
		r = c.newRecord(v, p)
	}
	if err := c.hold(jctx, r); err != nil {
		return nil, err
	}
	c.log.Info("reclaim started", "volume", v.Name, "policy", r.Policy, "method", r.Method, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid))
	return clone(r), nil
}

// hold makes r a reclaim this replica carries out: written to the journal
// (whose lock the caller holds), kept in memory, queued. A reclaim of the
// same release already held is kept instead.
func (c *controller) hold(ctx context.Context, r *reclaimerv1.Reclaim) error {
	unlock := c.volumes.lock(r.VolumeName)
	defer unlock()
	c.mu.Lock()
	if e := c.entries[r.VolumeName]; e != nil && e.held && e.rec.VolumeUid == r.VolumeUid && e.rec.ClaimUid == r.ClaimUid {
		proto.Reset(r)
		proto.Merge(r, e.rec)
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	r.Owner, r.UpdateTime = c.member, timestamppb.New(c.now())
	b, err := reclaimjournal.Encode(r)
	if err != nil {
		return err
	}
	if err := c.journal.Put(ctx, reclaimjournal.Kind, r.VolumeName, c.member, b); err != nil {
		return fmt.Errorf("%w: record the reclaim of %s: %w", errJournal, r.VolumeName, err)
	}
	c.mu.Lock()
	c.entries[r.VolumeName] = &entry{rec: clone(r), held: true}
	c.mu.Unlock()
	c.queue.Add(r.VolumeName)
	return nil
}

// heldEntry returns the entry of the reclaim r when this replica holds
// it, nil otherwise. The caller holds the volume's lock, so that only a
// new etcd session (which drops every held entry) may change it.
func (c *controller) heldEntry(r *reclaimerv1.Reclaim) *entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[r.VolumeName]; e != nil && e.held && sameReclaim(e.rec, r) {
		return e
	}
	return nil
}

// dropHeld forgets e, a held reclaim whose lock this replica lost.
func (c *controller) dropHeld(name string, e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries[name] == e {
		delete(c.entries, name)
	}
}

// othersReclaim is the answer for a volume another replica holds: its
// record (which the holder writes right after taking the lock, so it is
// waited for briefly), or a PENDING one without an owner.
func (c *controller) othersReclaim(ctx context.Context, v *corev1.PersistentVolume, p plan) (*reclaimerv1.Reclaim, error) {
	for range 50 {
		rec, ok, err := c.journal.Get(ctx, reclaimjournal.Kind, v.Name)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errJournal, err)
		}
		if ok {
			if r, err := reclaimjournal.Decode(rec); err == nil {
				return r, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	r := c.newRecord(v, p)
	r.Owner, r.Message = "", "another reclaimer replica is starting this reclaim"
	return r, nil
}

// heldRecord returns a copy of the reclaim this replica holds for the
// volume, or nil.
func (c *controller) heldRecord(name string) *reclaimerv1.Reclaim {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[name]; e != nil && e.held {
		return clone(e.rec)
	}
	return nil
}

// save writes a held reclaim's new state to the journal (fenced on its
// lock: a replica that lost the lock writes nothing) and to memory.
func (c *controller) save(ctx context.Context, r *reclaimerv1.Reclaim) error {
	unlock := c.volumes.lock(r.VolumeName)
	defer unlock()
	e := c.heldEntry(r)
	if e == nil {
		return errSuperseded
	}
	r.Owner, r.UpdateTime = c.member, timestamppb.New(c.now())
	b, err := reclaimjournal.Encode(r)
	if err != nil {
		return err
	}
	jctx, cancel := context.WithTimeout(ctx, journalTimeout)
	defer cancel()
	if err := c.journal.Put(jctx, reclaimjournal.Kind, r.VolumeName, c.member, b); err != nil {
		if errors.Is(err, coord.ErrNotOwner) {
			c.dropHeld(r.VolumeName, e)
			return fmt.Errorf("%w: %w", errSuperseded, err)
		}
		return fmt.Errorf("%w: %w", errJournal, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries[r.VolumeName] != e {
		return errSuperseded // dropped by a new etcd session meanwhile
	}
	e.rec = clone(r)
	return nil
}

// finish ends a held reclaim: its journal record and lock go in one
// transaction, and its final state stays visible in memory for RecordTTL.
func (c *controller) finish(ctx context.Context, r *reclaimerv1.Reclaim, state reclaimerv1.State, msg string) error {
	unlock := c.volumes.lock(r.VolumeName)
	defer unlock()
	e := c.heldEntry(r)
	if e == nil {
		return errSuperseded
	}
	jctx, cancel := context.WithTimeout(ctx, journalTimeout)
	defer cancel()
	if err := c.journal.Finish(jctx, reclaimjournal.Kind, r.VolumeName, c.member); err != nil {
		if errors.Is(err, coord.ErrNotOwner) {
			c.dropHeld(r.VolumeName, e)
			return fmt.Errorf("%w: %w", errSuperseded, err)
		}
		return fmt.Errorf("%w: %w", errJournal, err)
	}
	r.State, r.Message, r.NextAttemptTime = state, msg, nil
	r.RecyclerPod, r.RecyclerPodUid, r.DeletingVolume = "", "", nil
	r.Owner, r.UpdateTime = c.member, timestamppb.New(c.now())
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.entries[r.VolumeName]; cur == nil || cur == e || !cur.held {
		c.entries[r.VolumeName] = &entry{rec: clone(r), expires: c.now().Add(c.cfg.ttl)}
	}
	ended(r, state, c.now())
	c.log.Info("reclaim finished", "volume", r.VolumeName, logging.ClaimRef(r.ClaimNamespace, r.ClaimName, r.ClaimUid), "policy", r.Policy, "state", state, "message", msg, "attempts", r.Attempts)
	return nil
}

// plan decides the reclaim of the volume as it is now.
func (c *controller) plan(ctx context.Context, v *corev1.PersistentVolume) plan {
	s := served.Set{Known: true}
	if v.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete {
		var names []string
		if v.Spec.CSI != nil {
			names = append(names, v.Spec.CSI.Driver)
		}
		s = c.drivers.Get(ctx, append(names, v.Annotations[kube.AnnDynamicallyProvisioned])...)
	}
	n := node{name: c.cfg.nodeName}
	if c.cfg.mode == RecycleNodeLocal && v.Spec.Local != nil && v.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimRecycle {
		n.labels = c.nodeLabels(ctx)
	}
	return decide(v, s, c.cfg.mode, n)
}

// nodeLabels are the labels of this replica's Node; without a Node object,
// only the hostname label Kubernetes sets to the node name.
func (c *controller) nodeLabels(ctx context.Context) map[string]string {
	n, err := c.kube.GetNode(ctx, c.cfg.nodeName)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			c.log.Warn("cannot read this replica's node; matching local volumes by its hostname label only", "node", c.cfg.nodeName, "error", err)
		}
		return map[string]string{corev1.LabelHostname: c.cfg.nodeName}
	}
	return n.Labels
}
