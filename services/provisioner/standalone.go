package provisioner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/match"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// Standalone mode (Options.Standalone, --standalone): volplane's binder
// does not run, kube-controller-manager's does (a managed cluster, where
// it cannot be turned off), and the provisioner finds the claims to
// provision by itself, as external-provisioner does: every claim the
// binder has handed to one of its drivers through the storage-provisioner
// annotation. Each goes through provision, the very attempt the binder's
// Provision call makes (journal, fencing, CreateVolume, Events, the PV
// with its claimRef); kube-controller-manager then binds that PV.

// Defaults of the standalone controller (external-provisioner's
// --worker-threads, --retry-interval-start and --retry-interval-max).
const (
	DefaultStandaloneWorkers  = 100
	DefaultRetryIntervalStart = time.Second
	DefaultRetryIntervalMax   = 5 * time.Minute
)

// shouldProvision is external-provisioner's decision (the library's
// shouldProvision with csi-provisioner's ShouldProvision): a claim is
// provisioned when it asks for no volume by name, its
// storage-provisioner annotation (or, without it, the beta one) names a
// provisioner served here, and, for a class with WaitForFirstConsumer,
// the scheduler has selected a node. As volplane's Provision, a claim
// being deleted or no longer Pending is not. class reads a StorageClass;
// its error (a class not there yet) is retried by the caller.
func shouldProvision(claim *corev1.PersistentVolumeClaim, serves func(string) bool, class func(string) (*storagev1.StorageClass, error)) (bool, error) {
	if claim.Spec.VolumeName != "" || claim.DeletionTimestamp != nil {
		return false, nil
	}
	if p := claim.Status.Phase; p != "" && p != corev1.ClaimPending {
		return false, nil
	}
	name, ok := claim.Annotations[kube.AnnStorageProvisioner]
	if !ok {
		name, ok = claim.Annotations[kube.AnnBetaStorageProvisioner]
	}
	if !ok || !serves(name) {
		return false, nil
	}
	sc, err := class(match.ClaimClass(claim))
	if err != nil {
		return false, err
	}
	if m := sc.VolumeBindingMode; m != nil && *m == storagev1.VolumeBindingWaitForFirstConsumer {
		return claim.Annotations[kube.AnnSelectedNode] != "", nil
	}
	return true, nil
}

// standalone is the provisioner's own claim controller in standalone
// mode, shaped as sample-controller: the claim cache's changes enqueue
// keys, workers sync them, a failed or unfinished attempt is retried
// after the claim's exponential backoff.
type standalone struct {
	log     *slog.Logger
	p       *provisioner
	client  kubernetes.Interface
	claims  cache.Indexer // the objectCache's
	classes cache.Indexer // the objectCache's
	// volumes are the PVs, as external-provisioner skips a claim whose
	// PV exists already (kube-controller-manager has not bound it yet).
	volumes cache.Indexer
	queue   workqueue.TypedRateLimitingInterface[string]
	// slow: claims (by key) whose last attempt was infeasible, not
	// tried again before retryMax unless their class is replaced (the
	// library's slowSet).
	slow     sync.Map // string -> slowRetry
	retryMax time.Duration
	now      func() time.Time
}

// slowRetry is a claim's infeasible attempt: when, with which class.
type slowRetry struct {
	at           time.Time
	claim, class types.UID
}

// newStandalone is the controller of p over the claim and class cache
// and the PV informer's store.
func newStandalone(log *slog.Logger, p *provisioner, objs *objectCache, volumes cache.Indexer, retryStart, retryMax time.Duration) *standalone {
	limiter := workqueue.NewTypedItemExponentialFailureRateLimiter[string](retryStart, retryMax)
	return &standalone{
		log: log, p: p, client: p.client, claims: objs.claims, classes: objs.classes, volumes: volumes, retryMax: retryMax, now: time.Now,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "standalone-claims"}),
	}
}

// enqueue is the claim cache's onClaim: a changed or deleted claim.
func (s *standalone) enqueue(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		s.queue.Add(key)
	}
}

// run syncs claims with workers until ctx ends, once the cache has its
// first full list.
func (s *standalone) run(ctx context.Context, workers int, synced cache.InformerSynced) error {
	defer s.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return nil
	}
	s.enqueueAll()
	done := make(chan struct{})
	for range workers {
		go func() {
			for s.next(ctx) {
			}
			done <- struct{}{}
		}()
	}
	<-ctx.Done()
	s.queue.ShutDown()
	for range workers {
		<-done
	}
	return nil
}

