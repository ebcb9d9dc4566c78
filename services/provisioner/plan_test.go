package provisioner

import (
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// PlanVolume answers the very request Provision then sends (without its
// secrets), and writes nothing: no journal record, no API write, no
// CreateVolume, no Secret read.
func TestPlanVolumeIsWhatProvisionSends(t *testing.T) {
	fast := "fast"
	block := corev1.PersistentVolumeBlock
	claim := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "u1", ResourceVersion: "7"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadOnlyMany},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Mi")},
			}},
	}
	blockClaim := claim.DeepCopy()
	blockClaim.Spec.VolumeMode = &block
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "c1", ResourceVersion: "3"}, Provisioner: devcsi.DefaultName,
		Parameters:   map[string]string{"tier": "gold", paramFSType: "xfs", paramProvisionerSecretName: "creds", paramProvisionerSecretNamespace: "${pvc.namespace}"},
		MountOptions: []string{"noatime"}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "creds"}, Data: map[string][]byte{"password": []byte("hunter2")}}
	for name, c := range map[string]*corev1.PersistentVolumeClaim{"filesystem": claim, "block": blockClaim} {
		t.Run(name, func(t *testing.T) {
			g := newGuarded(t)
			g.addClaim(t, c)
			if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), class, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := g.api.CoreV1().Secrets("app").Create(t.Context(), secret, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			g.api.ClearActions()
			cb, _ := kube.EncodeProto(c)
			resp, err := g.s.PlanVolume(t.Context(), &provisionerv1.PlanVolumeRequest{Claim: cb})
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range g.api.Actions() {
				if a.GetVerb() != "get" || a.GetResource().Resource == "secrets" {
					t.Errorf("PlanVolume did %s %s", a.GetVerb(), a.GetResource().Resource)
				}
			}
			if recs, _ := g.journal.List(t.Context(), kindProvision); len(recs) != 0 || len(g.journal.locks) != 0 {
				t.Fatalf("PlanVolume journaled %v, locks %v", recs, g.journal.locks)
			}
			g.mu.Lock()
			calls := len(g.creates)
			g.mu.Unlock()
			if calls != 0 {
				t.Fatalf("PlanVolume called CreateVolume")
			}
			plan := resp.GetPlan()
			if !plan.GetWithSecrets() || resp.GetProvisionerName() != devcsi.DefaultName || !resp.GetDriverReady() {
				t.Errorf("plan %v", resp)
			}

			// The dev driver refuses block volumes: what counts is the
			// request it got.
			if _, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "u1"}); err != nil {
				t.Fatal(err)
			}
			g.mu.Lock()
			sent := proto.Clone(g.creates[0]).(*csi.CreateVolumeRequest)
			g.mu.Unlock()
			if sent.Secrets["password"] != "hunter2" {
				t.Fatalf("Provision sent no secret: the test proves nothing")
			}
			if !proto.Equal(planOf(sent, plan.GetDriverName(), true), plan) {
				t.Fatalf("PlanVolume said\n%v\nProvision sent\n%v", plan, sent)
			}
			// No limit_bytes, as external-provisioner sends none.
			if plan.GetVolumeName() != "pvc-u1" || plan.GetRequiredBytes() != 1<<20 || plan.GetLimitBytes() != 0 || plan.GetParameters()["tier"] != "gold" {
				t.Errorf("plan %v", plan)
			}
			if vc := plan.GetVolumeCapabilities(); len(vc) != 2 || vc[0].GetBlock() != (name == "block") || (name != "block" && vc[0].GetFsType() != "xfs") {
				t.Errorf("capabilities %v", vc)
			}
		})
	}
}

