package reclaimer

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/guard"
)

// cluster is what the reclaimer needs of the Kubernetes API. Every read
// goes to the API server, never to a cache: the reclaimer reads right
// before it destroys data, and a cache that is behind would let it scrub a
// volume a new claim already uses.
type cluster interface {
	guard.Claims
	GetVolume(ctx context.Context, name string) (*corev1.PersistentVolume, error)
	UpdateVolume(ctx context.Context, v *corev1.PersistentVolume) (*corev1.PersistentVolume, error)
	UpdateVolumeStatus(ctx context.Context, v *corev1.PersistentVolume) (*corev1.PersistentVolume, error)
	// DeleteVolume deletes the volume if it still has uid.
	DeleteVolume(ctx context.Context, name string, uid types.UID) error
	ListPods(ctx context.Context, namespace string) ([]corev1.Pod, error)
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	CreatePod(ctx context.Context, p *corev1.Pod) (*corev1.Pod, error)
	// DeletePod deletes the pod if it still has uid.
	DeletePod(ctx context.Context, namespace, name string, uid types.UID) error
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
}

// kubeCluster is cluster over a client-go clientset. claims, when set, is
// an informer's index of claims by spec.volumeName (guard.ByVolumeName):
// ClaimsNaming asks it which claims to read, through guard.APIClaims, the
// one implementation the provisioner shares. synced, when set, says
// whether the index holds every claim yet; until it does, ClaimsNaming
// lists the claims from the API server instead.
type kubeCluster struct {
	c      kubernetes.Interface
	claims cache.Indexer
	synced func() bool
}

// byVolumeName indexes claims by the volume they ask for.
const byVolumeName = guard.ByVolumeName

var indexByVolumeName = guard.IndexByVolumeName

var _ cluster = kubeCluster{}

// listPage bounds the size of one list response.
const listPage = 500

func (k kubeCluster) GetVolume(ctx context.Context, name string) (*corev1.PersistentVolume, error) {
	return k.c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
}

func (k kubeCluster) UpdateVolume(ctx context.Context, v *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	return k.c.CoreV1().PersistentVolumes().Update(ctx, v, metav1.UpdateOptions{})
}

func (k kubeCluster) UpdateVolumeStatus(ctx context.Context, v *corev1.PersistentVolume) (*corev1.PersistentVolume, error) {
	return k.c.CoreV1().PersistentVolumes().UpdateStatus(ctx, v, metav1.UpdateOptions{})
}

func (k kubeCluster) DeleteVolume(ctx context.Context, name string, uid types.UID) error {
	return k.c.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
}

func (k kubeCluster) GetClaim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	return guard.APIClaims{Client: k.c}.GetClaim(ctx, namespace, name)
}

func (k kubeCluster) ClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error) {
	idx := k.claims
	if k.synced != nil && !k.synced() {
		idx = nil // an index still filling would miss claims
	}
	return guard.APIClaims{Client: k.c, Index: idx}.ClaimsNaming(ctx, volume)
}

func (k kubeCluster) ListPods(ctx context.Context, namespace string) ([]corev1.Pod, error) {
	var out []corev1.Pod
	opts := metav1.ListOptions{Limit: listPage}
	for {
		list, err := k.c.CoreV1().Pods(namespace).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, list.Items...)
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}

func (k kubeCluster) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	return k.c.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (k kubeCluster) CreatePod(ctx context.Context, p *corev1.Pod) (*corev1.Pod, error) {
	return k.c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
}

func (k kubeCluster) DeletePod(ctx context.Context, namespace, name string, uid types.UID) error {
	return k.c.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
}

func (k kubeCluster) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return k.c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}
