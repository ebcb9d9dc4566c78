package dynamic

import (
	"context"
	"maps"
	"path/filepath"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/replica"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/test/harness/e2e"
)

// attributesClass creates a VolumeAttributesClass (storage.k8s.io/v1) of
// driver with a name unique to the test.
func attributesClass(t *testing.T, driver string, params map[string]string) string {
	t.Helper()
	vac := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: "vac-" + rand.String(6)}, DriverName: driver, Parameters: params}
	if _, err := cluster.client.StorageV1().VolumeAttributesClasses().Create(t.Context(), vac, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.StorageV1().VolumeAttributesClasses().Delete(context.Background(), vac.Name, metav1.DeleteOptions{})
	})
	return vac.Name
}

func withAttributesClass(name string) func(*corev1.PersistentVolumeClaim) {
	return func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeAttributesClassName = &name }
}

// A claim's VolumeAttributesClass at creation, as external-provisioner
// v6.3.0 (prepareProvision, Provision): the class's parameters are
// CreateVolume's mutable_parameters, the volume is made with them and the
// PV names the class. A class of another driver is refused before the
// driver is asked, in upstream's words; a class that is not there yet is
// tried again until it is.
func TestVolumeAttributesClassAsExternalProvisionerDoes(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	gold := attributesClass(t, driverName, map[string]string{"iops": "3000", "throughput": "125"})
	c := createClaim(t, ns, "gold", "1Gi", sc.Name, withAttributesClass(gold))
	_, pv := bound(t, ns, c.Name)
	req := cluster.requests.createsFor(pv.Name)[0]
	if want := map[string]string{"iops": "3000", "throughput": "125"}; !maps.Equal(req.GetMutableParameters(), want) {
		t.Errorf("mutable_parameters %v, want %v", req.GetMutableParameters(), want)
	}
	if n := pv.Spec.VolumeAttributesClassName; n == nil || *n != gold {
		t.Errorf("PV volumeAttributesClassName %v, want %s", n, gold)
	}

	foreign := attributesClass(t, "other.example.com", map[string]string{"iops": "3000"})
	f := createClaim(t, ns, "foreign", "1Gi", sc.Name, withAttributesClass(foreign))
	hasEventFrom(t, f, kube.EventProvisioningFailed, "VAC "+foreign+" referenced in PVC is for driver other.example.com which does not match driver name "+driverName, driverName)
	if n := len(cluster.requests.createsFor(pvName(f))); n != 0 {
		t.Errorf("%d CreateVolume calls for a class of another driver", n)
	}

	later := "vac-later-" + rand.String(6)
	l := createClaim(t, ns, "later", "1Gi", sc.Name, withAttributesClass(later))
	hasEventFrom(t, l, kube.EventProvisioningFailed, `volumeattributesclasses.storage.k8s.io "`+later+`" not found`, driverName)
	vac := &storagev1.VolumeAttributesClass{ObjectMeta: metav1.ObjectMeta{Name: later}, DriverName: driverName, Parameters: map[string]string{"iops": "500"}}
	if _, err := cluster.client.StorageV1().VolumeAttributesClasses().Create(t.Context(), vac, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.client.StorageV1().VolumeAttributesClasses().Delete(context.Background(), later, metav1.DeleteOptions{})
	})
	_, lpv := bound(t, ns, l.Name)
	if got := cluster.requests.createsFor(lpv.Name); len(got) == 0 || got[len(got)-1].GetMutableParameters()["iops"] != "500" {
		t.Errorf("CreateVolume calls %v, want the class's iops=500", got)
	}
}

// A driver that does not advertise MODIFY_VOLUME cannot take a claim with
// a VolumeAttributesClass: upstream's ProvisioningFailed message, and the
// driver is not asked.
func TestVolumeAttributesClassNeedsModifyVolume(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	name := "nomodify-" + rand.String(4) + ".volplane.io"
	ep := startDriverWithout(t, name)
	sc := class(t, func(sc *storagev1.StorageClass) { sc.Provisioner = name })
	vac := attributesClass(t, name, map[string]string{"iops": "3000"})
	c := createClaim(t, ns, "data", "1Gi", sc.Name, withAttributesClass(vac))
	addr := startProvisionerOn(t, name, ep)
	const want = "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
	// The shared binder may ask this replica too: an attempt running
	// meanwhile is IN_BACKGROUND; none may finish.
	if res := provision(t, addr, c, sc); res.GetOutcome() == provisionerv1.Outcome_OUTCOME_FINISHED ||
		(res.GetOutcome() == provisionerv1.Outcome_OUTCOME_NO_CHANGE && res.GetMessage() != want) {
		t.Fatalf("Provision: %v, want %q", res, want)
	}
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", c.Name, kube.EventProvisioningFailed, want, name+"_", 30*time.Second)
	cc, err := grpcutil.DialCSI(ep)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	vols, err := csi.NewControllerClient(cc).ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil || len(vols.GetEntries()) != 0 {
		t.Errorf("the driver has volumes %v (%v), want none", vols.GetEntries(), err)
	}
}

// startDriverWithout runs one more dev driver, named name, without
// MODIFY_VOLUME, and returns its endpoint.
func startDriverWithout(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	drv, err := devcsi.New(devcsi.Options{Name: name, RootDir: filepath.Join(dir, "root"), NodeID: "node-a", NoModifyVolume: true, Logger: testLogger(name)})
	if err != nil {
		t.Fatal(err)
	}
	ep := "unix://" + filepath.Join(dir, "csi.sock")
	lis, err := grpcutil.Listen(ep)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = drv.Run(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	return ep
}

// startProvisionerOn runs one more provisioner replica serving the driver
// at endpoint ep, until the test ends.
func startProvisionerOn(t *testing.T, member, ep string) string {
	t.Helper()
	addr := freeAddr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- provisioner.Run(ctx, provisioner.Options{
			Options:        replica.Options{Kubeconfig: cluster.env.Kubeconfig, EtcdEndpoints: cluster.etcd, Listen: addr, MemberID: member, TLS: cluster.e2e.TLS("provisioner"), Logger: testLogger(member)},
			CSIEndpoints:   []string{ep},
			Timeout:        csiTimeout,
			RecoveryPeriod: recoveryPeriod,
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("provisioner %s: %v", member, err)
		}
	})
	if err := cluster.e2e.WaitServing(ctx, addr, time.Minute); err != nil {
		t.Fatalf("provisioner %s: %v", member, err)
	}
	return addr
}
