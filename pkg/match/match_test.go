package match

import (
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	rwo = corev1.ReadWriteOnce
	rox = corev1.ReadOnlyMany
	rwx = corev1.ReadWriteMany
)

type pvOpt func(*corev1.PersistentVolume)

func pv(name, size string, opts ...pvOpt) *corev1.PersistentVolume {
	v := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:         corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:      []corev1.PersistentVolumeAccessMode{rwo},
			StorageClassName: "fast",
		},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeAvailable},
	}
	for _, o := range opts {
		o(v)
	}
	return v
}

func modes(m ...corev1.PersistentVolumeAccessMode) pvOpt {
	return func(v *corev1.PersistentVolume) { v.Spec.AccessModes = m }
}
func class(c string) pvOpt { return func(v *corev1.PersistentVolume) { v.Spec.StorageClassName = c } }
func phase(p corev1.PersistentVolumePhase) pvOpt {
	return func(v *corev1.PersistentVolume) { v.Status.Phase = p }
}
func labelled(k, val string) pvOpt {
	return func(v *corev1.PersistentVolume) { v.Labels = map[string]string{k: val} }
}
func block() pvOpt {
	return func(v *corev1.PersistentVolume) { m := corev1.PersistentVolumeBlock; v.Spec.VolumeMode = &m }
}
func deleting() pvOpt {
	return func(v *corev1.PersistentVolume) { now := metav1.NewTime(time.Now()); v.DeletionTimestamp = &now }
}
func claimRef(ns, name string, uid types.UID) pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: ns, Name: name, UID: uid}
	}
}

func pvc(size string, m ...corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
	cls := "fast"
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "claim", UID: "uid-1"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      m,
			StorageClassName: &cls,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			},
		},
	}
}

func TestBest(t *testing.T) {
	withSelector := pvc("1Gi", rwo)
	withSelector.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
	blockClaim := pvc("1Gi", rwo)
	bm := corev1.PersistentVolumeBlock
	blockClaim.Spec.VolumeMode = &bm

	tests := []struct {
		name    string
		claim   *corev1.PersistentVolumeClaim
		vols    []*corev1.PersistentVolume
		delay   bool
		want    string
		skipped string
	}{
		{"smallest that fits", pvc("1Gi", rwo), []*corev1.PersistentVolume{pv("a", "10Gi"), pv("b", "2Gi"), pv("c", "500Mi")}, false, "b", ""},
		{"none big enough", pvc("5Gi", rwo), []*corev1.PersistentVolume{pv("a", "1Gi")}, false, "", ""},
		{"other class ignored", pvc("1Gi", rwo), []*corev1.PersistentVolume{pv("a", "1Gi", class("slow"))}, false, "", ""},
		{"not Available ignored", pvc("1Gi", rwo), []*corev1.PersistentVolume{pv("a", "1Gi", phase(corev1.VolumeReleased))}, false, "", ""},
		{"claimed by another ignored", pvc("1Gi", rwo), []*corev1.PersistentVolume{pv("a", "1Gi", claimRef("ns", "other", "x"))}, false, "", ""},
		{"being deleted ignored", pvc("1Gi", rwo), []*corev1.PersistentVolume{pv("a", "1Gi", deleting())}, false, "", ""},
		{"volume mode must match", blockClaim, []*corev1.PersistentVolume{pv("a", "1Gi"), pv("b", "5Gi", block())}, false, "b", ""},
		{"selector", withSelector, []*corev1.PersistentVolume{pv("a", "1Gi"), pv("b", "5Gi", labelled("tier", "gold"))}, false, "b", ""},
		{"access modes must include the claim's", pvc("1Gi", rwx), []*corev1.PersistentVolume{pv("a", "1Gi"), pv("b", "9Gi", modes(rwo, rwx))}, false, "b", ""},
		{"smallest superset of modes beats smaller capacity", pvc("1Gi", rwo),
			[]*corev1.PersistentVolume{pv("a", "1Gi", modes(rwo, rox, rwx)), pv("b", "9Gi", modes(rwo))}, false, "b", ""},
		{"pre-bound wins over smaller", pvc("1Gi", rwo),
			[]*corev1.PersistentVolume{pv("a", "1Gi"), pv("b", "9Gi", claimRef("ns", "claim", ""), phase(corev1.VolumeAvailable))}, false, "b", ""},
		{"pre-bound with UID wins", pvc("1Gi", rwo),
			[]*corev1.PersistentVolume{pv("a", "1Gi"), pv("b", "9Gi", claimRef("ns", "claim", "uid-1"), phase(corev1.VolumeBound))}, false, "b", ""},
		{"pre-bound to an older claim of that name ignored", pvc("1Gi", rwo),
			[]*corev1.PersistentVolume{pv("b", "9Gi", claimRef("ns", "claim", "uid-0"))}, false, "", ""},
		{"wait for first consumer binds only pre-bound", pvc("1Gi", rwo), []*corev1.PersistentVolume{pv("a", "1Gi")}, true, "", ""},
		{"wait for first consumer takes pre-bound", pvc("1Gi", rwo),
			[]*corev1.PersistentVolume{pv("a", "1Gi"), pv("b", "2Gi", claimRef("ns", "claim", ""))}, true, "b", ""},
		{"skip hides a reserved volume", pvc("1Gi", rwo), []*corev1.PersistentVolume{pv("a", "1Gi"), pv("b", "2Gi")}, false, "b", "a"},
		{"ties broken by name", pvc("1Gi", rwo), []*corev1.PersistentVolume{pv("z", "1Gi"), pv("m", "1Gi")}, false, "m", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Finder{Skip: func(v *corev1.PersistentVolume) bool { return v.Name == tt.skipped }}
			got, err := f.Best(tt.claim, tt.vols, tt.delay)
			if err != nil {
				t.Fatal(err)
			}
			name := ""
			if got != nil {
				name = got.Name
			}
			if name != tt.want {
				t.Fatalf("Best = %q, want %q", name, tt.want)
			}
		})
	}
}

