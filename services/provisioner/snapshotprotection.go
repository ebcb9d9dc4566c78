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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/logging"
)

// External-provisioner v6.2's protection of a VolumeSnapshot a volume is
// restored from: the finalizer below is put on the VolumeSnapshot right
// before CreateVolume is first asked for a volume from it, and removed
// once the claim's PersistentVolume is saved; a snapshot being deleted
// that carries it may still be restored from (the restore started before
// the deletion). v6.3's sweeper removes the finalizers that stay behind
// (a provisioner that stopped in between, a claim deleted or failed
// finally): from every VolumeSnapshot no Pending claim restores from.

// finalizerSnapshotSource is external-provisioner's finalizer on a
// VolumeSnapshot a volume is being restored from.
const finalizerSnapshotSource = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"

// DefaultSnapshotOrphanSweepInterval is external-provisioner's default of
// --snapshot-orphan-sweep-interval.
const DefaultSnapshotOrphanSweepInterval = 5 * time.Minute

// protectSnapshot puts the finalizer on snap. Without the RBAC to update
// VolumeSnapshots the restore goes on unprotected, as upstream's.
func (s sources) protectSnapshot(ctx context.Context, snap *unstructured.Unstructured) error {
	if slices.Contains(snap.GetFinalizers(), finalizerSnapshotSource) || planning(ctx) {
		return nil
	}
	clone := snap.DeepCopy()
	clone.SetFinalizers(append(clone.GetFinalizers(), finalizerSnapshotSource))
	_, err := s.dynamic.Resource(snapshotsResource).Namespace(snap.GetNamespace()).Update(ctx, clone, metav1.UpdateOptions{})
	if err != nil && !apierrors.IsForbidden(err) {
		return fmt.Errorf("protect VolumeSnapshot %s/%s while a volume is restored from it: %w", snap.GetNamespace(), snap.GetName(), err)
	}
	return nil
}

// releaseSnapshot removes the finalizer from the VolumeSnapshot claim's
// spec.dataSource names, once its volume is provisioned. As upstream's,
// only spec.dataSource counts (a snapshot of another namespace, named by
// dataSourceRef, is left to the sweeper), and a failure is only logged:
// the sweeper finishes the job.
func (s sources) releaseSnapshot(ctx context.Context, log *slog.Logger, claim *corev1.PersistentVolumeClaim) {
	ds := claim.Spec.DataSource
	if s.dynamic == nil || ds == nil || ds.Kind != "VolumeSnapshot" || (ds.APIGroup != nil && *ds.APIGroup != snapshotGroup) {
		return
	}
	if err := removeSnapshotFinalizer(ctx, s.dynamic, claim.Namespace, ds.Name); err != nil {
		log.Warn("remove the snapshot-as-source finalizer; the sweeper will", logging.Claim(claim), "snapshot", ds.Name, "error", err)
	}
}

// removeSnapshotFinalizer removes the finalizer from the VolumeSnapshot
// namespace/name: gone, or without it, is done; without the RBAC it stays.
func removeSnapshotFinalizer(ctx context.Context, dyn dynamic.Interface, namespace, name string) error {
	r := dyn.Resource(snapshotsResource).Namespace(namespace)
	snap, err := r.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return dropSnapshotFinalizer(ctx, dyn, snap)
}

func dropSnapshotFinalizer(ctx context.Context, dyn dynamic.Interface, snap *unstructured.Unstructured) error {
	if !slices.Contains(snap.GetFinalizers(), finalizerSnapshotSource) {
		return nil
	}
	clone := snap.DeepCopy()
	clone.SetFinalizers(slices.DeleteFunc(clone.GetFinalizers(), func(f string) bool { return f == finalizerSnapshotSource }))
	_, err := dyn.Resource(snapshotsResource).Namespace(snap.GetNamespace()).Update(ctx, clone, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return nil
	}
	return err
}

