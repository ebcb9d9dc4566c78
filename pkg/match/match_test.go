package match

import (
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
