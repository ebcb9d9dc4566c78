package replicas

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/coord"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
)

// shardCounts counts the claims of the whole cluster that the ring over
// members gives each member, and the volumes.
func shardCounts(t *testing.T, members ...string) (map[string]int, int, int) {
	t.Helper()
	claims, err := client.CoreV1().PersistentVolumeClaims("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	volumes, err := client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ring := coord.NewRing(members)
	by := map[string]int{}
	for _, c := range claims.Items {
		by[ring.Owner("pvc/"+c.Namespace+"/"+c.Name)]++
	}
	return by, len(claims.Items), len(volumes.Items)
}

func createClaims(t *testing.T, ns, prefix string, count int) {
	t.Helper()
	cls := ns
	for i := range count {
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-claim-%03d", prefix, i)},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: &cls,
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func createVolumes(t *testing.T, ns, prefix string, count int) {
	t.Helper()
	for i := range count {
		if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-pv-%03d", ns, prefix, i)},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              ns,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/x"}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// Two replicas each receive from the watcher, and cache, only the claims
// their ring gives them (every volume goes to both); together they bind
// every claim; API calls about a claim reach its owner through either.
// When one stops, the other lists the whole ring's claims and binds those
// that were the stopped replica's. No volume bound to a claim of the other
// shard is ever released meanwhile.
func TestReplicasHoldOnlyTheirShard(t *testing.T) {
	a := startBinder(t, "shard-a")
	b := startBinder(t, "shard-b")
	members := []string{a.id, b.id}
	eventually(t, 30*time.Second, func() string {
		if sa, sb := a.status(t), b.status(t); len(sa.Members) != 2 || len(sb.Members) != 2 {
			return fmt.Sprintf("members: a sees %v, b sees %v", sa.Members, sb.Members)
		}
		return ""
	})

	ns := newNamespace(t, "shard")
	const first = 120
	createPairs(t, ns, "first", first)
	allBound(t, ns, first)
	// Claims that wait for volumes, half of them b's.
	const waiting = 40
	createClaims(t, ns, "late", waiting)

	eventually(t, time.Minute, func() string {
		by, claims, volumes := shardCounts(t, members...)
		sa, sb := a.status(t), b.status(t)
		switch {
		case sa.Claims != int64(by[a.id]) || sb.Claims != int64(by[b.id]):
			return fmt.Sprintf("claims cached: a %d, b %d; their shards: a %d, b %d (of %d)", sa.Claims, sb.Claims, by[a.id], by[b.id], claims)
		case sa.Volumes != int64(volumes) || sb.Volumes != int64(volumes):
			return fmt.Sprintf("volumes cached: a %d, b %d, want all %d", sa.Volumes, sb.Volumes, volumes)
		}
		t.Logf("claims cached: %s %d, %s %d of %d; volumes %d each", a.id, sa.Claims, b.id, sb.Claims, claims, volumes)
		return ""
	})
	sa, sb := a.status(t), b.status(t)
	if sa.BindsTotal == 0 || sb.BindsTotal == 0 || sa.BindsTotal+sb.BindsTotal != first {
		t.Fatalf("binds a=%d b=%d: want both replicas to bind, %d in total", sa.BindsTotal, sb.BindsTotal, first)
	}
	ring := coord.NewRing(members)
	bsWaiting := 0
	for i := range waiting {
		name := fmt.Sprintf("late-claim-%03d", i)
		if ring.Owner("pvc/"+ns+"/"+name) == b.id {
			bsWaiting++
		}
		// Either replica answers for any claim: the owner's cache has it.
		for _, r := range []*replica{a, b} {
			got, err := r.client.GetClaim(context.Background(), &binderv1.GetClaimRequest{Namespace: ns, Name: name})
			if err != nil || got.GetClaim().GetName() != name {
				t.Fatalf("GetClaim %s via %s: %v %v", name, r.id, got, err)
			}
		}
	}
	if bsWaiting == 0 {
		t.Fatal("no waiting claim is b's: the takeover below would prove nothing")
	}

	// b stops: a takes the whole ring's claims, b's waiting ones included.
	b.stop()
	eventually(t, time.Minute, func() string {
		by, claims, _ := shardCounts(t, a.id)
		if st := a.status(t); len(st.Members) != 1 || st.Claims != int64(by[a.id]) {
			return fmt.Sprintf("a sees members %v and caches %d claims of %d", st.Members, st.Claims, claims)
		}
		return ""
	})
	createVolumes(t, ns, "late", waiting)
	allBound(t, ns, first+waiting)
	t.Logf("a bound the %d late claims, %d of them b's", waiting, bsWaiting)

	// No volume of this test was released by either replica.
	volumes, err := client.CoreV1().PersistentVolumes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range volumes.Items {
		if v.Spec.StorageClassName == ns && v.Status.Phase != corev1.VolumeBound {
			t.Fatalf("volume %s is %s", v.Name, v.Status.Phase)
		}
	}
}