// next syncs one key; false when the queue is shut down.
func (s *standalone) next(ctx context.Context) bool {
	key, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(key)
	retry, err := s.sync(ctx, key, s.queue.NumRequeues(key) > 0)
	switch {
	case err != nil:
		s.log.Info("provisioning claim not finished, retrying", "claim", key, "error", err, "failures", s.queue.NumRequeues(key))
		s.queue.AddRateLimited(key)
	case retry:
		s.queue.AddRateLimited(key)
	default:
		s.queue.Forget(key)
	}
	return true
}

// sync makes one provisioning attempt at the claim under key, if it
// should have one. retry says the attempt did not finish (the driver may
// still be working, or failed: external-provisioner retries final errors
// too); an error is a read or write that failed. A retry first asks the
// API server whether the PV exists: another replica may have made it
// since, and the PV informer not have it yet.
func (s *standalone) sync(ctx context.Context, key string, retried bool) (retry bool, err error) {
	obj, ok, err := s.claims.GetByKey(key)
	if err != nil || !ok {
		// Gone: a journaled attempt is undone by recovery.
		s.slow.Delete(key)
		return false, err
	}
	claim := obj.(*corev1.PersistentVolumeClaim)
	should, err := shouldProvision(claim, s.serves, s.class)
	if err != nil {
		countProvisionFailed(claim)
	}
	if err != nil || !should {
		return false, err
	}
	class, err := s.class(match.ClaimClass(claim))
	if err != nil {
		return false, err
	}
	if exists, err := s.provisioned(ctx, s.p.volumeNameFor(class, claim), retried); err != nil || exists {
		if exists {
			countProvisionFailed(claim) // as the library's errStopProvision
		}
		return false, err // provisioned; kube-controller-manager binds it
	}
	if s.p.drivers.byProvisioner(class.Provisioner) == nil {
		// The class's provisioner changed since the claim was annotated:
		// as external-provisioner, stop (errStopProvision: counted failed).
		countProvisionFailed(claim)
		return false, nil
	}
	if s.delayed(claim, class) {
		return true, nil
	}
	ctx, step := s.p.timeline.Start(ctx, string(claim.UID), "provision")
	start := time.Now()
	res, err := s.p.provision(ctx, claim, class, "")
	countProvision(claim, res, err, start)
	if err != nil {
		step.EndErr(err, "")
		return false, err
	}
	step.End(strings.TrimPrefix(res.outcome.String(), "OUTCOME_"), res.message)
	outcomes.WithLabelValues(kindProvision, res.outcome.String()).Inc()
	return s.ended(ctx, claim, res)
}

