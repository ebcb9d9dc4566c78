package replicas

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	startup "github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// The provisioner needs no more than deploy/kubernetes/rbac.yaml grants: run
// it (and the watcher and binder) as their own ServiceAccounts, and provision a
// WaitForFirstConsumer claim whose class names a provisioner secret, which
// reads the Secret, watches Nodes and CSINodes, creates the PV and sends
// Events.
func TestProvisionerRunsWithTheDeployedRBAC(t *testing.T) {
	applyRBAC(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	drv, err := devcsi.New(devcsi.Options{RootDir: t.TempDir(), NodeID: "rbac-node", Logger: logger("csi-rbac")})
	if err != nil {
		t.Fatal(err)
	}
	sock := "unix://" + filepath.Join(t.TempDir(), "csi.sock")
	lis, err := grpcutil.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	const name = "rbac.csi.volplane.io"
	wAddr, _ := devenv.FreeAddr()
	pAddr, _ := devenv.FreeAddr()
	bAddr, _ := devenv.FreeAddr()
	errc := make(chan error, 4)
	go func() { errc <- drv.Run(ctx, lis) }()
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{RESTConfig: asComponent("watcher"), Listen: wAddr, TLS: cl.TLS("watcher"), Logger: logger("watcher-prov-rbac")})
	}()
	go func() {
		errc <- provisioner.Run(ctx, provisioner.Options{
			Options:        startup.Options{RESTConfig: asComponent("provisioner"), EtcdEndpoints: env.EtcdEndpoints, Etcd: env.EtcdSecurity, Listen: pAddr, TLS: cl.TLS("provisioner"), MemberID: "provisioner-rbac", Logger: logger("provisioner-rbac")},
			CSIEndpoints:   []string{name + "=" + sock},
			WatcherAddress: wAddr,
		})
	}()
	if err := cl.WaitServing(ctx, pAddr, time.Minute); err != nil {
		t.Fatal(err)
	}
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options:            startup.Options{RESTConfig: asComponent("binder"), EtcdEndpoints: env.EtcdEndpoints, Etcd: env.EtcdSecurity, Listen: bAddr, TLS: cl.TLS("binder"), MemberID: "binder-prov-rbac", Logger: logger("binder-prov-rbac")},
			WatcherAddress:     wAddr,
			ProvisionerAddress: pAddr,
		})
	}()
	if err := cl.WaitServing(ctx, bAddr, time.Minute); err != nil {
		t.Fatal(err)
	}

	ns := newNamespace(t, "prov-rbac")
	if _, err := client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"token": e2e.Secret("rbac-provisioner-token-5d0c")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rbac-node",
		Labels: map[string]string{devcsi.TopologyKey: "rbac-node"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StorageV1().CSINodes().Create(ctx, &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "rbac-node"},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: devcsi.DefaultName, NodeID: "rbac-node", TopologyKeys: []string{devcsi.TopologyKey}}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.StorageV1().CSINodes().Delete(context.Background(), "rbac-node", metav1.DeleteOptions{})
		_ = client.CoreV1().Nodes().Delete(context.Background(), "rbac-node", metav1.DeleteOptions{})
	})
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	e2e.CreateClass(t, client, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "rbac-fast"}, Provisioner: name,
		VolumeBindingMode: &mode, Parameters: map[string]string{
			"csi.storage.k8s.io/provisioner-secret-name":      "creds",
			"csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.namespace}",
		}})
	c := e2e.Claim(ns, "data", "1Gi", "rbac-fast")
	c.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "rbac-node"}
	if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bound := e2e.ClaimPhase(t, client, ns, "data", corev1.ClaimBound, time.Minute)
	pv, err := client.CoreV1().PersistentVolumes().Get(ctx, bound.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]; v != "rbac-node" {
		t.Errorf("volume on %q, want rbac-node", v)
	}
	e2e.HasEvent(t, client, ns, "PersistentVolumeClaim", "data", "ProvisioningSucceeded", pv.Name, name+"_", 30*time.Second) // "<driver>_<host>_<uuid>"
	cancel()
	for range 4 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}