func TestPlanVolumeRefusals(t *testing.T) {
	g := newGuarded(t)
	fast, other, none := "fast", "other", ""
	mk := func(cls *string, mutate func(*corev1.PersistentVolumeClaim)) []byte {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "u1"},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: cls, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
		if mutate != nil {
			mutate(c)
		}
		b, _ := kube.EncodeProto(c)
		return b
	}
	for _, sc := range []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName, Parameters: map[string]string{"csi.storage.k8s.io/fstpye": "ext4"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Provisioner: "elsewhere.example.com"},
	} {
		if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), sc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, tc := range map[string]struct {
		claim []byte
		code  codes.Code
		msg   string
	}{
		"no claim":    {nil, codes.InvalidArgument, "claim is required"},
		"not a claim": {[]byte("junk"), codes.InvalidArgument, "claim"},
		"no class":    {mk(&none, nil), codes.FailedPrecondition, "names no StorageClass"},
		"class missing": {mk(nil, func(c *corev1.PersistentVolumeClaim) {
			c.Spec.StorageClassName = new(string)
			*c.Spec.StorageClassName = "gone"
		}), codes.NotFound, "StorageClass gone"},
		"not served":          {mk(&other, nil), codes.FailedPrecondition, "not served"},
		"bad class parameter": {mk(&fast, nil), codes.FailedPrecondition, "fstpye"},
		// A claim the API server would refuse, whoever sends it.
		"no access modes": {mk(&fast, func(c *corev1.PersistentVolumeClaim) { c.Spec.AccessModes = nil }), codes.InvalidArgument, "spec.accessModes"},
		"larger than an int64": {mk(&fast, func(c *corev1.PersistentVolumeClaim) {
			c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("100E")
		}), codes.InvalidArgument, "8Ei"},
		"absurd exponent": {mk(&fast, func(c *corev1.PersistentVolumeClaim) {
			c.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("1e99")
		}), codes.InvalidArgument, "out of range"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := g.s.PlanVolume(t.Context(), &provisionerv1.PlanVolumeRequest{Claim: tc.claim})
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("%v, want %v with %q", err, tc.code, tc.msg)
			}
		})
	}
	if recs, _ := g.journal.List(t.Context(), kindProvision); len(recs) != 0 {
		t.Fatalf("journaled %v", recs)
	}
}

// An attempt that leaves its operation in the journal records the CSI
// error's code and message and when it ended; ListOperations finds a
// claim's operation by its UID.
func TestJournalRecordsTheLastCSIError(t *testing.T) {
	g := newGuarded(t)
	fast := "fast"
	g.addClaim(t, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "u1"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}})
	if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g.drv.Faults().FailNext("CreateVolume", 1, codes.Unavailable, "driver busy")
	resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data"})
	if err != nil || resp.Outcome != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
		t.Fatalf("%v %v, want IN_BACKGROUND", resp, err)
	}
	ops, err := g.s.ListOperations(t.Context(), &provisionerv1.ListOperationsRequest{ClaimUid: "u1"})
	if err != nil || len(ops.Operations) != 1 {
		t.Fatalf("%v %v", ops, err)
	}
	op := ops.Operations[0]
	if op.GetVolumeName() != "pvc-u1" || op.GetAttempts() != 1 || op.GetLastErrorCode() != "Unavailable" || op.GetLastErrorMessage() != "driver busy" || op.GetLastAttemptTime() == nil {
		t.Fatalf("operation %v", op)
	}
	if ops, _ := g.s.ListOperations(t.Context(), &provisionerv1.ListOperationsRequest{ClaimUid: "u2"}); len(ops.GetOperations()) != 0 {
		t.Fatalf("another claim's operations: %v", ops)
	}
	if _, err := g.s.ListOperations(t.Context(), &provisionerv1.ListOperationsRequest{ClaimUid: "a/b"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad UID: %v", err)
	}
	if all, _ := g.s.ListOperations(t.Context(), &provisionerv1.ListOperationsRequest{}); len(all.GetOperations()) != 1 || all.Operations[0].GetLastErrorCode() != "Unavailable" {
		t.Fatalf("all operations %v", all)
	}
}
