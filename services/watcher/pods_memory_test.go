package watcher

import (
	"fmt"
	"log/slog"
	"runtime"
	"testing"

	"github.com/volplane/volplane/test/harness/memstat"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// fullPod is a pod as a StatefulSet makes it, with what the API server and
// the kubelet add: the transform sees kilobytes per pod.
func fullPod(i int, scheduled bool) *corev1.Pod {
	name := fmt.Sprintf("web-%d", i)
	ns := fmt.Sprintf("team-%d", i%500)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, UID: types.UID(fmt.Sprintf("0b7c1a2e-5f3d-4c1b-9a8e-%012d", i)),
			ResourceVersion: fmt.Sprint(1000 + i),
			Labels:          map[string]string{"app": "web", "controller-revision-hash": "web-7d9f8c6b5", "statefulset.kubernetes.io/pod-name": name},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "web", UID: "f00"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate, FieldsV1: metav1.NewFieldsV1(string(make([]byte, 1500)))}},
		},
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{
				{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data-" + name}}},
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web-config"}}}},
				{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}},
			},
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example.com/web:1.2.3",
				Env:          []corev1.EnvVar{{Name: "MODE", Value: "production"}, {Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				Resources:    corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}, {Name: "config", MountPath: "/etc/web"}},
			}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodPending,
			Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable"}},
		},
	}
	if scheduled {
		p.Spec.NodeName = fmt.Sprintf("node-%d", i%1000)
		p.Status.Phase = corev1.PodRunning
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, ImageID: "registry.example.com/web@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}}
	}
	return p
}

// BenchmarkPodMemory100k measures what 100,000 pods that use claims cost
// the watcher once listed: the pod informer's cache of views (an indexer
// without indexes, as the informer keeps it) and the hub's state and
// history (history 100,000, the default). It reports the heap they hold,
// in MB and bytes per pod. Run it once:
//
//	go test -run '^$' -bench PodMemory100k -benchtime 1x ./services/watcher/
func BenchmarkPodMemory100k(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		before := memstat.HeapInUse()
		store := cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{})
		h := newHub(DefaultHistorySize)
		add := handler(h, kindPod, slog.New(slog.DiscardHandler)).OnAdd
		for i := range n {
			v, err := slimPod(fullPod(i, i%10 != 0)) // one pod in ten waits for the scheduler
			if err != nil {
				b.Fatal(err)
			}
			if err := store.Add(v); err != nil {
				b.Fatal(err)
			}
			add(v, true)
		}
		after := memstat.HeapInUse()
		if _, _, _, pods := h.counts(); pods != n || len(store.ListKeys()) != n {
			b.Fatalf("%d pods in the hub, %d in the store", pods, len(store.ListKeys()))
		}
		b.ReportMetric(float64(after-before)/1e6, "MB")
		b.ReportMetric(float64(after-before)/n, "bytes/pod")
		runtime.KeepAlive(store)
		runtime.KeepAlive(h)
	}
}