// restoring is the set of VolumeSnapshots ("namespace/name") that a claim
// still waiting for its volume (phase Pending, or none yet) restores from,
// through spec.dataSource or spec.dataSourceRef (whose namespace may be
// another), as upstream's buildPendingSnapshotIndex.
func restoring(claims []*corev1.PersistentVolumeClaim) map[string]bool {
	out := map[string]bool{}
	for _, c := range claims {
		if c.Status.Phase != corev1.ClaimPending && c.Status.Phase != "" {
			continue
		}
		if ds := c.Spec.DataSource; ds != nil && ds.Kind == "VolumeSnapshot" && (ds.APIGroup == nil || *ds.APIGroup == snapshotGroup) {
			out[c.Namespace+"/"+ds.Name] = true
			continue
		}
		if ref := c.Spec.DataSourceRef; ref != nil && ref.Kind == "VolumeSnapshot" && (ref.APIGroup == nil || *ref.APIGroup == snapshotGroup) {
			ns := c.Namespace
			if ref.Namespace != nil && *ref.Namespace != "" {
				ns = *ref.Namespace
			}
			out[ns+"/"+ref.Name] = true
		}
	}
	return out
}

// orphanedSnapshots are the snapshots of all that carry the finalizer and
// that no claim restores from any more.
func orphanedSnapshots(all []unstructured.Unstructured, claims []*corev1.PersistentVolumeClaim) []*unstructured.Unstructured {
	pending := restoring(claims)
	var out []*unstructured.Unstructured
	for i := range all {
		s := &all[i]
		if slices.Contains(s.GetFinalizers(), finalizerSnapshotSource) && !pending[s.GetNamespace()+"/"+s.GetName()] {
			out = append(out, s)
		}
	}
	return out
}

// snapshotSweeper removes orphaned snapshot-as-source finalizers every
// interval, as external-provisioner v6.3's SnapshotFinalizerController.
type snapshotSweeper struct {
	log     *slog.Logger
	client  kubernetes.Interface
	dynamic dynamic.Interface
	claims  corelisters.PersistentVolumeClaimLister
}

// run sweeps every interval until ctx ends, from the moment synced reports
// the first full list of claims; while current (when set) reports the
// claim cache may be behind, it skips the sweep (a claim it has not seen
// yet may be restoring).
func (s *snapshotSweeper) run(ctx context.Context, synced, current func() bool, interval time.Duration) {
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if current == nil || current() {
			s.sweep(ctx)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (s *snapshotSweeper) sweep(ctx context.Context) {
	// The snapshots first: a finalizer seen on one was put there by an
	// attempt for a claim that exists by then, so the claims read next
	// hold it unless it is done.
	list, err := s.dynamic.Resource(snapshotsResource).List(ctx, metav1.ListOptions{})
	if err != nil {
		// No snapshot CRDs, or no RBAC to list them: nothing to sweep.
		s.log.Debug("list VolumeSnapshots to sweep orphaned snapshot-as-source finalizers", "error", err)
		return
	}
	claims, err := s.claims.List(labels.Everything())
	if err != nil {
		return
	}
	orphans := orphanedSnapshots(list.Items, claims)
	if len(orphans) == 0 {
		return
	}
	// The cache may not hold a claim yet that the binder already asked
	// this provisioner to restore (it is fed by its own watch): the API
	// server decides, for the few snapshots the cache calls orphans.
	live, err := s.client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		s.log.Debug("list claims to confirm orphaned snapshot-as-source finalizers", "error", err)
		return
	}
	pending := restoring(ptrs(live.Items))
	for _, snap := range orphans {
		key := snap.GetNamespace() + "/" + snap.GetName()
		if pending[key] {
			continue
		}
		if err := dropSnapshotFinalizer(ctx, s.dynamic, snap); err != nil {
			s.log.Warn("remove an orphaned snapshot-as-source finalizer", "snapshot", key, "error", err)
			continue
		}
		s.log.Info("removed an orphaned snapshot-as-source finalizer", "snapshot", key)
	}
}

func ptrs(claims []corev1.PersistentVolumeClaim) []*corev1.PersistentVolumeClaim {
	out := make([]*corev1.PersistentVolumeClaim, len(claims))
	for i := range claims {
		out[i] = &claims[i]
	}
	return out
}
