package provisioner

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// informerFeed fills the provisioner's objectCache from its own informers
// on claims and StorageClasses, without a watcher (no --watcher-address):
// for a provisioner beside a binder that is not volplane's. It feeds the
// same cache through the same methods as the stream: an informer relists
// by itself and reports what it missed as deletions, so the cache is
// current from the informers' first full list on, and never stale.
type informerFeed struct {
	cache                      *objectCache
	claimHandler, classHandler cache.ResourceEventHandlerRegistration
}

var _ feeder = (*informerFeed)(nil)

// newInformerFeed adds claim and StorageClass informers to factory, which
// the caller starts, feeding c.
func newInformerFeed(c *objectCache, factory informers.SharedInformerFactory) (*informerFeed, error) {
	f := &informerFeed{cache: c}
	ci := factory.Core().V1().PersistentVolumeClaims().Informer()
	si := factory.Storage().V1().StorageClasses().Informer()
	for _, inf := range []cache.SharedIndexInformer{ci, si} {
		if err := inf.SetTransform(stripManagedFields); err != nil {
			return nil, fmt.Errorf("claim and class informers: %w", err)
		}
	}
	var err error
	f.claimHandler, err = ci.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    f.putClaim,
		UpdateFunc: func(_, obj any) { f.putClaim(obj) },
		DeleteFunc: func(obj any) { f.cache.dropClaim(deleted(obj)) },
	})
	if err != nil {
		return nil, fmt.Errorf("claim informer: %w", err)
	}
	f.classHandler, err = si.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    f.putClass,
		UpdateFunc: func(_, obj any) { f.putClass(obj) },
		DeleteFunc: func(obj any) { f.cache.dropClass(deleted(obj)) },
	})
	if err != nil {
		return nil, fmt.Errorf("StorageClass informer: %w", err)
	}
	return f, nil
}

func (f *informerFeed) putClaim(obj any) {
	if cl, ok := obj.(*corev1.PersistentVolumeClaim); ok {
		_ = f.cache.putClaim(cl) // an Indexer's Update of a keyed object does not fail
	}
}

func (f *informerFeed) putClass(obj any) {
	if sc, ok := obj.(*storagev1.StorageClass); ok {
		_ = f.cache.putClass(sc)
	}
}

// run marks the cache listed once both informers have handed it their
// first full list.
func (f *informerFeed) run(ctx context.Context) error {
	if cache.WaitForCacheSync(ctx.Done(), f.claimHandler.HasSynced, f.classHandler.HasSynced) {
		f.cache.listed()
	}
	return nil
}

func (f *informerFeed) about() []any { return []any{"source", "informers"} }

// deleted is the key and UID of an object an informer deleted (or its
// tombstone).
func deleted(obj any) (key, uid string) {
	key, _ = cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if m, err := meta.Accessor(obj); err == nil {
		uid = string(m.GetUID())
	}
	return key, uid
}

// stripManagedFields is the informers' transform: the provisioner keeps
// objects without managedFields, as the stream's.
func stripManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