// provisioned reports whether the PV name exists: in the PV informer's
// store, and with live also in the API server.
func (s *standalone) provisioned(ctx context.Context, name string, live bool) (bool, error) {
	if _, exists, _ := s.volumes.GetByKey(name); exists || !live {
		return exists, nil
	}
	_, err := s.client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// ended acts on an attempt's outcome: a new PV goes into the store
// at once (so the next sync does not attempt again before its watch
// event); RESCHEDULE removes the selected node, as external-provisioner
// does, so the scheduler picks another; anything else is retried.
func (s *standalone) ended(ctx context.Context, claim *corev1.PersistentVolumeClaim, res result) (bool, error) {
	if res.infeasible {
		if class, err := s.class(match.ClaimClass(claim)); err == nil {
			s.slow.Store(claimKey(claim), slowRetry{at: s.now(), claim: claim.UID, class: class.UID})
		}
	}
	switch res.outcome {
	case provisionerv1.Outcome_OUTCOME_FINISHED:
		s.slow.Delete(claimKey(claim))
		if res.volume != nil {
			_ = s.volumes.Add(res.volume) // a keyed object: no error
		}
		return false, nil
	case provisionerv1.Outcome_OUTCOME_RESCHEDULE:
		return false, s.reschedule(ctx, claim)
	}
	s.log.Debug("provisioning not finished", logging.Claim(claim), "outcome", res.outcome, "message", res.message)
	return true, nil
}

// delayed reports whether the claim's last attempt was infeasible less
// than retryMax ago with the same class (the library's
// delayProvisioningIfRecentlyInfeasible): the driver would refuse it
// again.
func (s *standalone) delayed(claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) bool {
	v, ok := s.slow.Load(claimKey(claim))
	if !ok {
		return false
	}
	r := v.(slowRetry)
	if r.claim != claim.UID || r.class != class.UID || s.now().Sub(r.at) >= s.retryMax {
		s.slow.Delete(claimKey(claim))
		return false
	}
	return true
}

// claimKey is the claim's queue key.
func claimKey(c *corev1.PersistentVolumeClaim) string { return c.Namespace + "/" + c.Name }

// reschedule removes the claim's selected-node annotation (the library's
// rescheduleProvisioning): the scheduler then selects a node again.
func (s *standalone) reschedule(ctx context.Context, claim *corev1.PersistentVolumeClaim) error {
	if _, ok := claim.Annotations[kube.AnnSelectedNode]; !ok {
		return nil
	}
	clone := claim.DeepCopy()
	delete(clone.Annotations, kube.AnnSelectedNode)
	_, err := s.client.CoreV1().PersistentVolumeClaims(clone.Namespace).Update(ctx, clone, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete annotation %s of claim %s/%s: %w", kube.AnnSelectedNode, claim.Namespace, claim.Name, err)
	}
	return nil
}

// serves reports whether a driver of this provisioner serves the
// provisioner name.
func (s *standalone) serves(name string) bool { return s.p.drivers.byProvisioner(name) != nil }

// errNoClass: the claim's StorageClass is not in the cache (yet).
var errNoClass = errors.New("StorageClass not found")

// class reads a StorageClass from the cache.
func (s *standalone) class(name string) (*storagev1.StorageClass, error) {
	obj, ok, err := s.classes.GetByKey(name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: %q", errNoClass, name)
	}
	return obj.(*storagev1.StorageClass), nil
}

// standaloneTask is the standalone controller of p as a replica task:
// the claim cache tells it (besides the cloning protection, cloned) of
// every claim's change, the registry of every driver that comes, goes or
// changes readiness (a discovered driver appears after the claims that
// wait for it), and it runs once the drivers are probed (a driver's
// provisioner name is known then) and the caches are listed.
func standaloneTask(log *slog.Logger, o Options, p *provisioner, objs *objectCache, volumes cache.SharedIndexInformer, cloned func(any)) func(context.Context) error {
	sa := newStandalone(log.With("controller", "standalone"), p, objs, volumes.GetIndexer(), o.RetryIntervalStart, o.RetryIntervalMax)
	objs.onClaim = func(obj any) { cloned(obj); sa.enqueue(obj) }
	p.drivers.setOnChange(sa.enqueueAll)
	return func(ctx context.Context) error {
		select {
		case <-p.drivers.probed:
		case <-ctx.Done():
			return nil
		}
		return sa.run(ctx, o.StandaloneWorkers, func() bool { return objs.hasSynced() && volumes.HasSynced() })
	}
}

// enqueueAll enqueues every cached claim: a driver came or became ready.
func (s *standalone) enqueueAll() {
	for _, key := range s.claims.ListKeys() {
		s.queue.Add(key)
	}
}

// validateStandalone checks and defaults the standalone mode's options.
func (o *Options) validateStandalone() []error {
	var errs []error
	switch {
	case o.StandaloneWorkers < 0:
		errs = append(errs, fmt.Errorf("--worker-threads must not be negative, got %d", o.StandaloneWorkers))
	case o.StandaloneWorkers == 0:
		o.StandaloneWorkers = DefaultStandaloneWorkers
	}
	for _, d := range []struct {
		v    *time.Duration
		def  time.Duration
		flag string
	}{{&o.RetryIntervalStart, DefaultRetryIntervalStart, "--retry-interval-start"}, {&o.RetryIntervalMax, DefaultRetryIntervalMax, "--retry-interval-max"}} {
		switch {
		case *d.v < 0:
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", d.flag, *d.v))
		case *d.v == 0:
			*d.v = d.def
		}
	}
	if o.RetryIntervalMax > 0 && o.RetryIntervalMax < o.RetryIntervalStart {
		errs = append(errs, fmt.Errorf("--retry-interval-max %s is below --retry-interval-start %s", o.RetryIntervalMax, o.RetryIntervalStart))
	}
	return errs
}

// volumeInformer adds to factory the PV informer of standalone mode,
// managedFields dropped.
func volumeInformer(factory informers.SharedInformerFactory) (cache.SharedIndexInformer, error) {
	inf := factory.Core().V1().PersistentVolumes().Informer()
	if err := inf.SetTransform(kube.StripManagedFields); err != nil {
		return nil, fmt.Errorf("PersistentVolume informer: %w", err)
	}
	return inf, nil
}
