package provisioner

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Cross-namespace data sources, as external-provisioner v6.3.0 has them
// behind its CrossNamespaceVolumeDataSource gate (and kube-apiserver
// behind its own gate of that name, without which it drops
// dataSourceRef.namespace): a claim's dataSourceRef may name a claim or a
// VolumeSnapshot of another namespace when a ReferenceGrant
// (gateway.networking.k8s.io/v1beta1) in that namespace allows claims of
// the claim's namespace to refer to it. With the gate off such a claim is
// refused, as volplane always did.

// referenceGrantsResource is the ReferenceGrant resource, read through the
// dynamic client (no dependency on the Gateway API module).
var referenceGrantsResource = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1beta1", Resource: "referencegrants"}

// sourceNamespace is the namespace of claim's data source: the claim's own
// unless dataSourceRef names another, which the gate and a ReferenceGrant
// must then allow. Its errors are final, as the other checks of the
// source.
func (s sources) sourceNamespace(ctx context.Context, claim *corev1.PersistentVolumeClaim) (string, error) {
	ref := claim.Spec.DataSourceRef
	if ref == nil || ref.Namespace == nil || *ref.Namespace == "" || *ref.Namespace == claim.Namespace {
		return claim.Namespace, nil
	}
	ns := *ref.Namespace
	if !s.crossNamespace {
		return "", fmt.Errorf("dataSourceRef in another namespace (%q) is not supported", ns)
	}
	if s.dynamic == nil {
		return "", fmt.Errorf("error getting ReferenceGrants in %s namespace from api server: no dynamic client", ns)
	}
	list, err := s.dynamic.Resource(referenceGrantsResource).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		// External-provisioner's words.
		return "", fmt.Errorf("error getting ReferenceGrants in %s namespace from api server: %v", ns, err)
	}
	if !granted(claim, list.Items) {
		return "", fmt.Errorf("accessing %s/%s of %s dataSource from %s/%s isn't allowed", ns, ref.Name, ref.Kind, claim.Namespace, claim.Name)
	}
	return ns, nil
}

// granted reports whether one of grants (ReferenceGrants of the data
// source's namespace) lets claim refer to its dataSourceRef, by
// external-provisioner's IsGranted: a from entry of group "", kind
// PersistentVolumeClaim and the claim's namespace, and a to entry of the
// source's group and kind whose name is empty or the source's.
func granted(claim *corev1.PersistentVolumeClaim, grants []unstructured.Unstructured) bool {
	ref := claim.Spec.DataSourceRef
	group := ""
	if ref.APIGroup != nil {
		group = *ref.APIGroup
	}
	for _, g := range grants {
		if g.GetNamespace() != *ref.Namespace {
			continue
		}
		from, _, _ := unstructured.NestedSlice(g.Object, "spec", "from")
		to, _, _ := unstructured.NestedSlice(g.Object, "spec", "to")
		fromOK := false
		for _, f := range from {
			m, _ := f.(map[string]any)
			if str(m, "group") == "" && str(m, "kind") == "PersistentVolumeClaim" && str(m, "namespace") == claim.Namespace {
				fromOK = true
				break
			}
		}
		if !fromOK {
			continue
		}
		for _, t := range to {
			m, _ := t.(map[string]any)
			if str(m, "group") != group || str(m, "kind") != ref.Kind {
				continue
			}
			if name := str(m, "name"); name == "" || name == ref.Name {
				return true
			}
		}
	}
	return false
}

func str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}
