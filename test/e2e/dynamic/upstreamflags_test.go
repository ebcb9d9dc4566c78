package dynamic

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/replica"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/test/harness/e2e"
)

// external-provisioner v6.3.0's flags that shape requests and PVs, each
// run on a provisioner replica of its own (a provisioner name only it
// serves, the dev driver behind it) against the real API server.

// startFlagged runs a provisioner replica serving endpoint under the
// provisioner name name, with Options changed by set.
func startFlagged(t *testing.T, name, endpoint string, set func(*provisioner.Options)) string {
	t.Helper()
	addr := freeAddr()
	o := provisioner.Options{
		Options:      replica.Options{Kubeconfig: cluster.env.Kubeconfig, EtcdEndpoints: cluster.etcd, Listen: addr, MemberID: name, TLS: cluster.e2e.TLS("provisioner"), Logger: testLogger(name)},
		CSIEndpoints: []string{name + "=" + endpoint}, Timeout: csiTimeout, RecoveryPeriod: recoveryPeriod,
	}
	set(&o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- provisioner.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("provisioner %s: %v", name, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("provisioner %s did not stop", name)
		}
	})
	if err := cluster.e2e.WaitServing(ctx, addr, time.Minute); err != nil {
		t.Fatalf("provisioner %s: %v", name, err)
	}
	return addr
}

// flaggedClaim provisions one claim of a new class of provisioner name
// through the replica at addr, and returns the claim, its bound PV and
// the CreateVolume request the driver got.
func flaggedClaim(t *testing.T, addr, name string, modes ...corev1.PersistentVolumeAccessMode) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume, *csi.CreateVolumeRequest) {
	t.Helper()
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, func(sc *storagev1.StorageClass) { sc.Provisioner = name })
	c := createClaim(t, ns, "data", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		if len(modes) > 0 {
			c.Spec.AccessModes = modes
		}
	})
	res := provision(t, addr, c, sc)
	if res.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED {
		t.Fatalf("Provision: %v", res)
	}
	_, pv := bound(t, ns, "data")
	reqs := cluster.requests.createsFor(res.GetVolumeName())
	if len(reqs) != 1 || pv.Name != res.GetVolumeName() {
		t.Fatalf("PV %s, volume %s, %d CreateVolume requests", pv.Name, res.GetVolumeName(), len(reqs))
	}
	return c, pv, reqs[0]
}

// --volume-name-uuid-length=8: the PV and the CreateVolume request are
// named pvc-<the first 8 characters of the UID without dashes>.
func TestFlagVolumeNameUUIDLength(t *testing.T) {
	const name = "uuidlength.volplane.io"
	addr := startFlagged(t, name, cluster.csiEndpoint, func(o *provisioner.Options) { o.VolumeNameUUIDLength = 8 })
	c, pv, req := flaggedClaim(t, addr, name)
	want := "pvc-" + strings.ReplaceAll(string(c.UID), "-", "")[:8]
	if pv.Name != want || req.GetName() != want {
		t.Errorf("PV %s, CreateVolume name %s; want %s", pv.Name, req.GetName(), want)
	}
}

// --immediate-topology=false: an Immediate claim of a class without
// allowedTopologies asks for no topology; the PV's node affinity is where
// the driver put the volume.
func TestFlagImmediateTopologyOff(t *testing.T) {
	const name = "noimmediatetopology.volplane.io"
	addr := startFlagged(t, name, cluster.csiEndpoint, func(o *provisioner.Options) { o.NoImmediateTopology = true })
	_, pv, req := flaggedClaim(t, addr, name)
	if req.GetAccessibilityRequirements() != nil {
		t.Errorf("CreateVolume asked for topology %v", req.GetAccessibilityRequirements())
	}
	if pv.Spec.NodeAffinity == nil {
		t.Error("PV without the node affinity of the driver's answer")
	}
}

