package provisioner

import (
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// Provision tells its caller, the binder, what external-provisioner's
// retry scheduler knows: that the driver refused the request as
// infeasible (InvalidArgument, and only that code), and with which
// StorageClass, so the binder delays the next call as the library's
// slow set does.
func TestProvisionSaysWhenTheRequestIsInfeasible(t *testing.T) {
	for _, tc := range []struct {
		code       codes.Code
		infeasible bool
	}{
		{codes.InvalidArgument, true},
		{codes.FailedPrecondition, false},
		{codes.OutOfRange, false},
		{codes.Internal, false},
		{codes.ResourceExhausted, false},
		{codes.Unavailable, false},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			g := newGuarded(t)
			fast := "fast"
			g.addClaim(t, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "u1"},
				Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}})
			if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "class-uid-1"},
				Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			g.drv.Faults().FailNext("CreateVolume", 1, tc.code, "no such tier")
			resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetInfeasible() != tc.infeasible {
				t.Errorf("infeasible = %v after %s, want %v (%v)", resp.GetInfeasible(), tc.code, tc.infeasible, resp)
			}
			if resp.GetStorageClassUid() != "class-uid-1" {
				t.Errorf("storage_class_uid = %q, want the class's UID", resp.GetStorageClassUid())
			}
			if tc.infeasible && resp.GetOutcome() != provisionerv1.Outcome_OUTCOME_NO_CHANGE {
				t.Errorf("outcome %v, want NO_CHANGE: the driver made nothing", resp.GetOutcome())
			}
		})
	}
}

// infeasible is the library's isInfeasibleError: InvalidArgument,
// wrapped or not; nothing else, and not an error without a gRPC status.
func TestInfeasibleIsInvalidArgumentOnly(t *testing.T) {
	for err, want := range map[error]bool{
		nil: false,
		status.Error(codes.InvalidArgument, "bad"):                        true,
		fmt.Errorf("create: %w", status.Error(codes.InvalidArgument, "")): true,
		status.Error(codes.NotFound, "gone"):                              false,
		errors.New("InvalidArgument"):                                     false,
	} {
		if got := infeasible(err); got != want {
			t.Errorf("infeasible(%v) = %v, want %v", err, got, want)
		}
	}
}
