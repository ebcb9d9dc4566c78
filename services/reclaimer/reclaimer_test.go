package reclaimer

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

func volume(name, uid string, policy corev1.PersistentVolumeReclaimPolicy) []byte {
	b, _ := kube.EncodeProto(&corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + uid)},
		Spec:       corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: policy},
	})
	return b
}

func TestReclaimRecordsThePolicy(t *testing.T) {
	s := NewServer(slog.New(slog.NewTextHandler(io.Discard, nil)), "me")
	ctx := context.Background()
	for name, want := range map[corev1.PersistentVolumeReclaimPolicy]reclaimerv1.State{
		corev1.PersistentVolumeReclaimRetain: reclaimerv1.State_STATE_RETAINED,
		corev1.PersistentVolumeReclaimDelete: reclaimerv1.State_STATE_PENDING,
		"Shred":                              reclaimerv1.State_STATE_FAILED,
	} {
		resp, err := s.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: "pv-" + string(name), Volume: volume("pv-"+string(name), "1", name)})
		if err != nil || resp.Reclaim.State != want || resp.Reclaim.Owner != "me" {
			t.Errorf("%s: %v %v, want %v", name, resp, err, want)
		}
	}
	// Idempotent for the same volume.
	again, err := s.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: "pv-Retain", VolumeUid: "uid-1", Volume: volume("pv-Retain", "1", corev1.PersistentVolumeReclaimRetain)})
	if err != nil || again.Reclaim.Attempts != 1 {
		t.Fatalf("repeat: %v %v", again, err)
	}
	list, err := s.ListReclaims(ctx, &reclaimerv1.ListReclaimsRequest{State: reclaimerv1.State_STATE_RETAINED})
	if err != nil || len(list.Reclaims) != 1 || list.Reclaims[0].VolumeName != "pv-Retain" {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := s.GetReclaim(ctx, &reclaimerv1.GetReclaimRequest{VolumeName: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown volume: %v", err)
	}
	if _, err := s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "pv-Retain"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("retry of a retained volume: %v", err)
	}
}

func TestReclaimValidation(t *testing.T) {
	s := NewServer(slog.New(slog.NewTextHandler(io.Discard, nil)), "me")
	for name, req := range map[string]*reclaimerv1.ReclaimRequest{
		"no name":    {Volume: volume("a", "1", corev1.PersistentVolumeReclaimRetain)},
		"no volume":  {VolumeName: "a"},
		"garbage":    {VolumeName: "a", Volume: []byte{0xff, 0x02}},
		"other name": {VolumeName: "b", Volume: volume("a", "1", corev1.PersistentVolumeReclaimRetain)},
		"other uid":  {VolumeName: "a", VolumeUid: "x", Volume: volume("a", "1", corev1.PersistentVolumeReclaimRetain)},
	} {
		if _, err := s.Reclaim(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
}
