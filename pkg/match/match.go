package match

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagehelpers "k8s.io/component-helpers/storage/volume"
)

// ClaimClass is the class a claim asks for: the beta annotation wins over
// spec.storageClassName (component-helpers' GetPersistentVolumeClaimClass,
// as Kubernetes' PV controller).
func ClaimClass(c *corev1.PersistentVolumeClaim) string {
	return storagehelpers.GetPersistentVolumeClaimClass(c)
}

// ClaimHasClass reports whether the claim names a class at all (possibly "").
func ClaimHasClass(c *corev1.PersistentVolumeClaim) bool {
	return storagehelpers.PersistentVolumeClaimHasClass(c)
}

// VolumeClass is the class of a volume: the beta annotation wins over
// spec.storageClassName.
func VolumeClass(v *corev1.PersistentVolume) string {
	return storagehelpers.GetPersistentVolumeClass(v)
}

// BoundToClaim reports whether the volume's claimRef points to the claim:
// same namespace and name, and a UID that is empty or the claim's.
func BoundToClaim(v *corev1.PersistentVolume, c *corev1.PersistentVolumeClaim) bool {
	return storagehelpers.IsVolumeBoundToClaim(v, c)
}

// VolumeModeMismatch reports whether claim and volume ask for different
// volume modes (unset means Filesystem).
func VolumeModeMismatch(c *corev1.PersistentVolumeClaim, v *corev1.PersistentVolume) bool {
	return storagehelpers.CheckVolumeModeMismatches(&c.Spec, &v.Spec)
}

// ContainsAllModes reports whether have includes every mode in want: the
// index's test of a group of access modes (ModesKey) against a claim. A
// volume against a claim is component-helpers' CheckAccessModes.
func ContainsAllModes(have, want []corev1.PersistentVolumeAccessMode) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// requested is the claim's storage request in bytes.
func requested(c *corev1.PersistentVolumeClaim) int64 {
	q := c.Spec.Resources.Requests[corev1.ResourceStorage]
	return q.Value()
}

// Capacity is the volume's capacity in bytes.
func Capacity(v *corev1.PersistentVolume) int64 {
	q := v.Spec.Capacity[corev1.ResourceStorage]
	return q.Value()
}

func attributesClass(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// Satisfies checks that a volume the user asked for by name can serve the
// claim. The error says what does not fit, in Kubernetes' words.
func Satisfies(v *corev1.PersistentVolume, c *corev1.PersistentVolumeClaim) error {
	if v.DeletionTimestamp != nil {
		return fmt.Errorf("the volume is marked for deletion %q", v.Name)
	}
	if Capacity(v) < requested(c) {
		return errors.New("requested PV is too small")
	}
	if VolumeClass(v) != ClaimClass(c) {
		return errors.New("storageClassName does not match")
	}
	if attributesClass(v.Spec.VolumeAttributesClassName) != attributesClass(c.Spec.VolumeAttributesClassName) {
		return errors.New("volumeAttributesClassName does not match")
	}
	if VolumeModeMismatch(c, v) {
		return errors.New("incompatible volumeMode")
	}
	if !ContainsAllModes(v.Spec.AccessModes, c.Spec.AccessModes) {
		return errors.New("incompatible accessMode")
	}
	return nil
}

// Finder chooses the best volume for claims. Skip, when set, hides volumes
// (e.g. those reserved for other claims): they break RuleReserved.
type Finder struct {
	Skip func(v *corev1.PersistentVolume) bool
}

// Best returns the best volume among candidates for the claim, or nil when
// none fits: of the volumes that break no rule (Fit.Check), the first in
// the binder's order of preference (Fit.Before). delayBinding says the
// claim's class is WaitForFirstConsumer and no node is known yet.
// candidates must hold every volume that could fit: at least the volumes of
// the claim's class without a claimRef, and the volumes whose claimRef
// points to the claim.
func (f Finder) Best(c *corev1.PersistentVolumeClaim, candidates []*corev1.PersistentVolume, delayBinding bool) (*corev1.PersistentVolume, error) {
	fit, err := NewFit(c)
	if err != nil {
		return nil, err
	}
	var best *corev1.PersistentVolume
	for _, v := range candidates {
		if fit.Check(v, delayBinding, f.Skip != nil && f.Skip(v)) != RuleNone {
			continue
		}
		if best == nil || fit.Before(v, best) {
			best = v
		}
	}
	return best, nil
}

// modesKey is a canonical name for a set of access modes.
func modesKey(modes []corev1.PersistentVolumeAccessMode) string {
	s := make([]string, 0, len(modes))
	for _, m := range modes {
		s = append(s, string(m))
	}
	sort.Strings(s)
	// Duplicates do not change the set.
	out := s[:0]
	for i, m := range s {
		if i == 0 || m != s[i-1] {
			out = append(out, m)
		}
	}
	return strings.Join(out, ",")
}
