package binder

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// refusingProvisioner is the provisioner's API whose every Provision is
// refused by the driver as infeasible (CreateVolume InvalidArgument),
// saying which class it used.
type refusingProvisioner struct {
	provisionerv1.ProvisionerServiceClient
	calls atomic.Int32
}

func (r *refusingProvisioner) ListDrivers(context.Context, *provisionerv1.ListDriversRequest, ...grpc.CallOption) (*provisionerv1.ListDriversResponse, error) {
	return &provisionerv1.ListDriversResponse{Drivers: []*provisionerv1.Driver{{ProvisionerName: "p"}}}, nil
}

func (r *refusingProvisioner) Provision(_ context.Context, req *provisionerv1.ProvisionRequest, _ ...grpc.CallOption) (*provisionerv1.ProvisionResponse, error) {
	r.calls.Add(1)
	class := &storagev1.StorageClass{}
	if err := class.Unmarshal(req.GetStorageClass()); err != nil {
		return nil, err
	}
	return &provisionerv1.ProvisionResponse{Outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, VolumeName: "pvc-" + req.GetClaimUid(),
		Message:    "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = no such tier",
		Infeasible: true, StorageClassUid: string(class.UID)}, nil
}

// A claim whose request the driver refused as infeasible is not sent to
// the provisioner again, however often it is synced past its backoff,
// until --retry-interval-max has passed or its StorageClass is replaced
// (a new UID), as external-provisioner v6.3.0 does. Today's binder calls
// again at every backoff.
func TestAnInfeasibleClaimIsRetriedSlowly(t *testing.T) {
	ctx := t.Context()
	mode := storagev1.VolumeBindingImmediate
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c", UID: "class-1"}, Provisioner: "p", VolumeBindingMode: &mode}
	claim := testClaim("data")
	key := claimKey(claim)
	c := newController(slog.New(slog.NewTextHandler(io.Discard, nil)), fake.NewClientset(claim, class), record.NewFakeRecorder(1000))
	rp := &refusingProvisioner{}
	c.provisioner = newProvisionerClient(rp, c.log)
	now := time.Now()
	c.provisions.now = func() time.Time { return now }
	c.store.putClass(class)
	c.store.putClaim(claim.DeepCopy())

	// attempt syncs the claim as the end of its backoff would, and when
	// the sync started a call, syncs it again with the call's result.
	attempt := func() {
		t.Helper()
		c.provisions.mu.Lock()
		delete(c.provisions.notBefore, key) // the backoff has passed
		c.provisions.mu.Unlock()
		before := rp.calls.Load()
		if err := c.syncClaim(ctx, c.store.claim(key)); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); c.provisions.busy(key); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the provisioning call did not end")
			}
		}
		if rp.calls.Load() != before {
			if err := c.syncClaim(ctx, c.store.claim(key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	calls := func(want int32, when string) {
		t.Helper()
		if n := rp.calls.Load(); n != want {
			t.Fatalf("%s: %d Provision calls, want %d", when, n, want)
		}
	}

	attempt()
	calls(1, "first sync")
	for range 5 {
		attempt()
	}
	calls(1, "five syncs past the backoff, same class")
	if next := c.provisions.notBefore[key]; next.IsZero() {
		t.Error("a delayed sync scheduled no next look")
	}

	// The class is replaced (deleted and created again: a new UID).
	replaced := class.DeepCopy()
	replaced.UID = "class-2"
	c.store.putClass(replaced)
	attempt()
	calls(2, "after the class was replaced")
	attempt()
	calls(2, "refused again with the new class")

	// --retry-interval-max passes.
	now = now.Add(DefaultRetryIntervalMax - time.Second)
	attempt()
	calls(2, "a second before --retry-interval-max")
	now = now.Add(time.Second)
	attempt()
	calls(3, "at --retry-interval-max")

	// A claim recreated under the same name is not delayed by the old one.
	c.provisions.slowDown(key, types.UID("old-claim"), replaced.UID)
	attempt()
	calls(4, "a new claim of the same name")
}
