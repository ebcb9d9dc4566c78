package reclaimer

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// cluster is what the reclaimer needs of the Kubernetes API. Every read
// goes to the API server, never to a cache: the reclaimer reads right
// before it destroys data, and a cache that is behind would let it scrub a
// volume a new claim already uses.
type cluster interface {
	GetVolume(ctx context.Context, name string) (*corev1.PersistentVolume, error)
	UpdateVolume(ctx context.Context, v *corev1.PersistentVolume) (*corev1.PersistentVolume, error)
	UpdateVolumeStatus(ctx context.Context, v *corev1.PersistentVolume) (*corev1.PersistentVolume, error)
	// DeleteVolume deletes the volume if it still has uid.
	DeleteVolume(ctx context.Context, name string, uid types.UID) error
	GetClaim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error)
	// ClaimsNaming returns the claims whose spec.volumeName is volume, each
	// as the API server has it now.
	ClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error)
	ListPods(ctx context.Context, namespace string) ([]corev1.Pod, error)
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	CreatePod(ctx context.Context, p *corev1.Pod) (*corev1.Pod, error)
	// DeletePod deletes the pod if it still has uid.
	DeletePod(ctx context.Context, namespace, name string, uid types.UID) error
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
}

// kubeCluster is cluster over a client-go clientset. claims, when set, is
// an informer's index of claims by spec.volumeName: ClaimsNaming asks it
// which claims to read instead of listing every claim in the cluster
// before each destructive step (a mass deletion of N volumes would
// otherwise read N² claims).
type kubeCluster struct {
	c      kubernetes.Interface
	claims cache.Indexer
}

// byVolumeName indexes claims by the volume they ask for.
const byVolumeName = "spec.volumeName"

func indexByVolumeName(obj any) ([]string, error) {
	if c, ok := obj.(*corev1.PersistentVolumeClaim); ok && c.Spec.VolumeName != "" {
		return []string{c.Spec.VolumeName}, nil
	}
	return nil, nil
}

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
	return k.c.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (k kubeCluster) ClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error) {
	if k.claims == nil {
		return k.listClaimsNaming(ctx, volume)
	}
	objs, err := k.claims.ByIndex(byVolumeName, volume)
	if err != nil {
		return nil, err
	}
	var out []corev1.PersistentVolumeClaim
	for _, o := range objs {
		cached := o.(*corev1.PersistentVolumeClaim)
		// The index only says where to look: the claim is read again.
		c, err := k.GetClaim(ctx, cached.Namespace, cached.Name)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, err
		case c.Spec.VolumeName == volume:
			out = append(out, *c)
		}
	}
	return out, nil
}

// listClaimsNaming reads every claim in the cluster, for a kubeCluster
// without an index.
func (k kubeCluster) listClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error) {
	var out []corev1.PersistentVolumeClaim
	opts := metav1.ListOptions{Limit: listPage}
	for {
		list, err := k.c.CoreV1().PersistentVolumeClaims("").List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for _, c := range list.Items {
			if c.Spec.VolumeName == volume {
				out = append(out, c)
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
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
