package plugin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/internal/kubectlplugin"
	"github.com/volplane/volplane/test/harness/e2e"
)

// backingVolumes are the volume IDs the dev CSI driver holds.
func backingVolumes(t *testing.T) []string {
	t.Helper()
	var ids []string
	req := &csi.ListVolumesRequest{}
	for {
		resp, err := cluster.csi.ListVolumes(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetVolume().GetVolumeId())
		}
		if resp.GetNextToken() == "" {
			return ids
		}
		req.StartingToken = resp.GetNextToken()
	}
}

// forbidden checks a viewer's refusal of a write: the gateway's 403 for
// the route's verb and resource, and the role to ask for.
func forbidden(t *testing.T, err error, ns, verb, resource string) {
	t.Helper()
	var ge *kubectlplugin.Error
	if !errors.As(err, &ge) || ge.Status != 403 {
		t.Fatalf("as a viewer: %v, want the gateway's 403", err)
	}
	for _, want := range []string{
		`User "system:serviceaccount:` + ns + `:plugin-viewer" cannot ` + verb + ` resource "` + resource + `" in API group "volplane.io"`,
		"This command needs the volplane-operator ClusterRole",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q lacks %q", err, want)
		}
	}
}

// reclaimState is the state of a volume's reclaim, "" when there is none.
func reclaimState(t *testing.T, kc, volume string) string {
	t.Helper()
	for _, r := range items(jsonOut(t, kc, "json", "reclaims", "--context", "operator"), "reclaims") {
		if r["volumeName"] == volume {
			return r["state"].(string)
		}
	}
	return ""
}

