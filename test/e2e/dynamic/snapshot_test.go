package dynamic

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

var (
	crds      = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	snapshots = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}
	contents  = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshotcontents"}
)

// A claim restored from a VolumeSnapshot fails clearly while the snapshot
// CRDs are missing, and once they are installed (and the snapshot is ready)
// gets a volume with the snapshot's content.
func TestRestoreFromAVolumeSnapshot(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	dyn := dynamic.NewForConfigOrDie(kube.Tune(cluster.env.RESTConfig, kube.ClientOptions{UserAgent: "volplane-e2e"}))
	sc := class(t)
	createClaim(t, ns, "source", "1Gi", sc.Name)
	_, src := bound(t, ns, "source")
	if err := os.WriteFile(filepath.Join(cluster.driver.VolumePath(src.Spec.CSI.VolumeHandle), "state.db"), []byte("v1"), 0o644); err != nil {
		t.Fatal(err)
	}

	apiGroup := "snapshot.storage.k8s.io"
	restored := createClaim(t, ns, "restored", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: &apiGroup, Kind: "VolumeSnapshot", Name: "snap"}
	})
	hasEventFrom(t, restored, "ProvisioningFailed", "CRDs (snapshot.storage.k8s.io) are not installed", driverName)

	installSnapshotCRDs(t, dyn)
	snap, err := cluster.csi.CreateSnapshot(t.Context(), &csi.CreateSnapshotRequest{SourceVolumeId: src.Spec.CSI.VolumeHandle, Name: "snapshot-" + string(src.UID)})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	handle := snap.GetSnapshot().GetSnapshotId()
	content := "snapcontent-" + ns
	create(t, dyn.Resource(contents), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": content},
		"spec": map[string]any{"driver": driverName, "deletionPolicy": "Delete",
			"source":            map[string]any{"snapshotHandle": handle},
			"volumeSnapshotRef": map[string]any{"namespace": ns, "name": "snap"}},
	}}, map[string]any{"snapshotHandle": handle, "readyToUse": true})
	create(t, dyn.Resource(snapshots).Namespace(ns), &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": "snap", "namespace": ns},
		"spec":     map[string]any{"source": map[string]any{"persistentVolumeClaimName": "source"}},
	}}, map[string]any{"boundVolumeSnapshotContentName": content, "readyToUse": true})

	// The claim's retries (with backoff) now succeed.
	_, pv := bound(t, ns, "restored")
	reqs := cluster.requests.createsFor(pv.Name)
	if got := reqs[len(reqs)-1].GetVolumeContentSource().GetSnapshot().GetSnapshotId(); got != handle {
		t.Errorf("content source %v, want snapshot %s", reqs[len(reqs)-1].GetVolumeContentSource(), handle)
	}
	b, err := os.ReadFile(filepath.Join(cluster.driver.VolumePath(pv.Spec.CSI.VolumeHandle), "state.db"))
	if err != nil || string(b) != "v1" {
		t.Errorf("restored volume holds %q, %v", b, err)
	}
}

// create creates obj and then sets its status, as the snapshot controller
// would.
func create(t *testing.T, r dynamic.ResourceInterface, obj *unstructured.Unstructured, status map[string]any) {
	t.Helper()
	var created *unstructured.Unstructured
	e2e.Eventually(t, 30*time.Second, func() string { // until the CRD serves
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

// installSnapshotCRDs installs VolumeSnapshot and VolumeSnapshotContent with
// an open schema and a status subresource: enough for a provisioner, which
// only reads them.
func installSnapshotCRDs(t *testing.T, dyn dynamic.Interface) {
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
		if _, err := dyn.Resource(crds).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
			t.Fatalf("install CRD %s: %v", c.plural, err)
		}
		name := crd.GetName()
		t.Cleanup(func() { _ = dyn.Resource(crds).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	}
}
