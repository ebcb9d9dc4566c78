package provisioner

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/timeline"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// TestGetClaimTimeline: the spans of a claim by UID, marked with this
// service and replica; a UID that is not one is refused before the store
// is looked at.
func TestGetClaimTimeline(t *testing.T) {
	tl := timeline.New(10, 10, nil)
	s := &server{p: &provisioner{member: "p-1", timeline: tl}}
	_, step := tl.Start(context.Background(), "3f2c1e0a-1111-4000-8000-000000000001", "CreateVolume")
	step.EndErr(status.Error(codes.DeadlineExceeded, "driver slow"), "")
	tl.Add(context.Background(), "3f2c1e0a-1111-4000-8000-000000000001", "provision", time.Now().Add(-time.Second), time.Now(), "IN_BACKGROUND", "")

	resp, err := s.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: "3f2c1e0a-1111-4000-8000-000000000001"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetSpans()) != 2 || resp.Spans[0].GetName() != "provision" || resp.Spans[1].GetCode() != "DeadlineExceeded" ||
		resp.Spans[1].GetService() != "provisioner" || resp.Spans[1].GetMemberId() != "p-1" {
		t.Errorf("spans %v", resp.GetSpans())
	}
	if resp, err := s.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: "unknown"}); err != nil || len(resp.GetSpans()) != 0 {
		t.Errorf("unknown claim: %v %v", resp, err)
	}
	off := &server{p: &provisioner{member: "p-1"}}
	if _, err := off.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: "3f2c1e0a-1111-4000-8000-000000000001"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("timeline off: %v, want FailedPrecondition", err)
	}
	for name, uid := range map[string]string{
		"empty":       "",
		"a path":      "../../etc",
		"a space":     "a b",
		"too long":    strings.Repeat("a", 129),
		"a newline":   "uid\n",
		"a long junk": strings.Repeat("é", 70),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := s.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: uid}); status.Code(err) != codes.InvalidArgument {
				t.Errorf("%q: %v, want InvalidArgument", uid, err)
			}
		})
	}
}

// TestTimelineOfARecovery: a provisioning the driver finished after its
// caller gave up is finished by the recovery from the journal, and the
// claim's timeline shows it: the recovery as its own step, its
// CreateVolume and the write of the PV.
func TestTimelineOfARecovery(t *testing.T) {
	g := newGuarded(t)
	g.s.p.timeline = timeline.New(10, 32, nil)
	fast := "fast"
	g.addClaim(t, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "3f2c1e0a-1111-4000-8000-000000000002"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &fast, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}},
	})
	if _, err := g.api.StorageV1().StorageClasses().Create(t.Context(), &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"},
		Provisioner: devcsi.DefaultName}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g.drv.Faults().Set("CreateVolume", devcsi.Fault{HangCount: 1, Hang: devcsi.HangComplete})
	g.s.p.timeout = 200 * time.Millisecond
	resp, err := g.s.Provision(t.Context(), &provisionerv1.ProvisionRequest{ClaimNamespace: "app", ClaimName: "data", ClaimUid: "3f2c1e0a-1111-4000-8000-000000000002"})
	if err != nil || resp.Outcome != provisionerv1.Outcome_OUTCOME_IN_BACKGROUND {
		t.Fatalf("first attempt: %v %v, want IN_BACKGROUND", resp, err)
	}
	pollVolumes(t, g, 1)
	g.s.p.timeout = 10 * time.Second
	g.s.p.recoverAll(t.Context())
	if _, err := g.api.CoreV1().PersistentVolumes().Get(t.Context(), resp.GetVolumeName(), metav1.GetOptions{}); err != nil {
		t.Fatalf("the recovery wrote no PV: %v", err)
	}
	tl, err := g.s.GetClaimTimeline(t.Context(), &provisionerv1.GetClaimTimelineRequest{ClaimUid: "3f2c1e0a-1111-4000-8000-000000000002"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range tl.GetSpans() {
		got = append(got, s.GetName()+":"+s.GetCode())
	}
	want := []string{"provision:IN_BACKGROUND", "CreateVolume:DeadlineExceeded", "recover:FINISHED", "CreateVolume:OK", "write PV:OK"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("spans %v, want %v", got, want)
	}
}
