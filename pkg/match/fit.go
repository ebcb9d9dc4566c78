package match

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Fit is a claim prepared for checking many free volumes quickly (its
// selector parsed once). Free applies exactly the checks Best applies to a
// volume without a claimRef, so an index may use it to pick, per group of
// access modes, the first fitting volume in (capacity, name) order and hand
// Best only those: Best's answer is the same as over every volume.
type Fit struct {
	claim    *corev1.PersistentVolumeClaim
	selector labels.Selector
	want     int64
	class    string
	vac      string
	// node and nodeLabels: the selected node, when WithNode gave one.
	node       string
	nodeLabels map[string]string
}

// NewFit prepares c.
func NewFit(c *corev1.PersistentVolumeClaim) (*Fit, error) {
	f := &Fit{claim: c, want: requested(c), class: ClaimClass(c), vac: attributesClass(c.Spec.VolumeAttributesClassName)}
	if c.Spec.Selector != nil {
		s, err := metav1.LabelSelectorAsSelector(c.Spec.Selector)
		if err != nil {
			return nil, fmt.Errorf("error creating internal label selector for claim: %s/%s: %w", c.Namespace, c.Name, err)
		}
		f.selector = s
	}
	return f, nil
}

// Requested is the claim's requested storage in bytes.
func (f *Fit) Requested() int64 { return f.want }

// Claim is the claim f checks volumes for.
func (f *Fit) Claim() *corev1.PersistentVolumeClaim { return f.claim }

// Free reports whether v, a volume without a claimRef, can be bound to the
// claim now (binding not delayed): Check finds no rule it breaks.
func (f *Fit) Free(v *corev1.PersistentVolume) bool {
	return v.Spec.ClaimRef == nil && f.Check(v, false, false) == RuleNone
}

// ModesKey names a volume's set of access modes: Best groups volumes by it.
func ModesKey(modes []corev1.PersistentVolumeAccessMode) string { return modesKey(modes) }
