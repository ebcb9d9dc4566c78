package provisioner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/logging"
)

// finalizerCloneProtection keeps a claim that a clone is being made from
// until no Pending claim clones it, as external-provisioner's.
const finalizerCloneProtection = "provisioner.storage.kubernetes.io/cloning-protection"

// checkCloneVolumeMode refuses a clone whose volume mode differs from its
// source volume's, with external-provisioner's messages, before the
// driver is asked.
func checkCloneVolumeMode(claim *corev1.PersistentVolumeClaim, source *corev1.PersistentVolume) error {
	block := func(m *corev1.PersistentVolumeMode) bool { return m != nil && *m == corev1.PersistentVolumeBlock }
	switch {
	case !block(claim.Spec.VolumeMode) && block(source.Spec.VolumeMode):
		return fmt.Errorf("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem")
	case block(claim.Spec.VolumeMode) && !block(source.Spec.VolumeMode):
		return fmt.Errorf("the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block")
	}
	return nil
}

// protectCloneSource puts the cloning-protection finalizer on a clone's
// source claim, right before the driver is asked to copy it.
func protectCloneSource(ctx context.Context, c kubernetes.Interface, src *corev1.PersistentVolumeClaim) error {
	if slices.Contains(src.Finalizers, finalizerCloneProtection) {
		return nil
	}
	clone := src.DeepCopy()
	clone.Finalizers = append(clone.Finalizers, finalizerCloneProtection)
	if _, err := c.CoreV1().PersistentVolumeClaims(src.Namespace).Update(ctx, clone, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("protect source claim %s/%s while it is cloned: %w", src.Namespace, src.Name, err)
	}
	return nil
}

// cloneProtection removes the cloning-protection finalizer from claims
// that no Pending claim clones any more (external-provisioner's
// CloningProtectionController), on every claim change that may end a
// clone and every period.
type cloneProtection struct {
	log    *slog.Logger
	client kubernetes.Interface
	claims corelisters.PersistentVolumeClaimLister
	kick   chan struct{}
}

func newCloneProtection(log *slog.Logger, client kubernetes.Interface, claims corelisters.PersistentVolumeClaimLister) *cloneProtection {
	return &cloneProtection{log: log, client: client, claims: claims, kick: make(chan struct{}, 1)}
}

// claimChanged is told of every claim added, updated or deleted (a claim
// or a tombstone): one that may end a clone brings a sweep.
func (p *cloneProtection) claimChanged(obj any) {
	if c, ok := obj.(*corev1.PersistentVolumeClaim); !ok || isClone(c) || slices.Contains(c.Finalizers, finalizerCloneProtection) {
		p.poke()
	}
}

func isClone(c *corev1.PersistentVolumeClaim) bool {
	ds := c.Spec.DataSource
	return ds != nil && ds.Kind == "PersistentVolumeClaim" && (ds.APIGroup == nil || *ds.APIGroup == "")
}

func (p *cloneProtection) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run sweeps on every kick and every period until ctx ends, from the
// moment synced reports the first full list of claims; while current
// reports the claim cache may be behind, it skips the sweeps (a finalizer
// left a little longer harms nothing).
func (p *cloneProtection) run(ctx context.Context, synced, current func() bool, period time.Duration) error {
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return nil
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if current() {
			p.sweep(ctx)
		}
		select {
		case <-p.kick:
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// sweep removes the finalizer from every protected claim without a
// Pending clone.
func (p *cloneProtection) sweep(ctx context.Context) {
	all, err := p.claims.List(labels.Everything())
	if err != nil {
		return
	}
	cloning := map[string]bool{}
	for _, c := range all {
		if isClone(c) && c.Status.Phase == corev1.ClaimPending {
			cloning[c.Namespace+"/"+c.Spec.DataSource.Name] = true
		}
	}
	for _, c := range all {
		if !slices.Contains(c.Finalizers, finalizerCloneProtection) || cloning[c.Namespace+"/"+c.Name] {
			continue
		}
		clone := c.DeepCopy()
		clone.Finalizers = slices.DeleteFunc(clone.Finalizers, func(f string) bool { return f == finalizerCloneProtection })
		if _, err := p.client.CoreV1().PersistentVolumeClaims(c.Namespace).Update(ctx, clone, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
			// A conflict: its update event brings the next sweep.
			p.log.Debug("remove cloning protection", logging.Claim(c), "error", err)
		}
	}
}
