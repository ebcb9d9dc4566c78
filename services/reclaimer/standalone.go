package reclaimer

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/served"
)

// Standalone mode (Options.Standalone, --standalone): volplane's binder
// does not run and kube-controller-manager's does (a managed cluster), so
// no binder hands Released volumes over. The reclaimer watches the PVs
// itself and takes, as external-provisioner does, the Released volumes
// with policy Delete of the drivers volplane's provisioner serves: each
// goes through Reclaim's own path (the live-claim guard, then the
// journaled, guarded Delete of deleteBacking, which removes the
// external-provisioner finalizer). It also keeps that finalizer right on
// the served volumes, as the library's handleProtectionFinalizer does
// (the binder does it otherwise). Retain needs nothing. Recycle is not
// taken: kube-controller-manager's binder recycles (its recycler pod for
// hostPath and NFS, VolumeFailedRecycle for anything else), and two
// recyclers of one volume would race.

// standaloneWorkers is how many volumes are synced at once: each sync is
// a finalizer write or a hand-over to the reclaim queue, which does the
// work with its own workers.
const standaloneWorkers = 4

// shouldDelete is external-provisioner's decision (the library's
// isProvisionerForVolume and shouldDelete with AddFinalizer(true)): a
// volume of a served provisioner or driver, Released, with policy
// Delete, and not being deleted unless the external-provisioner
// finalizer still holds it. Failed is not (as upstream): in this mode a
// failed deletion is an Event only (markFailed), and the phase stays
// Released, so the reclaim's retries go on.
func shouldDelete(v *corev1.PersistentVolume, s served.Set) bool {
	if !s.Known || !s.Owns(v) {
		return false
	}
	if v.DeletionTimestamp != nil && !slices.Contains(v.Finalizers, kube.FinalizerExternalProvisioner) {
		return false // the finalizer was removed: the backing volume is gone
	}
	if v.Status.Phase != corev1.VolumeReleased {
		return false
	}
	return v.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete && claimUID(v) != ""
}

// volumeWatch is the standalone mode's PV controller: the PV informer's
// changes enqueue names, workers sync them.
type volumeWatch struct {
	log     *slog.Logger
	c       *controller
	volumes cache.Indexer
	queue   workqueue.TypedRateLimitingInterface[string]
}

// startVolumeWatch adds a PV informer to factory (which the caller
// starts) feeding a volumeWatch of c.
func startVolumeWatch(log *slog.Logger, c *controller, factory informers.SharedInformerFactory, o Options) (*volumeWatch, cache.InformerSynced, error) {
	inf := factory.Core().V1().PersistentVolumes().Informer()
	w := &volumeWatch{log: log, c: c, volumes: inf.GetIndexer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.RetryIntervalStart, o.RetryIntervalMax),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "standalone-volumes"})}
	add := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			w.queue.Add(key)
		}
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: add, UpdateFunc: func(_, obj any) { add(obj) }})
	if err != nil {
		return nil, nil, fmt.Errorf("PersistentVolume informer: %w", err)
	}
	return w, reg.HasSynced, nil
}

// run syncs volumes until ctx ends, once the informer has synced.
func (w *volumeWatch) run(ctx context.Context, synced cache.InformerSynced) error {
	defer w.queue.ShutDown()
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return nil
	}
	done := make(chan struct{})
	for range standaloneWorkers {
		go func() {
			for w.next(ctx) {
			}
			done <- struct{}{}
		}()
	}
	<-ctx.Done()
	w.queue.ShutDown()
	for range standaloneWorkers {
		<-done
	}
	return nil
}

func (w *volumeWatch) next(ctx context.Context) bool {
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)
	if err := w.sync(ctx, key); err != nil {
		w.log.Info("volume not handed to the reclaim yet, retrying", "volume", key, "error", err, "failures", w.queue.NumRequeues(key))
		w.queue.AddRateLimited(key)
		return true
	}
	w.queue.Forget(key)
	return true
}

// sync keeps the finalizer of the volume under key right, and starts its
// reclaim when it should be deleted.
func (w *volumeWatch) sync(ctx context.Context, key string) error {
	obj, ok, err := w.volumes.GetByKey(key)
	if err != nil || !ok {
		return err
	}
	v := obj.(*corev1.PersistentVolume)
	s := w.c.drivers.Get(ctx)
	if !s.Known {
		return fmt.Errorf("the provisioner's drivers are not known yet: %v", s.Err)
	}
	if finalizers, changed := s.ProtectionFinalizers(v); changed {
		clone := v.DeepCopy()
		clone.Finalizers = finalizers
		_, err := w.c.kube.UpdateVolume(ctx, clone)
		return err // its update event syncs it again
	}
	if !shouldDelete(v, s) {
		return nil
	}
	if err := w.c.refuseLiveClaim(ctx, v); err != nil {
		return err
	}
	_, err = w.c.reclaim(ctx, v)
	return err
}
