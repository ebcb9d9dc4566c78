package guard

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Refusal is a destructive step that the state of the volume or of its
// claims forbids.
type Refusal struct{ Reason string }

func (r *Refusal) Error() string { return r.Reason }

func refuse(format string, args ...any) error {
	return &Refusal{Reason: fmt.Sprintf(format, args...)}
}

// Claims is what the guard reads of claims. Both answers must come from the
// API server, not a cache: a cache that is behind would let a volume that
// a new claim already uses be destroyed.
type Claims interface {
	GetClaim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error)
	// ClaimsNaming returns the claims whose spec.volumeName is volume, each
	// as the API server has it now.
	ClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error)
}

// Volume checks what the volume alone says: it is Released or Failed, and
// its reclaim policy is one of policies. It reads nothing.
func Volume(v *corev1.PersistentVolume, policies ...corev1.PersistentVolumeReclaimPolicy) error {
	switch v.Status.Phase {
	case corev1.VolumeReleased, corev1.VolumeFailed:
	case "":
		return refuse("volume %q has no phase yet: only a Released or Failed volume's data may be destroyed", v.Name)
	default:
		return refuse("volume %q is %s: only a Released or Failed volume's data may be destroyed", v.Name, v.Status.Phase)
	}
	if !slices.Contains(policies, v.Spec.PersistentVolumeReclaimPolicy) {
		names := make([]string, len(policies))
		for i, p := range policies {
			names[i] = string(p)
		}
		return refuse("volume %q has reclaim policy %q, which does not ask for this: only %s does",
			v.Name, v.Spec.PersistentVolumeReclaimPolicy, strings.Join(names, " or "))
	}
	return nil
}

// LiveClaim reads the claims that could still use the volume and refuses
// while one points at it: the claim of its claimRef (by namespace and name)
// exists with the claimRef's UID, or the claimRef has no UID; or a claim
// not being deleted asks for the volume by spec.volumeName.
func LiveClaim(ctx context.Context, c Claims, v *corev1.PersistentVolume) error {
	if ref := v.Spec.ClaimRef; ref != nil && ref.Name != "" {
		claim, err := c.GetClaim(ctx, ref.Namespace, ref.Name)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("read claim %s/%s: %w", ref.Namespace, ref.Name, err)
		case ref.UID == "":
			return refuse("claim %s/%s (uid %s) exists and volume %q's claimRef names it without a UID: the volume is reserved for it", ref.Namespace, ref.Name, claim.UID, v.Name)
		case claim.UID == ref.UID:
			return refuse("claim %s/%s (uid %s) still exists: volume %q is not released", ref.Namespace, ref.Name, ref.UID, v.Name)
		}
	}
	claims, err := c.ClaimsNaming(ctx, v.Name)
	if err != nil {
		return fmt.Errorf("find claims asking for volume %s: %w", v.Name, err)
	}
	for _, cl := range claims {
		if cl.DeletionTimestamp == nil {
			return refuse("claim %s/%s (uid %s) asks for this volume, %q, by spec.volumeName", cl.Namespace, cl.Name, cl.UID, v.Name)
		}
	}
	return nil
}

// Released reads the claim of the volume's claimRef and refuses unless the
// volume is released as kube-controller-manager's isVolumeReleased has it:
// the claimRef names a claim by UID, and that claim is gone, was recreated
// with another UID, or is bound to another volume (its spec.volumeName
// names one). It is weaker than LiveClaim, which refuses while the
// claimRef's claim exists at all: it guards only steps that destroy no
// data and give the volume up, such as marking it Failed because nothing
// can delete or recycle it, which Kubernetes does for a volume released
// this way.
func Released(ctx context.Context, c Claims, v *corev1.PersistentVolume) error {
	ref := v.Spec.ClaimRef
	if ref == nil || ref.UID == "" {
		return refuse("volume %q has no claimRef with a UID: no claim was released", v.Name)
	}
	claim, err := c.GetClaim(ctx, ref.Namespace, ref.Name)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("read claim %s/%s: %w", ref.Namespace, ref.Name, err)
	case claim.UID != ref.UID:
		return nil
	case claim.Spec.VolumeName != "" && claim.Spec.VolumeName != v.Name:
		return nil
	}
	return refuse("claim %s/%s (uid %s) still exists and is not bound to another volume: volume %q is not released", ref.Namespace, ref.Name, ref.UID, v.Name)
}

// ByVolumeName is the name of an informer index of claims by
// spec.volumeName (IndexByVolumeName).
const ByVolumeName = "spec.volumeName"

// IndexByVolumeName indexes claims by the volume they ask for.
func IndexByVolumeName(obj any) ([]string, error) {
	if c, ok := obj.(*corev1.PersistentVolumeClaim); ok && c.Spec.VolumeName != "" {
		return []string{c.Spec.VolumeName}, nil
	}
	return nil, nil
}

// APIClaims is Claims over a clientset. Index, when set, is a claim
// informer's indexer with the ByVolumeName index: ClaimsNaming asks it
// which claims to read instead of listing every claim in the cluster (a
// mass deletion of N volumes would otherwise read N² claims). The index
// only says where to look; every claim it names is read from the API.
type APIClaims struct {
	Client kubernetes.Interface
	Index  cache.Indexer
}

var _ Claims = APIClaims{}

// listPage bounds the size of one list response.
const listPage = 500

// GetClaim reads a claim from the API server.
func (a APIClaims) GetClaim(ctx context.Context, namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	return a.Client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

// ClaimsNaming returns the claims whose spec.volumeName is volume, as the
// API server has them.
func (a APIClaims) ClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error) {
	if a.Index == nil {
		return a.listClaimsNaming(ctx, volume)
	}
	objs, err := a.Index.ByIndex(ByVolumeName, volume)
	if err != nil {
		return nil, err
	}
	var out []corev1.PersistentVolumeClaim
	for _, o := range objs {
		cached, ok := o.(*corev1.PersistentVolumeClaim)
		if !ok {
			continue
		}
		c, err := a.GetClaim(ctx, cached.Namespace, cached.Name)
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

// listClaimsNaming reads every claim in the cluster, without an index.
func (a APIClaims) listClaimsNaming(ctx context.Context, volume string) ([]corev1.PersistentVolumeClaim, error) {
	var out []corev1.PersistentVolumeClaim
	opts := metav1.ListOptions{Limit: listPage}
	for {
		list, err := a.Client.CoreV1().PersistentVolumeClaims("").List(ctx, opts)
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
