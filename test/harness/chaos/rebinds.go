package chaos

import (
	"context"
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Rebind rows of the invariant table.
const (
	InvRebindRules = "rebinds breaking a rule (docs/rebind.md)"
	InvRebinds     = "rebinds of Released volumes to recreated claims"
)

// CheckRebinds judges every rebind the watch saw against the rules of
// docs/rebind.md, on the converged cluster: the volume went to a claim of
// the namespace and name of its last claimRef, whose earlier claim the run
// had deleted; its policy (its own annotation, else its class's, from
// classPolicy) allowed it; it was Retain and Released; no reclaim of it
// had been journaled before; the data of the claim it was released from
// is still in it (its marker); and the volume still exists, bound to the
// recreated claim while that claim lives (one claim per volume).
func CheckRebinds(ctx context.Context, c *Cluster, b *Book, rebinds []Rebind, j *Journaled, classPolicy map[string]string) ([]string, error) {
	claimList, err := c.Client.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	claims := map[types.UID]*corev1.PersistentVolumeClaim{}
	for i := range claimList.Items {
		claims[claimList.Items[i].UID] = &claimList.Items[i]
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var bad []string
	last := map[string]Rebind{}
	for _, r := range rebinds {
		last[r.Volume] = r
		for _, why := range rebindBroken(r, b, j, classPolicy) {
			bad = append(bad, fmt.Sprintf("%s from %s/%s (%s) to %s (%s): %s", r.Volume, r.From.Namespace, r.From.Name, r.From.UID, r.To.Name, r.To.UID, why))
		}
	}
	for name, r := range last {
		pv, err := c.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s (rebound to %s/%s): the volume is lost: %v", name, r.To.Namespace, r.To.Name, err))
			continue
		}
		cl := claims[r.To.UID]
		if cl == nil || cl.DeletionTimestamp != nil {
			continue
		}
		if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != cl.UID || pv.Status.Phase != corev1.VolumeBound || cl.Spec.VolumeName != name || cl.Status.Phase != corev1.ClaimBound {
			bad = append(bad, fmt.Sprintf("%s rebound to %s/%s (%s): not Bound to each other now (volume %s, claim %s on %q)",
				name, cl.Namespace, cl.Name, cl.UID, pv.Status.Phase, cl.Status.Phase, cl.Spec.VolumeName))
		}
	}
	return bad, nil
}

// rebindBroken lists the rules rebind r broke; b's lock is held.
func rebindBroken(r Rebind, b *Book, j *Journaled, classPolicy map[string]string) []string {
	var why []string
	if r.To.Namespace != r.From.Namespace || r.To.Name != r.From.Name {
		why = append(why, "another claim's namespace/name")
	}
	policy := r.Policy
	if !r.HasPolicy {
		policy = classPolicy[r.Class]
	}
	if policy != rebindSameClaimName {
		why = append(why, fmt.Sprintf("its rebind policy is %q", policy))
	}
	if r.Reclaim != corev1.PersistentVolumeReclaimRetain {
		why = append(why, fmt.Sprintf("reclaim policy %s", r.Reclaim))
	}
	if r.Phase != corev1.VolumeReleased {
		why = append(why, fmt.Sprintf("phase %q before the rebind, not Released", r.Phase))
	}
	if _, gone := b.deleted[r.From.UID]; !gone {
		why = append(why, "the claim it was released from was never deleted")
	}
	if t, ok := j.First(r.Volume); ok && t.Before(r.At) {
		why = append(why, fmt.Sprintf("a reclaim of it was journaled %s before", r.At.Sub(t).Round(1e6)))
	}
	if m, ok := b.markers[r.From.UID]; ok && m.volume == r.Volume {
		if _, err := os.Stat(m.path); err != nil {
			why = append(why, "the data of the claim it was released from is gone (its marker)")
		}
	}
	return why
}
