package dynamic

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/test/harness/e2e"
)

var referenceGrants = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1beta1", Resource: "referencegrants"}

// installReferenceGrantCRD installs the Gateway API's ReferenceGrant
// (v1beta1) with an open schema: enough for a provisioner, which only
// lists them. It stays for the rest of the run.
func installReferenceGrantCRD(t *testing.T, dyn dynamic.Interface) {
	t.Helper()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": "referencegrants.gateway.networking.k8s.io",
			// A protected group; the upstream CRD carries an approval.
			"annotations": map[string]any{"api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/1538"}},
		"spec": map[string]any{
			"group": "gateway.networking.k8s.io", "scope": "Namespaced",
			"names": map[string]any{"kind": "ReferenceGrant", "plural": "referencegrants", "singular": "referencegrant", "listKind": "ReferenceGrantList"},
			"versions": []any{map[string]any{
				"name": "v1beta1", "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
			}},
		},
	}}
	if _, err := dyn.Resource(e2e.CRDs).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("install the ReferenceGrant CRD: %v", err)
	}
}

// createGrant creates ReferenceGrant ns/name letting claims of namespace
// from refer to the objects to names.
func createGrant(t *testing.T, dyn dynamic.Interface, ns, name, from string, to map[string]any) {
	t.Helper()
	g := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"from": []any{map[string]any{"group": "", "kind": "PersistentVolumeClaim", "namespace": from}},
			"to":   []any{to},
		},
	}}
	e2e.Eventually(t, 30*time.Second, func() string { // until the CRD serves
		if _, err := dyn.Resource(referenceGrants).Namespace(ns).Create(t.Context(), g, metav1.CreateOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})
}

// crossNamespaceClone is a claim of namespace ns cloning claim srcNS/name
// through dataSourceRef.
func crossNamespaceClone(srcNS, name string) func(*corev1.PersistentVolumeClaim) {
	return func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: name, Namespace: &srcNS}
	}
}

// With the CrossNamespaceVolumeDataSource gate on (kube-apiserver's and
// the provisioner's, as this run has them), a clone of a claim of another
// namespace fails with external-provisioner's message until a
// ReferenceGrant there allows it, then provisions; the source carries the
// cloning-protection finalizer.
func TestCrossNamespaceCloneNeedsAReferenceGrant(t *testing.T) {
	src, dst := e2e.Namespace(t, cluster.client), e2e.Namespace(t, cluster.client)
	dyn := dynamic.NewForConfigOrDie(kube.Tune(cluster.env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))
	installReferenceGrantCRD(t, dyn)
	sc := class(t)
	createClaim(t, src, "source", "1Gi", sc.Name)
	bound(t, src, "source")

	// A grant of another kind allows nothing here.
	createGrant(t, dyn, src, "snapshots-only", dst, map[string]any{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"})
	c := createClaim(t, dst, "copy", "1Gi", sc.Name, crossNamespaceClone(src, "source"))
	if ref := c.Spec.DataSourceRef; ref == nil || ref.Namespace == nil || *ref.Namespace != src {
		t.Fatalf("kube-apiserver dropped dataSourceRef.namespace (its CrossNamespaceVolumeDataSource gate is off?): %+v", ref)
	}
	hasEventFrom(t, c, kube.EventProvisioningFailed,
		fmt.Sprintf("accessing %s/source of PersistentVolumeClaim dataSource from %s/copy isn't allowed", src, dst), driverName)

	// The right grant lets the claim's retries through.
	createGrant(t, dyn, src, "clones", dst, map[string]any{"group": "", "kind": "PersistentVolumeClaim", "name": "source"})
	_, pv := bound(t, dst, "copy")
	reqs := cluster.requests.createsFor(pv.Name)
	_, srcPV := bound(t, src, "source")
	if got := reqs[len(reqs)-1].GetVolumeContentSource().GetVolume().GetVolumeId(); got != srcPV.Spec.CSI.VolumeHandle {
		t.Errorf("content source %v, want volume %s", reqs[len(reqs)-1].GetVolumeContentSource(), srcPV.Spec.CSI.VolumeHandle)
	}
	s, err := cluster.client.CoreV1().PersistentVolumeClaims(src).Get(t.Context(), "source", metav1.GetOptions{})
	if err != nil || !slices.Contains(s.Finalizers, finalizerCloneProtection) {
		t.Errorf("the cross-namespace source: %v (%v), want its cloning protection", s.GetFinalizers(), err)
	}
}

// A provisioner with the gate off (the default) refuses a cross-namespace
// data source as volplane always did, even when a ReferenceGrant allows it.
func TestCrossNamespaceSourceWithTheGateOff(t *testing.T) {
	src, dst := e2e.Namespace(t, cluster.client), e2e.Namespace(t, cluster.client)
	dyn := dynamic.NewForConfigOrDie(kube.Tune(cluster.env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))
	installReferenceGrantCRD(t, dyn)
	sc := class(t)
	createClaim(t, src, "source", "1Gi", sc.Name)
	bound(t, src, "source")
	createGrant(t, dyn, src, "clones", dst, map[string]any{"group": "", "kind": "PersistentVolumeClaim"})
	// A provisioner name only this test's replica (gate off) serves, so
	// the shared binder leaves the claim to it.
	name := "gate-off.volplane.io"
	off := class(t, func(c *storagev1.StorageClass) { c.Provisioner = name })
	addr, _ := startProvisioner(t, "gate-off", name)
	c := createClaim(t, dst, "copy", "1Gi", off.Name, crossNamespaceClone(src, "source"))
	res := provision(t, addr, c, off)
	want := fmt.Sprintf("dataSourceRef in another namespace (%q) is not supported", src)
	if res.GetOutcome() != provisionerv1.Outcome_OUTCOME_NO_CHANGE || res.GetMessage() != want {
		t.Errorf("Provision: %s %q, want NO_CHANGE %q", res.GetOutcome(), res.GetMessage(), want)
	}
	e2e.HasEvent(t, cluster.client, dst, "PersistentVolumeClaim", "copy", kube.EventProvisioningFailed, want, name+"_", 30*time.Second)
}
