package minimalprov

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/conformance"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/test/harness/e2e"
)

// TestMinimalProvisionerConforms runs the provisioner suite against the
// minimal provisioner the way a user would, with the volplane-conformance
// command, while volplane's binder and reclaimer use it too.
func TestMinimalProvisionerConforms(t *testing.T) {
	needCluster(t)
	bin := filepath.Join(t.TempDir(), "volplane-conformance")
	if out, err := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "github.com/volplane/volplane/cmd/volplane-conformance").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tls := cluster.e2e.TLS(e2e.Client)
	cmd := exec.CommandContext(t.Context(), bin, "provisioner", "--address", cluster.provisionerAddr,
		"--tls-ca-file", tls.CAFile, "--tls-cert-file", tls.CertFile, "--tls-key-file", tls.KeyFile,
		"--kubeconfig", cluster.e2e.Env.Kubeconfig, "--csi-endpoint", cluster.csiEndpoint, "--timeout", "1m")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("volplane-conformance provisioner:\n%s", out.String())
	if err != nil {
		t.Fatalf("volplane-conformance provisioner: %v", err)
	}
	// Everything but the optional RPCs, which the minimal provisioner
	// does not implement, passed.
	if !regexp.MustCompile(`(?m)^ok provisioner: \d+ passed, 0 failed, 1 skipped$`).Match(out.Bytes()) ||
		!strings.Contains(out.String(), "--- SKIP: provisioner/optional-rpcs") {
		t.Fatalf("want every check but optional-rpcs passed")
	}
}

// TestBinderWithMinimalProvisioner runs the binder suite against a binder
// whose --provisioner-address is the minimal provisioner: dynamic
// provisioning included, so a claim is provisioned and bound through it.
func TestBinderWithMinimalProvisioner(t *testing.T) {
	needCluster(t)
	results := conformance.RunTest(t, conformance.Binder, conformance.Config{
		Address: cluster.binderAddr, TLS: cluster.e2e.TLS(e2e.Client), Kube: cluster.e2e.Client,
		ProvisionerName: devcsi.DefaultName,
	})
	for _, r := range results {
		if r.Outcome != conformance.Passed {
			t.Errorf("%s: %s %s", r.Check, r.Outcome, r.Message)
		}
	}
}

// TestReclaimerWithMinimalProvisioner: the reclaimer deletes a volume
// through the minimal provisioner (the reclaimer suite's Delete check).
func TestReclaimerWithMinimalProvisioner(t *testing.T) {
	needCluster(t)
	results := conformance.RunTest(t, conformance.Reclaimer, conformance.Config{
		Address: cluster.reclaimerAddr, TLS: cluster.e2e.TLS(e2e.Client), Kube: cluster.e2e.Client,
		ProvisionerName: devcsi.DefaultName, ProvisionerAddress: cluster.provisionerAddr, CSIEndpoint: cluster.csiEndpoint,
		Run: regexp.MustCompile(`/reclaim-delete$`),
	})
	if len(results) != 1 || results[0].Outcome != conformance.Passed {
		t.Fatalf("results %v", results)
	}
}

// TestDynamicClaimThroughMinimalProvisioner is the swap end to end, in
// plain Kubernetes objects: a claim of a class of the dev driver is
// provisioned by the minimal provisioner (the only one running) and bound
// by volplane's binder; deleting it deletes the backing volume through the
// same provisioner, called by volplane's reclaimer.
func TestDynamicClaimThroughMinimalProvisioner(t *testing.T) {
	needCluster(t)
	ctx := t.Context()
	kube := cluster.e2e.Client
	ns := e2e.Namespace(t, kube)
	policy := corev1.PersistentVolumeReclaimDelete
	class := e2e.CreateClass(t, kube, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ns}, Provisioner: devcsi.DefaultName, ReclaimPolicy: &policy})
	claim, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, e2e.Claim(ns, "swapped", "5Mi", class.Name), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound := e2e.ClaimPhase(t, kube, ns, claim.Name, corev1.ClaimBound, time.Minute)
	pv := e2e.VolumePhase(t, kube, bound.Spec.VolumeName, corev1.VolumeBound, 30*time.Second)
	if pv.Name != "pvc-"+string(claim.UID) || pv.Spec.CSI == nil || pv.Spec.CSI.Driver != devcsi.DefaultName || pv.Spec.ClaimRef.UID != claim.UID {
		t.Fatalf("claim bound to %s (CSI %v, claimRef %v), want the minimal provisioner's pvc-%s of driver %s", pv.Name, pv.Spec.CSI, pv.Spec.ClaimRef, claim.UID, devcsi.DefaultName)
	}
	handle := pv.Spec.CSI.VolumeHandle
	if !driverLists(t, handle) {
		t.Fatalf("the dev driver does not list volume %s", handle)
	}

	if err := kube.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, time.Minute, func() string {
		if _, err := kube.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Sprintf("PersistentVolume %s still there (%v)", pv.Name, err)
		}
		if driverLists(t, handle) {
			return "the driver still lists volume " + handle
		}
		return ""
	})
}

// driverLists says whether the dev driver lists a volume.
func driverLists(t *testing.T, id string) bool {
	t.Helper()
	cc, err := grpcutil.DialCSI(cluster.csiEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := csi.NewControllerClient(cc).ListVolumes(ctx, &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range resp.GetEntries() {
		if e.GetVolume().GetVolumeId() == id {
			return true
		}
	}
	return false
}
