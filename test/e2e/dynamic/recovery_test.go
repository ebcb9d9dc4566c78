package dynamic

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/replica"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/test/harness/e2e"
)

// startProvisioner runs one more provisioner replica, serving the dev
// driver under the provisioner name name; stop ends it as a crash would
// (its journal records stay; its locks go with its lease).
func startProvisioner(t *testing.T, member, name string) (addr string, stop func()) {
	t.Helper()
	addr = freeAddr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- provisioner.Run(ctx, provisioner.Options{
			Options:        replica.Options{Kubeconfig: cluster.env.Kubeconfig, EtcdEndpoints: cluster.etcd, Listen: addr, MemberID: member, TLS: cluster.e2e.TLS("provisioner"), Logger: testLogger(member)},
			CSIEndpoints:   []string{name + "=" + cluster.csiEndpoint},
			Timeout:        csiTimeout,
			RecoveryPeriod: recoveryPeriod,
		})
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("provisioner %s: %v", member, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("provisioner %s did not stop", member)
		}
	}
	t.Cleanup(stop)
	if err := cluster.e2e.WaitServing(ctx, addr, time.Minute); err != nil {
		t.Fatalf("provisioner %s: %v", member, err)
	}
	return addr, stop
}

// A replica that dies while the driver may still be creating a volume
// leaves its journal record; another replica finishes the volume if the
// claim still wants it, and deletes it if the claim is gone.
func TestAnotherReplicaFinishesOrUndoesADeadReplicasWork(t *testing.T) {
	for _, claimGone := range []bool{false, true} {
		t.Run(fmt.Sprintf("claim gone %v", claimGone), func(t *testing.T) {
			ns := e2e.Namespace(t, cluster.client)
			// A provisioner name only the replicas of this test serve, so
			// the shared binder leaves its claims to them.
			name := fmt.Sprintf("recovery-%v.volplane.io", claimGone)
			sc := class(t, func(sc *storagev1.StorageClass) { sc.Provisioner = name })
			c := createClaim(t, ns, "data", "1Gi", sc.Name)
			before := driverVolumes(t)

			first, crash := startProvisioner(t, "first-"+name, name)
			faults(t).HangNext("CreateVolume", 1, devcsi.HangComplete)
			res := provision(t, first, c, sc)
			if res.GetOutcome() != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
				t.Fatalf("first attempt: %v, want IN_BACKGROUND", res)
			}
			// The first replica retries in the background (its recovery
			// pass runs every recoveryPeriod), so by the time the journal
			// is read it may have made a second attempt: what matters is
			// one record, owned by the replica about to die.
			if ops := operations(t, pvName(c)); len(ops) != 1 || ops[0].GetOwner() != "first-"+name || ops[0].GetAttempts() < 1 {
				t.Fatalf("journal %v, want one record owned by the first replica", ops)
			}
			crash()
			if claimGone {
				deleteClaim(t, c)
			}

			startProvisioner(t, "second-"+name, name)
			noJournal(t, pvName(c))
			if claimGone {
				e2e.Eventually(t, 30*time.Second, func() string { return noneAdded(t, before) })
				return
			}
			_, pv := bound(t, ns, "data")
			if a := added(before, driverVolumes(t)); len(a) != 1 || a[0] != pv.Spec.CSI.VolumeHandle {
				t.Errorf("driver volumes added %v; want exactly %s", a, pv.Spec.CSI.VolumeHandle)
			}
		})
	}
}

func provision(t *testing.T, addr string, c *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass) *provisionerv1.ProvisionResponse {
	t.Helper()
	cc, err := cluster.e2e.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cb, _ := kube.EncodeProto(c)
	sb, _ := kube.EncodeProto(sc)
	resp, err := provisionerv1.NewProvisionerServiceClient(cc).Provision(t.Context(), &provisionerv1.ProvisionRequest{
		ClaimNamespace: c.Namespace, ClaimName: c.Name, ClaimUid: string(c.UID), Claim: cb, StorageClass: sb})
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	return resp
}

// Platform tooling can ask for a claim's volume by name alone (as over
// REST): the provisioner reads the claim and its class from the API.
func TestProvisionByNameReadsTheClaimAndClass(t *testing.T) {
	ns := e2e.Namespace(t, cluster.client)
	const name = "byname.volplane.io"
	sc := class(t, func(sc *storagev1.StorageClass) { sc.Provisioner = name })
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	addr, _ := startProvisioner(t, "byname", name)
	cc, err := cluster.e2e.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	resp, err := provisionerv1.NewProvisionerServiceClient(cc).Provision(t.Context(),
		&provisionerv1.ProvisionRequest{ClaimNamespace: ns, ClaimName: "data"})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_FINISHED || resp.GetVolumeName() != pvName(c) {
		t.Fatalf("Provision: %v", resp)
	}
	pv, err := kube.DecodeVolume(resp.GetVolume())
	if err != nil || pv.Spec.ClaimRef.UID != c.UID || pv.Annotations[kube.AnnDynamicallyProvisioned] != name {
		t.Fatalf("volume %v, %v", pv, err)
	}
	bound(t, ns, "data")
}
