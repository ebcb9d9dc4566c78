package dynamic

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/test/harness/e2e"
)

// External-provisioner parity, the slow retry of an infeasible request
// (sig-storage-lib-external-provisioner #186, external-provisioner #1369):
// the driver answers the claim's first CreateVolume with InvalidArgument.
// The binder then decides not to call Provision again before its
// --retry-interval-max (5m here) has passed, and says so in ExplainClaim,
// while the claim is still looked at on its backoff; the driver would now
// accept the request, and still no second CreateVolume is sent. The class
// is replaced (deleted and created again, a new UID): the claim starts
// over at its next look, and exactly one more CreateVolume makes its
// volume. Today's binder calls again after a second.
func TestInfeasibleRequestIsRetriedSlowly(t *testing.T) {
	g := newTestGateway(t)
	ns := e2e.Namespace(t, cluster.client)
	sc := class(t)
	f := faults(t)
	f.FailNext("CreateVolume", 1, codes.InvalidArgument, "no such tier")
	c := createClaim(t, ns, "data", "1Gi", sc.Name)
	hasEventFrom(t, c, kube.EventProvisioningFailed,
		"Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = no such tier", driverName)

	// The retry decision, as the binder states it.
	failedAt := time.Now()
	e2e.Eventually(t, 30*time.Second, func() string {
		p := restExplain(t, g, ns, "data").GetProvisioning()
		next := p.GetNextRetryTime().AsTime()
		switch {
		case !strings.Contains(p.GetMessage(), "refused the last request as infeasible (InvalidArgument)") ||
			!strings.Contains(p.GetMessage(), fmt.Sprintf("unless StorageClass %q is replaced", sc.Name)):
			return fmt.Sprintf("explain says %q", p.GetMessage())
		case p.GetNextRetryTime() == nil || next.Before(failedAt.Add(binder.DefaultRetryIntervalMax-time.Minute)):
			// The decision, not a wait: the next call is set about
			// --retry-interval-max after the refusal, not a backoff away.
			return fmt.Sprintf("next retry at %v, want about %v after %v", next, binder.DefaultRetryIntervalMax, failedAt)
		}
		return ""
	})
	// Within the first backoffs (1s, 2s) today's binder would call again
	// and, the fault used up, bind the claim.
	e2e.Consistently(t, 3*time.Second, func() string {
		if n := len(cluster.requests.createsFor(pvName(c))); n != 1 {
			return fmt.Sprintf("%d CreateVolume calls while the request is infeasible, want 1", n)
		}
		return ""
	})

	replaceClass(t, sc)
	bound(t, ns, "data")
	if n := len(cluster.requests.createsFor(pvName(c))); n != 2 {
		t.Errorf("%d CreateVolume calls in all, want 2: the refused one and one after the class was replaced", n)
	}
}

// replaceClass deletes StorageClass sc and creates it again under its
// name: a new UID, as a user fixing a class's parameters must do.
func replaceClass(t *testing.T, sc *storagev1.StorageClass) *storagev1.StorageClass {
	t.Helper()
	ctx := context.Background()
	if err := cluster.client.StorageV1().StorageClasses().Delete(ctx, sc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e2e.Eventually(t, 30*time.Second, func() string {
		_, err := cluster.client.StorageV1().StorageClasses().Get(ctx, sc.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Sprintf("class %s not gone yet: %v", sc.Name, err)
		}
		return ""
	})
	again := sc.DeepCopy()
	again.ObjectMeta = metav1.ObjectMeta{Name: sc.Name}
	created, err := cluster.client.StorageV1().StorageClasses().Create(ctx, again, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.UID == sc.UID {
		t.Fatalf("class %s kept its UID", sc.Name)
	}
	return created
}
