package e2e

import (
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// The resources of the CRDs and of the snapshot API.
var (
	CRDs                   = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	VolumeSnapshots        = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	VolumeSnapshotContents = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

// InstallSnapshotCRDs installs VolumeSnapshot and VolumeSnapshotContent
// with an open schema and a status subresource: enough for a provisioner,
// which reads them and sets finalizers on VolumeSnapshots. They stay for
// the rest of the run.
func InstallSnapshotCRDs(t testing.TB, dyn dynamic.Interface) {
	t.Helper()
	for _, c := range []struct{ kind, plural, scope string }{
		{"VolumeSnapshot", "volumesnapshots", "Namespaced"},
		{"VolumeSnapshotContent", "volumesnapshotcontents", "Cluster"},
	} {
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
			"metadata": map[string]any{"name": c.plural + ".snapshot.storage.k8s.io",
				// snapshot.storage.k8s.io is a protected group; the upstream
				// CRDs carry this approval.
				"annotations": map[string]any{"api-approved.kubernetes.io": "https://github.com/kubernetes-csi/external-snapshotter/pull/419"}},
			"spec": map[string]any{
				"group": "snapshot.storage.k8s.io", "scope": c.scope,
				"names": map[string]any{"kind": c.kind, "plural": c.plural, "singular": c.plural[:len(c.plural)-1], "listKind": c.kind + "List"},
				"versions": []any{map[string]any{
					"name": "v1", "served": true, "storage": true,
					"subresources": map[string]any{"status": map[string]any{}},
					"schema": map[string]any{"openAPIV3Schema": map[string]any{
						"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
				}},
			},
		}}
		// Installed once per run: a later test finds them (deleting them
		// at a test's end would race the next test's install).
		if _, err := dyn.Resource(CRDs).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("install CRD %s: %v", c.plural, err)
		}
	}
}

// CreateWithStatus creates obj and then sets its status, as the snapshot
// controller would.
func CreateWithStatus(t testing.TB, r dynamic.ResourceInterface, obj *unstructured.Unstructured, status map[string]any) {
	t.Helper()
	var created *unstructured.Unstructured
	Eventually(t, 30*time.Second, func() string { // until the CRD serves
		var err error
		if created, err = r.Create(t.Context(), obj, metav1.CreateOptions{}); err != nil {
			return err.Error()
		}
		return ""
	})
	created.Object["status"] = status
	if _, err := r.UpdateStatus(t.Context(), created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("status of %s: %v", obj.GetName(), err)
	}
}

// ReadySnapshot makes what the snapshot controller leaves for a ready
// snapshot of claim pvc: VolumeSnapshot ns/name bound to a new
// VolumeSnapshotContent content of driver with the snapshot handle, whose
// volumeSnapshotRef names the snapshot by UID (a provisioner refuses a
// content bound to another snapshot). spec adds to the content's spec
// (deletionPolicy Delete unless it says otherwise; sourceVolumeMode).
func ReadySnapshot(t testing.TB, dyn dynamic.Interface, ns, name, pvc, content, driver, handle string, spec map[string]any) {
	t.Helper()
	snaps := dyn.Resource(VolumeSnapshots).Namespace(ns)
	var snap *unstructured.Unstructured
	Eventually(t, 30*time.Second, func() string { // until the CRD serves
		var err error
		snap, err = snaps.Create(t.Context(), &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"source": map[string]any{"persistentVolumeClaimName": pvc}},
		}}, metav1.CreateOptions{})
		if err != nil {
			return err.Error()
		}
		return ""
	})
	cs := map[string]any{"driver": driver, "deletionPolicy": "Delete",
		"source":            map[string]any{"snapshotHandle": handle},
		"volumeSnapshotRef": map[string]any{"namespace": ns, "name": name, "uid": string(snap.GetUID())}}
	for k, v := range spec {
		cs[k] = v
	}
	CreateWithStatus(t, dyn.Resource(VolumeSnapshotContents), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": content}, "spec": cs,
	}}, map[string]any{"snapshotHandle": handle, "readyToUse": true})
	snap.Object["status"] = map[string]any{"boundVolumeSnapshotContentName": content, "readyToUse": true}
	if _, err := snaps.UpdateStatus(t.Context(), snap, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("status of VolumeSnapshot %s/%s: %v", ns, name, err)
	}
}