func TestSatisfies(t *testing.T) {
	tests := []struct {
		name  string
		vol   *corev1.PersistentVolume
		claim *corev1.PersistentVolumeClaim
		want  string
	}{
		{"fits", pv("a", "1Gi"), pvc("1Gi", rwo), ""},
		{"too small", pv("a", "1Gi"), pvc("2Gi", rwo), "requested PV is too small"},
		{"class", pv("a", "1Gi", class("slow")), pvc("1Gi", rwo), "storageClassName does not match"},
		{"mode", pv("a", "1Gi", block()), pvc("1Gi", rwo), "incompatible volumeMode"},
		{"access", pv("a", "1Gi"), pvc("1Gi", rwx), "incompatible accessMode"},
		{"deleting", pv("a", "1Gi", deleting()), pvc("1Gi", rwo), `the volume is marked for deletion "a"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Satisfies(tt.vol, tt.claim)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Fatalf("Satisfies = %q, want %q", got, tt.want)
			}
		})
	}
}

func vac(name string) pvOpt {
	return func(v *corev1.PersistentVolume) { v.Spec.VolumeAttributesClassName = &name }
}

func nodeAffinity(key, val string) pvOpt {
	return func(v *corev1.PersistentVolume) {
		v.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{val}}},
		}}}}
	}
}

// Check names the first rule a volume breaks, in the declared order; a
// volume pre-bound to the claim is exempt from class, selector, phase and
// delayed binding, as in Kubernetes' FindMatchingVolume.
func TestCheckNamesTheFirstRuleBroken(t *testing.T) {
	sel := pvc("1Gi", rwo)
	sel.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
	tests := []struct {
		name     string
		claim    *corev1.PersistentVolumeClaim
		vol      *corev1.PersistentVolume
		delay    bool
		reserved bool
		node     map[string]string
		want     Rule
		why      string
	}{
		{name: "fits", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi"), want: RuleNone, why: "fits"},
		{name: "class before everything", claim: pvc("5Gi", rwx), vol: pv("a", "1Gi", class("slow"), block()), want: RuleStorageClass, why: `storage class "slow", the claim asks for "fast"`},
		{name: "attributes class", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", vac("gold")), want: RuleVolumeAttributesClass},
		{name: "attributes class of a pre-bound volume", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", vac("gold"), claimRef("ns", "claim", "")), want: RuleVolumeAttributesClass},
		{name: "volume mode", claim: pvc("5Gi", rwx), vol: pv("a", "1Gi", block()), want: RuleVolumeMode, why: "volume mode Block, the claim asks for Filesystem"},
		{name: "access modes", claim: pvc("5Gi", rwx, rwo), vol: pv("a", "1Gi"), want: RuleAccessModes, why: "access modes [ReadWriteOnce] lack ReadWriteMany"},
		{name: "capacity", claim: pvc("5Gi", rwo), vol: pv("a", "1Gi", phase(corev1.VolumeReleased)), want: RuleCapacity, why: "capacity 1Gi is less than the 5Gi requested"},
		{name: "selector", claim: sel, vol: pv("a", "1Gi", labelled("tier", "silver")), want: RuleSelector, why: "labels {tier=silver} do not match the claim's selector tier=gold"},
		{name: "selector does not bind a pre-bound volume", claim: sel, vol: pv("a", "1Gi", claimRef("ns", "claim", "")), want: RuleNone, why: "pre-bound to this claim (its claimRef names the claim)"},
		{name: "bound elsewhere", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", claimRef("ns", "other", "x")), want: RuleBoundElsewhere, why: "bound to claim ns/other"},
		{name: "earlier claim of the same name", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", claimRef("ns", "claim", "uid-0")), want: RuleBoundElsewhere},
		{name: "reserved", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi"), reserved: true, want: RuleReserved},
		{name: "reserved pre-bound", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", claimRef("ns", "claim", "")), reserved: true, want: RuleReserved},
		{name: "deleting", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", deleting(), phase(corev1.VolumeReleased)), want: RuleDeleting},
		{name: "not available", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", phase(corev1.VolumePending)), want: RuleNotAvailable, why: "phase Pending, not Available"},
		{name: "pre-bound need not be Available", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", claimRef("ns", "claim", "uid-1"), phase(corev1.VolumeBound)), want: RuleNone},
		{name: "delayed binding", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi"), delay: true, want: RuleDelayBinding},
		{name: "delayed binding takes pre-bound", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", claimRef("ns", "claim", "")), delay: true, want: RuleNone},
		{name: "node affinity, delayed", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", nodeAffinity("zone", "a")), delay: true, node: map[string]string{"zone": "b"}, want: RuleNodeAffinity},
		{name: "node affinity matching, delayed", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", nodeAffinity("zone", "a")), delay: true, node: map[string]string{"zone": "a"}, want: RuleDelayBinding},
		{name: "node affinity never rejects a pre-bound volume", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", nodeAffinity("zone", "a"), claimRef("ns", "claim", "")), delay: true, node: map[string]string{"zone": "b"}, want: RuleNone},
		{name: "node affinity not checked without delayed binding", claim: pvc("1Gi", rwo), vol: pv("a", "1Gi", nodeAffinity("zone", "a")), node: map[string]string{"zone": "b"}, want: RuleNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := NewFit(tt.claim)
			if err != nil {
				t.Fatal(err)
			}
			if tt.node != nil {
				f = f.WithNode("n1", tt.node)
			}
			got := f.Check(tt.vol, tt.delay, tt.reserved)
			if got != tt.want {
				t.Fatalf("Check = %v, want %v", got, tt.want)
			}
			if tt.why != "" && f.Why(tt.vol, got) != tt.why {
				t.Errorf("Why = %q, want %q", f.Why(tt.vol, got), tt.why)
			}
			if tt.node == nil {
				// Best agrees with Check on a single volume.
				best, _ := Finder{Skip: func(*corev1.PersistentVolume) bool { return tt.reserved }}.Best(tt.claim, []*corev1.PersistentVolume{tt.vol}, tt.delay)
				if (best != nil) != (got == RuleNone) {
					t.Errorf("Best chose %v, Check says %v", best, got)
				}
			}
		})
	}
}

// Best is the first volume, in Before's order, that Check lets through.
func TestBestIsTheFirstFitInOrder(t *testing.T) {
	claim := pvc("2Gi", rwo)
	vols := []*corev1.PersistentVolume{
		pv("big-rwo", "9Gi"), pv("small", "1Gi"), pv("fit-b", "3Gi"), pv("fit-a", "3Gi"),
		pv("rwo-rox", "2Gi", modes(rwo, rox)), pv("pre", "5Gi", modes(rwo, rox), claimRef("ns", "claim", "")),
	}
	f, _ := NewFit(claim)
	sorted := append([]*corev1.PersistentVolume(nil), vols...)
	sort.Slice(sorted, func(i, j int) bool { return f.Before(sorted[i], sorted[j]) })
	var order []string
	for _, v := range sorted {
		order = append(order, v.Name)
	}
	if got := strings.Join(order, " "); got != "small fit-a fit-b big-rwo pre rwo-rox" {
		t.Fatalf("order %s", got)
	}
	best, _ := Finder{}.Best(claim, vols, false)
	if best.Name != "fit-a" {
		t.Fatalf("Best = %s, want fit-a (smallest of the group with fewest modes, then name)", best.Name)
	}
	best, _ = Finder{}.Best(claim, vols, true)
	if best.Name != "pre" {
		t.Fatalf("delayed: Best = %s, want the pre-bound volume", best.Name)
	}
}
