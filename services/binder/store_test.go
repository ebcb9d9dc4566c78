package binder

import (
	"fmt"
	"math/rand/v2"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/match"
)

// The store's index hands Best only each access-mode group's first fitting
// volume; the answer must be the one Best gives over every volume.
func TestIndexedFindAgreesWithBestOverEverything(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	modes := [][]corev1.PersistentVolumeAccessMode{
		{corev1.ReadWriteOnce},
		{corev1.ReadWriteOnce, corev1.ReadOnlyMany},
		{corev1.ReadWriteMany},
		{corev1.ReadWriteOnce, corev1.ReadWriteMany},
		{corev1.ReadWriteOncePod},
	}
	classes := []string{"", "a", "b"}
	phases := []corev1.PersistentVolumePhase{corev1.VolumeAvailable, corev1.VolumeAvailable, corev1.VolumeAvailable, corev1.VolumePending, corev1.VolumeReleased}
	block := corev1.PersistentVolumeBlock
	for round := range 30 {
		s := newStore()
		var all []*corev1.PersistentVolume
		for i := range 200 {
			v := &corev1.PersistentVolume{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pv-%03d", r.IntN(400)), UID: types.UID(fmt.Sprint(i)),
					Labels: map[string]string{"tier": []string{"gold", "silver"}[r.IntN(2)]}},
				Spec: corev1.PersistentVolumeSpec{
					Capacity:         corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(int64(1+r.IntN(8))<<30, resource.BinarySI)},
					AccessModes:      modes[r.IntN(len(modes))],
					StorageClassName: classes[r.IntN(len(classes))],
				},
				Status: corev1.PersistentVolumeStatus{Phase: phases[r.IntN(len(phases))]},
			}
			if r.IntN(10) == 0 {
				v.Spec.VolumeMode = &block
			}
			if r.IntN(15) == 0 {
				v.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "ns", Name: fmt.Sprintf("c%d", r.IntN(20))}
			}
			s.putVolume(v)
		}
		for _, v := range s.volumes {
			all = append(all, v)
		}
		for i := range 20 {
			cls := classes[r.IntN(len(classes))]
			c := &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("c%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes:      modes[r.IntN(len(modes))][:1],
					StorageClassName: &cls,
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(int64(1+r.IntN(8))<<30, resource.BinarySI)}},
				},
			}
			if r.IntN(4) == 0 {
				c.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}
			}
			if r.IntN(10) == 0 {
				c.Spec.VolumeMode = &block
			}
			delay := r.IntN(5) == 0
			want, err := match.Finder{}.Best(c, all, delay)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.findAndReserve(c, delay)
			if err != nil {
				t.Fatal(err)
			}
			if got != nil {
				s.unreserve(got.Name, c.UID)
			}
			if name(got) != name(want) {
				t.Fatalf("round %d claim %s (class %q, modes %v, %s, selector %v, delay %v): index chose %s, Best over all chose %s",
					round, c.Name, cls, c.Spec.AccessModes, c.Spec.Resources.Requests.Storage(), c.Spec.Selector, delay, name(got), name(want))
			}
		}
	}
}

func name(v *corev1.PersistentVolume) string {
	if v == nil {
		return "<none>"
	}
	return v.Name
}