// Every write command, as an operator (it works: what it did is checked
// in the API and the driver) and as a viewer (the gateway's 403, shown
// with the role to ask for); the commands that delete refuse without a
// terminal and without --yes, and do nothing when answered no.
func TestPluginWriteCommands(t *testing.T) {
	ctx := t.Context()
	ns := e2e.Namespace(t, cluster.client)
	kc := users(t, ns)
	operator := append(gatewayFlags(), "--context", "operator")
	viewer := gatewayFlags()

	policy := corev1.PersistentVolumeReclaimDelete
	e2e.CreateClass(t, cluster.client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "plugin-delete-" + ns}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &policy})
	if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, e2e.Claim(ns, "doomed", "1Gi", "plugin-delete-"+ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvName := e2e.ClaimPhase(t, cluster.client, ns, "doomed", corev1.ClaimBound, time.Minute).Spec.VolumeName
	pv, err := cluster.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	handle := pv.Spec.CSI.VolumeHandle

	t.Run("sync a claim", func(t *testing.T) {
		out, _, err := plugin(t, kc, append(operator, "sync", "pvc", "doomed")...)
		if err != nil || out != "persistentvolumeclaim/doomed queued for sync\n" {
			t.Fatalf("sync pvc as operator: %v %q", err, out)
		}
		_, _, err = plugin(t, kc, append(viewer, "sync", "pvc/doomed")...)
		forbidden(t, err, ns, "update", "claims/sync")
		if _, _, err := plugin(t, kc, append(operator, "sync", "pvc", "no-such-claim")...); err == nil || !strings.Contains(err.Error(), "404") {
			t.Errorf("sync of an unknown claim: %v, want the gateway's 404", err)
		}
	})
	t.Run("sync a volume", func(t *testing.T) {
		out, _, err := plugin(t, kc, append(operator, "sync", "pv", pvName, "-o", "name")...)
		if err != nil || out != "persistentvolume/"+pvName+"\n" {
			t.Fatalf("sync pv as operator: %v %q", err, out)
		}
		_, _, err = plugin(t, kc, append(viewer, "sync", "pv", pvName)...)
		forbidden(t, err, ns, "update", "volumes/sync")
	})

	// The driver refuses to delete: the claim's deletion leaves a FAILED
	// reclaim, which only `reclaim retry` retries here (main_test.go).
	cluster.driver.Faults().FailNext("DeleteVolume", 1<<20, codes.Internal, "disk on fire")
	t.Cleanup(func() { cluster.driver.Faults().Clear("DeleteVolume") })
	if err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	failed := func() string {
		if s := reclaimState(t, kc, pvName); s != "STATE_FAILED" {
			return "reclaim of " + pvName + " is " + s + ", not failed"
		}
		return ""
	}
	e2e.Eventually(t, time.Minute, failed)

	t.Run("retry a reclaim", func(t *testing.T) {
		_, _, err := plugin(t, kc, append(viewer, "reclaim", "retry", pvName)...)
		forbidden(t, err, ns, "update", "reclaims/retry")
		names, _, err := plugin(t, kc, append(operator, "reclaims", "--state", "failed", "-o", "name")...)
		if err != nil || !strings.Contains(names, "persistentvolume/"+pvName+"\n") {
			t.Fatalf("reclaims --state failed -o name: %v %q", err, names)
		}
		// As -o name printed it.
		out, _, err := plugin(t, kc, append(operator, "reclaim", "retry", "persistentvolume/"+pvName)...)
		if err != nil || !strings.HasPrefix(out, "persistentvolume/"+pvName+" reclaim retried\n\nVOLUME ") {
			t.Fatalf("reclaim retry as operator: %v\n%s", err, out)
		}
		// Retried, and failed again: the driver still refuses.
		e2e.Eventually(t, time.Minute, func() string {
			if msg := failed(); msg != "" {
				return msg
			}
			for _, r := range items(jsonOut(t, kc, "json", "reclaims", "--context", "operator"), "reclaims") {
				if r["volumeName"] == pvName && r["attempts"].(float64) < 2 {
					return "not retried yet"
				}
			}
			return ""
		})
		// A reclaim that is not failed is not retried: the gateway's 409.
		_, _, err = plugin(t, kc, append(operator, "reclaim", "retry", "no-such-volume")...)
		var ge *kubectlplugin.Error
		if !errors.As(err, &ge) || ge.Status/100 != 4 {
			t.Errorf("retry of a volume without a reclaim: %v, want the gateway's refusal", err)
		}
	})
	t.Run("delete a backing volume", func(t *testing.T) {
		args := append(slices.Clone(operator), "volumes", "delete-backing", pvName)
		// No terminal, no --yes: refused, nothing sent.
		if _, _, err := plugin(t, kc, args...); !errors.Is(err, kubectlplugin.ErrNotConfirmed) || !strings.Contains(err.Error(), "pass --yes") {
			t.Fatalf("without a terminal and --yes: %v", err)
		}
		// Answered no: nothing deleted.
		_, prompt, err := pluginAt(t, kc, true, "n\n", args...)
		if !errors.Is(err, kubectlplugin.ErrNotConfirmed) || !strings.Contains(prompt, "Delete the backing volume of persistentvolume/"+pvName+" (Failed, 1Gi, Delete, "+devcsi.DefaultName+", claim "+ns+"/doomed)? Its data is lost for good. [y/N]: ") {
			t.Fatalf("answered no: %v, prompt %q", err, prompt)
		}
		// A viewer: the gateway's 403.
		_, _, err = plugin(t, kc, append(viewer, "volumes", "delete-backing", pvName, "--yes")...)
		forbidden(t, err, ns, "delete", "volumes/backing")
		// The driver refuses: the command fails with its message.
		if _, _, err := plugin(t, kc, append(args, "--yes")...); err == nil || !strings.Contains(err.Error(), "disk on fire") {
			t.Fatalf("while the driver refuses: %v, want its message", err)
		}
		if !slices.Contains(backingVolumes(t), handle) {
			t.Fatalf("backing volume %s is gone before anyone said yes", handle)
		}
		// Answered yes: deleted.
		cluster.driver.Faults().Clear("DeleteVolume")
		out, _, err := pluginAt(t, kc, true, "y\n", args...)
		if err != nil || out != "persistentvolume/"+pvName+" backing volume deleted\n" {
			t.Fatalf("answered yes: %v %q", err, out)
		}
		if slices.Contains(backingVolumes(t), handle) {
			t.Errorf("backing volume %s still exists", handle)
		}
		// The PersistentVolume stays, for its reclaim to finish.
		if _, err := cluster.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{}); err != nil {
			t.Errorf("the PersistentVolume: %v", err)
		}
	})
	t.Run("retry the reclaim to its end", func(t *testing.T) {
		if _, _, err := plugin(t, kc, append(operator, "reclaim", "retry", pvName)...); err != nil {
			t.Fatal(err)
		}
		e2e.Eventually(t, time.Minute, func() string {
			if _, err := cluster.client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return "the PersistentVolume is still there"
			}
			return ""
		})
	})
	t.Run("start a reclaim", func(t *testing.T) {
		static := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "plugin-start-" + ns},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              "plugin-start-" + ns,
				ClaimRef:                      &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: ns, Name: "gone", UID: "0b5e4a7e-0000-4a8e-9d57-5c1c8e1f0a3d"},
				PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/plugin-start"}},
			},
		}
		if _, err := cluster.client.CoreV1().PersistentVolumes().Create(ctx, static, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.client.CoreV1().PersistentVolumes().Delete(context.Background(), static.Name, metav1.DeleteOptions{})
		})
		e2e.VolumePhase(t, cluster.client, static.Name, corev1.VolumeReleased, time.Minute)
		_, _, err := plugin(t, kc, append(viewer, "reclaim", "start", static.Name)...)
		forbidden(t, err, ns, "create", "reclaims")
		out, _, err := plugin(t, kc, append(operator, "reclaim", "start", static.Name, "-o", "jsonpath={.reclaim.state} {.reclaim.policy}")...)
		if err != nil || out != "STATE_RETAINED Retain" {
			t.Errorf("reclaim start as operator: %v %q", err, out)
		}
	})
	t.Run("delete an orphan", func(t *testing.T) {
		leak, err := cluster.csi.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "plugin-orphan-" + ns, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
				AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}})
		if err != nil {
			t.Fatal(err)
		}
		id := leak.GetVolume().GetVolumeId()
		t.Cleanup(func() {
			_, _ = cluster.csi.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: id})
		})
		e2e.Eventually(t, time.Minute, func() string {
			out, _, err := plugin(t, kc, append(viewer, "orphans", "--kind", "volume", "-o", "jsonpath={.orphans[*].volumeId}")...)
			if err != nil || !slices.Contains(strings.Fields(out), id) {
				return "orphan not reported yet"
			}
			return ""
		})
		args := append(slices.Clone(operator), "orphans", "delete", "--driver", devcsi.DefaultName, "--volume-id", id)
		if _, _, err := plugin(t, kc, args...); !errors.Is(err, kubectlplugin.ErrNotConfirmed) {
			t.Fatalf("without a terminal and --yes: %v", err)
		}
		_, _, err = plugin(t, kc, append(viewer, "orphans", "delete", "--driver", devcsi.DefaultName, "--volume-id", id, "--yes")...)
		forbidden(t, err, ns, "delete", "orphans")
		if !slices.Contains(backingVolumes(t), id) {
			t.Fatalf("orphan %s is gone before anyone said yes", id)
		}
		out, _, err := plugin(t, kc, append(args, "--yes")...)
		if err != nil || out != `backing volume "`+id+`" of driver `+devcsi.DefaultName+" deleted\n" {
			t.Fatalf("orphans delete --yes as operator: %v %q", err, out)
		}
		if slices.Contains(backingVolumes(t), id) {
			t.Errorf("orphan %s still exists", id)
		}
	})
	t.Run("a volume that is no orphan is not deleted", func(t *testing.T) {
		if _, err := cluster.client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, e2e.Claim(ns, "kept", "1Gi", "plugin-delete-"+ns), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		kept := e2e.ClaimPhase(t, cluster.client, ns, "kept", corev1.ClaimBound, time.Minute)
		pv, err := cluster.client.CoreV1().PersistentVolumes().Get(ctx, kept.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = plugin(t, kc, append(operator, "orphans", "delete", "--driver", devcsi.DefaultName, "--volume-id", pv.Spec.CSI.VolumeHandle, "--yes")...)
		var ge *kubectlplugin.Error
		if !errors.As(err, &ge) || ge.Status != 409 || !strings.Contains(err.Error(), "is not an orphan") {
			t.Errorf("orphans delete of a bound volume: %v, want the gateway's 409", err)
		}
		_, _, err = plugin(t, kc, append(operator, "volumes", "delete-backing", pv.Name, "--yes")...)
		if !errors.As(err, &ge) || ge.Status != 409 || !strings.Contains(err.Error(), "not deleting the backing volume of "+pv.Name) {
			t.Errorf("delete-backing of a bound volume: %v, want the gateway's 409", err)
		}
		if !slices.Contains(backingVolumes(t), pv.Spec.CSI.VolumeHandle) {
			t.Errorf("the bound volume's backing volume is gone")
		}
	})
}
