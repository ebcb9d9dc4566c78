package match

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	storagehelpers "k8s.io/component-helpers/storage/volume"
)

// Rule is one check a volume must pass before a claim is bound to it. Check
// applies them in the order they are declared and names the first one a
// volume breaks; RuleNone means it breaks none.
type Rule int

// The rules, in the order Check applies them.
const (
	// RuleNone: the volume can be bound to the claim now.
	RuleNone Rule = iota
	// RuleStorageClass: the volume's class is not the claim's (a volume
	// pre-bound to the claim is exempt).
	RuleStorageClass
	// RuleVolumeAttributesClass: the volumes attributes classes differ.
	RuleVolumeAttributesClass
	// RuleVolumeMode: Filesystem against Block.
	RuleVolumeMode
	// RuleAccessModes: the volume lacks one of the claim's access modes.
	RuleAccessModes
	// RuleCapacity: the volume is smaller than the claim's request.
	RuleCapacity
	// RuleSelector: the volume's labels do not match the claim's selector
	// (a volume pre-bound to the claim is exempt).
	RuleSelector
	// RuleNodeAffinity: the volume's node affinity excludes the claim's
	// selected node. Only evaluated when a node is given (WithNode) and
	// binding is delayed: the scheduler's check, which never changes what
	// the binder binds (see WithNode).
	RuleNodeAffinity
	// RuleBoundElsewhere: the volume's claimRef names another claim (or an
	// earlier claim of the same name: another UID).
	RuleBoundElsewhere
	// RuleReserved: the binder holds the volume for another claim now.
	RuleReserved
	// RuleDeleting: the volume is being deleted.
	RuleDeleting
	// RuleNotAvailable: the volume's phase is not Available.
	RuleNotAvailable
	// RuleDelayBinding: the claim's class is WaitForFirstConsumer, and
	// without a node the binder binds only a volume pre-bound to the claim.
	RuleDelayBinding
)

var ruleNames = [...]string{"None", "StorageClass", "VolumeAttributesClass", "VolumeMode", "AccessModes", "Capacity",
	"Selector", "NodeAffinity", "BoundElsewhere", "Reserved", "Deleting", "NotAvailable", "DelayBinding"}

func (r Rule) String() string {
	if r < 0 || int(r) >= len(ruleNames) {
		return fmt.Sprintf("Rule(%d)", int(r))
	}
	return ruleNames[r]
}

// WithNode makes Check evaluate RuleNodeAffinity against a node with these
// labels (the claim's selected node) for the volumes the binder leaves to
// the scheduler: those not pre-bound to the claim while binding is
// delayed. Those volumes break RuleDelayBinding anyway, so the node changes
// which rule is reported for them, never whether a volume fits: Best and
// the binder give no node, as Kubernetes' PV controller gives none.
func (f *Fit) WithNode(name string, nodeLabels map[string]string) *Fit {
	g := *f
	g.node, g.nodeLabels = name, nodeLabels
	if g.nodeLabels == nil {
		g.nodeLabels = map[string]string{}
	}
	return &g
}

// Check returns the first rule v breaks for the claim, RuleNone when the
// claim can be bound to v now. delayBinding says the claim's class is
// WaitForFirstConsumer and no node is known; reserved says the binder holds
// v for another claim. A volume whose claimRef points to the claim
// (pre-bound) needs only the volume mode, access modes, capacity and
// attributes class, and no deletion pending; any other volume also needs the
// claim's class and selector, no claimRef, and phase Available, and none
// fits while binding is delayed. These are the rules of Kubernetes' PV
// controller (FindMatchingVolume without a node).
func (f *Fit) Check(v *corev1.PersistentVolume, delayBinding, reserved bool) Rule {
	prebound := BoundToClaim(v, f.claim)
	switch {
	case !prebound && VolumeClass(v) != f.class:
		return RuleStorageClass
	case attributesClass(v.Spec.VolumeAttributesClassName) != f.vac:
		return RuleVolumeAttributesClass
	case VolumeModeMismatch(f.claim, v):
		return RuleVolumeMode
	case !storagehelpers.CheckAccessModes(f.claim, v):
		return RuleAccessModes
	case Capacity(v) < f.want:
		return RuleCapacity
	case !prebound && f.selector != nil && !f.selector.Matches(labels.Set(v.Labels)):
		return RuleSelector
	case !prebound && delayBinding && f.nodeLabels != nil && storagehelpers.CheckNodeAffinity(v, f.nodeLabels) != nil:
		return RuleNodeAffinity
	case v.Spec.ClaimRef != nil && !prebound:
		return RuleBoundElsewhere
	case reserved:
		return RuleReserved
	case v.DeletionTimestamp != nil:
		return RuleDeleting
	case prebound:
		return RuleNone
	case v.Status.Phase != corev1.VolumeAvailable:
		return RuleNotAvailable
	case delayBinding:
		return RuleDelayBinding
	}
	return RuleNone
}