// --controller-publish-readonly: a ReadOnlyMany claim's PV is read-only.
func TestFlagControllerPublishReadOnly(t *testing.T) {
	const name = "publishreadonly.volplane.io"
	addr := startFlagged(t, name, cluster.csiEndpoint, func(o *provisioner.Options) { o.ControllerPublishReadOnly = true })
	_, pv, _ := flaggedClaim(t, addr, name, corev1.ReadOnlyMany)
	if !pv.Spec.CSI.ReadOnly {
		t.Errorf("PV %s of a ReadOnlyMany claim: spec.csi.readOnly false", pv.Name)
	}
}

// --feature-gates=Topology=false: no topology asked, no node affinity.
func TestFlagTopologyGateOff(t *testing.T) {
	const name = "notopology.volplane.io"
	addr := startFlagged(t, name, cluster.csiEndpoint, func(o *provisioner.Options) {
		o.FeatureGates = provisioner.FeatureGates{"Topology": false}
	})
	_, pv, req := flaggedClaim(t, addr, name)
	if req.GetAccessibilityRequirements() != nil || pv.Spec.NodeAffinity != nil {
		t.Errorf("Topology=false: CreateVolume topology %v, PV node affinity %v", req.GetAccessibilityRequirements(), pv.Spec.NodeAffinity)
	}
}

// startSourceless runs a dev CSI driver of its own whose CreateVolume
// answers drop the content source, as a faulty driver's would; it
// returns its endpoint and its client.
func startSourceless(t *testing.T) (string, csi.ControllerClient) {
	t.Helper()
	dir := t.TempDir()
	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(dir, "csi"), NodeID: "node-a", Logger: testLogger("csi-sourceless")})
	if err != nil {
		t.Fatal(err)
	}
	sock := "unix://" + filepath.Join(dir, "csi.sock")
	lis, err := grpcutil.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	drop := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		resp, err := h(ctx, req)
		if cv, ok := resp.(*csi.CreateVolumeResponse); ok && err == nil {
			cv.GetVolume().ContentSource = nil
		}
		return resp, err
	}
	srv := grpcutil.NewCSIServer(testLogger("csi-sourceless"), grpc.ChainUnaryInterceptor(drop))
	drv.Register(srv.Server)
	srv.SetServing(true)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis, 5*time.Second) }()
	t.Cleanup(func() { cancel(); <-served })
	cc, err := grpcutil.DialCSI(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return sock, csi.NewControllerClient(cc)
}

// A clone whose CreateVolume answer has no content source: the volume is
// deleted and the claim gets ProvisioningFailed "volume content source
// missing", as with external-provisioner; it stays Pending.
func TestContentSourceMissingIsAFailure(t *testing.T) {
	const name = "sourceless.volplane.io"
	sock, drv := startSourceless(t)
	addr := startFlagged(t, name, sock, func(*provisioner.Options) {})
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t, func(sc *storagev1.StorageClass) { sc.Provisioner = name })
	src := createClaim(t, ns, "src", "1Gi", sc.Name)
	if res := provision(t, addr, src, sc); res.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED {
		t.Fatalf("source: %v", res)
	}
	bound(t, ns, "src")
	clone := createClaim(t, ns, "clone", "1Gi", sc.Name, func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	})
	res := provision(t, addr, clone, sc)
	if res.GetOutcome() != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND || res.GetMessage() != "volume content source missing" {
		t.Fatalf("clone: %v, want IN_BACKGROUND, volume content source missing", res)
	}
	e2e.HasEvent(t, cluster.client, ns, "PersistentVolumeClaim", "clone", kube.EventProvisioningFailed, "volume content source missing", name+"_", 30*time.Second)
	vols, err := drv.ListVolumes(t.Context(), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(vols.GetEntries()); n != 1 {
		t.Errorf("the driver holds %d volumes, want the source's alone (the clone deleted)", n)
	}
	if ops := operations(t, res.GetVolumeName()); len(ops) != 0 {
		t.Errorf("journal %v, want nothing left", ops)
	}
}