// Before reports whether the binder prefers volume a to volume b for the
// claim, when both fit: the group of access modes with fewer modes first
// (GroupLess), within a group a volume whose claimRef names the claim first
// (by name), then the smallest capacity, then the name. Best returns the
// fitting volume that comes first in this order; an index that visits
// volumes in this order can stop at the first that fits.
func (f *Fit) Before(a, b *corev1.PersistentVolume) bool {
	if ka, kb := ModesKey(a.Spec.AccessModes), ModesKey(b.Spec.AccessModes); ka != kb {
		return GroupLess(ka, kb)
	}
	ra, rb := a.Spec.ClaimRef != nil, b.Spec.ClaimRef != nil
	if ra != rb {
		return ra
	}
	if !ra {
		if sa, sb := Capacity(a), Capacity(b); sa != sb {
			return sa < sb
		}
	}
	return a.Name < b.Name
}

// GroupLess orders groups of access modes (ModesKey): fewer modes first,
// then by name. The claim gets a volume of the first group that has one.
func GroupLess(a, b string) bool {
	na, nb := strings.Count(a, ",")+1, strings.Count(b, ",")+1
	if na != nb {
		return na < nb
	}
	return a < b
}

// Why says, in a sentence for a person, why v breaks rule r for the claim
// (or, for RuleNone, how it fits). RuleReserved is said by whoever holds
// the reservation; here it is only named.
func (f *Fit) Why(v *corev1.PersistentVolume, r Rule) string {
	c := f.claim
	switch r {
	case RuleNone:
		if BoundToClaim(v, c) {
			return "pre-bound to this claim (its claimRef names the claim)"
		}
		return "fits"
	case RuleStorageClass:
		return fmt.Sprintf("storage class %q, the claim asks for %q", VolumeClass(v), f.class)
	case RuleVolumeAttributesClass:
		return fmt.Sprintf("volume attributes class %q, the claim asks for %q", attributesClass(v.Spec.VolumeAttributesClassName), f.vac)
	case RuleVolumeMode:
		return fmt.Sprintf("volume mode %s, the claim asks for %s", volumeMode(v.Spec.VolumeMode), volumeMode(c.Spec.VolumeMode))
	case RuleAccessModes:
		var missing []string
		for _, m := range c.Spec.AccessModes {
			if !ContainsAllModes(v.Spec.AccessModes, []corev1.PersistentVolumeAccessMode{m}) {
				missing = append(missing, string(m))
			}
		}
		return fmt.Sprintf("access modes [%s] lack %s", ModesKey(v.Spec.AccessModes), strings.Join(missing, ", "))
	case RuleCapacity:
		have, want := v.Spec.Capacity[corev1.ResourceStorage], c.Spec.Resources.Requests[corev1.ResourceStorage]
		return fmt.Sprintf("capacity %s is less than the %s requested", have.String(), want.String())
	case RuleSelector:
		return fmt.Sprintf("labels {%s} do not match the claim's selector %s", labelString(v.Labels), f.selector.String())
	case RuleNodeAffinity:
		err := storagehelpers.CheckNodeAffinity(v, f.nodeLabels)
		return fmt.Sprintf("node affinity excludes the selected node %q: %v", f.node, err)
	case RuleBoundElsewhere:
		r := v.Spec.ClaimRef
		if r.Namespace == c.Namespace && r.Name == c.Name {
			return fmt.Sprintf("claimRef names an earlier claim %s/%s (UID %s, this claim's is %s)", r.Namespace, r.Name, r.UID, c.UID)
		}
		return fmt.Sprintf("bound to claim %s/%s", r.Namespace, r.Name)
	case RuleReserved:
		return "reserved for another claim"
	case RuleDeleting:
		return "being deleted"
	case RuleNotAvailable:
		p := string(v.Status.Phase)
		if p == "" {
			p = "not set yet"
		}
		return fmt.Sprintf("phase %s, not Available", p)
	case RuleDelayBinding:
		return "the class binds WaitForFirstConsumer: until a pod using the claim is scheduled, only a volume pre-bound to the claim is bound; the scheduler binds free volumes"
	}
	return r.String()
}

func volumeMode(m *corev1.PersistentVolumeMode) string {
	if m == nil {
		return string(corev1.PersistentVolumeFilesystem)
	}
	return string(*m)
}

func labelString(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + l[k]
	}
	return strings.Join(parts, ",")
}
