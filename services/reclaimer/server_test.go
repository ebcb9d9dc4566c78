package reclaimer

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

func encoded(t *testing.T, v *corev1.PersistentVolume) []byte {
	t.Helper()
	b, err := kube.EncodeProto(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wantCode(t *testing.T, what string, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Errorf("%s: %v, want %s with %q", what, err, code, msg)
	}
}

func TestServerValidation(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	s := &server{c: newReplica(t, "me", kc, j, nil, config{}).controller}
	ctx := t.Context()
	released := releasedPV("a", corev1.PersistentVolumeReclaimRetain)
	bound := releasedPV("bound", corev1.PersistentVolumeReclaimRecycle, func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeBound })
	kc.addPV(bound)
	kc.addPV(releasedPV("noref", corev1.PersistentVolumeReclaimRetain, func(v *corev1.PersistentVolume) { v.Spec.ClaimRef = nil }))
	kc.addPV(releasedPV("shred", "Shred"))
	for _, tc := range []struct {
		name string
		req  *reclaimerv1.ReclaimRequest
		code codes.Code
		msg  string
	}{
		{"no name", &reclaimerv1.ReclaimRequest{Volume: encoded(t, released)}, codes.InvalidArgument, "volume_name is required"},
		{"garbage", &reclaimerv1.ReclaimRequest{VolumeName: "a", Volume: []byte{0xff, 0x02}}, codes.InvalidArgument, "not a PersistentVolume"},
		{"other name", &reclaimerv1.ReclaimRequest{VolumeName: "b", Volume: encoded(t, released)}, codes.InvalidArgument, `does not match the volume's metadata.name "a"`},
		{"other uid", &reclaimerv1.ReclaimRequest{VolumeName: "a", VolumeUid: "x", Volume: encoded(t, released)}, codes.InvalidArgument, "volume_uid"},
		{"missing volume", &reclaimerv1.ReclaimRequest{VolumeName: "nope"}, codes.FailedPrecondition, `volume "nope" does not exist and no reclaim of it is journaled`},
		{"missing volume, forged as Released", &reclaimerv1.ReclaimRequest{VolumeName: "a", Volume: encoded(t, released)}, codes.FailedPrecondition, `volume "a" does not exist`},
		{"invalid name", &reclaimerv1.ReclaimRequest{VolumeName: "../etc"}, codes.InvalidArgument, `volume_name "../etc" is not a valid name`},
		{"invalid UTF-8", &reclaimerv1.ReclaimRequest{VolumeName: "a\xff"}, codes.InvalidArgument, `volume_name is not valid UTF-8`},
		{"bound volume, forged as Released", &reclaimerv1.ReclaimRequest{VolumeName: "bound", Volume: encoded(t, releasedPV("bound", corev1.PersistentVolumeReclaimDelete))}, codes.FailedPrecondition, `volume "bound" is Bound`},
		{"recreated volume", &reclaimerv1.ReclaimRequest{VolumeName: "bound", VolumeUid: "old"}, codes.FailedPrecondition, "recreated"},
		{"bound volume", &reclaimerv1.ReclaimRequest{VolumeName: "bound"}, codes.FailedPrecondition, `volume "bound" is Bound: only a Released or Failed volume is reclaimed`},
		{"no claimRef", &reclaimerv1.ReclaimRequest{VolumeName: "noref"}, codes.FailedPrecondition, "no claimRef"},
		{"unknown policy", &reclaimerv1.ReclaimRequest{VolumeName: "shred"}, codes.FailedPrecondition, "set spec.persistentVolumeReclaimPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Reclaim(ctx, tc.req)
			wantCode(t, "Reclaim", err, tc.code, tc.msg)
		})
	}
	_, err := s.GetReclaim(ctx, &reclaimerv1.GetReclaimRequest{})
	wantCode(t, "GetReclaim without a name", err, codes.InvalidArgument, "volume_name is required")
	_, err = s.GetReclaim(ctx, &reclaimerv1.GetReclaimRequest{VolumeName: "nope"})
	wantCode(t, "GetReclaim of an unknown volume", err, codes.NotFound, "no reclaim of volume")
	_, err = s.ListReclaims(ctx, &reclaimerv1.ListReclaimsRequest{State: 42})
	wantCode(t, "ListReclaims in an unknown state", err, codes.InvalidArgument, "state 42 is unknown")
	_, err = s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{})
	wantCode(t, "RetryReclaim without a name", err, codes.InvalidArgument, "volume_name is required")
	_, err = s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "nope"})
	wantCode(t, "RetryReclaim of an unknown volume", err, codes.FailedPrecondition, "no reclaim of it is journaled: nothing to retry")
	_, err = s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "bound"})
	wantCode(t, "RetryReclaim of a Bound volume", err, codes.FailedPrecondition, `volume "bound" is Bound`)
	_, err = s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "Bad_Name"})
	wantCode(t, "RetryReclaim with an invalid name", err, codes.InvalidArgument, `volume_name "Bad_Name" is not a valid name`)
}

// Reclaim, Get, List and Retry through the API of two replicas sharing a
// journal: the one not holding a reclaim reports it and passes a retry on
// to the holder.
func TestServerAcrossReplicas(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	a := newReplica(t, "a", kc, j, nil, config{})
	b := newReplica(t, "b", kc, j, nil, config{})
	sa := &server{c: a.controller}
	addr := serve(t, sa)
	sb := &server{c: b.controller, tls: grpcutil.TLSFiles{InsecurePlaintext: true}, peer: func(_ context.Context, id string) (string, error) {
		if id == "a" {
			return addr, nil
		}
		return "", nil
	}}
	ctx := t.Context()
	kept := releasedPV("kept", corev1.PersistentVolumeReclaimRetain)
	failing := releasedPV("failing", corev1.PersistentVolumeReclaimDelete)
	kc.addPV(kept)
	kc.addPV(failing)
	for _, v := range []*corev1.PersistentVolume{kept, failing} {
		if _, err := sa.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: v.Name, Volume: encoded(t, v)}); err != nil {
			t.Fatal(err)
		}
	}
	// Not FAILED yet: no retry.
	_, err := sa.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "failing"})
	wantCode(t, "retry of a PENDING reclaim", err, codes.FailedPrecondition, "only a FAILED reclaim can be retried")
	a.step(t, "failing")

	got, err := sb.GetReclaim(ctx, &reclaimerv1.GetReclaimRequest{VolumeName: "failing"})
	if err != nil || got.Reclaim.State != reclaimerv1.State_STATE_FAILED || got.Reclaim.Owner != "a" {
		t.Fatalf("b's view of a's reclaim: %v %v", got, err)
	}
	list, err := sb.ListReclaims(ctx, &reclaimerv1.ListReclaimsRequest{State: reclaimerv1.State_STATE_FAILED})
	if err != nil || len(list.Reclaims) != 1 || list.Reclaims[0].VolumeName != "failing" {
		t.Fatalf("b's list: %v %v", list, err)
	}
	list, err = sa.ListReclaims(ctx, &reclaimerv1.ListReclaimsRequest{})
	if err != nil || len(list.Reclaims) != 2 || list.Reclaims[1].State != reclaimerv1.State_STATE_RETAINED {
		t.Fatalf("a's list: %v %v", list, err)
	}
	_, err = sa.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "kept"})
	wantCode(t, "retry of a RETAINED reclaim", err, codes.FailedPrecondition, `reclaim policy "Retain", which does not ask for this`)

	// Retried through b, carried out by a.
	retried, err := sb.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "failing"})
	if err != nil || retried.Reclaim.State != reclaimerv1.State_STATE_PENDING || retried.Reclaim.Owner != "a" {
		t.Fatalf("retry through b: %v %v", retried, err)
	}
	if a.queue.Len() != 1 {
		t.Errorf("a did not queue the retry (queue %d)", a.queue.Len())
	}

	// a stops; b takes the orphaned reclaim over on a retry.
	a.handle(ctx, "failing")
	j.expire("a")
	sb.peer = nil
	retried, err = sb.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "failing"})
	if err != nil || retried.Reclaim.Owner != "b" || b.heldRecord("failing") == nil {
		t.Fatalf("retry of an orphaned reclaim: %v %v", retried, err)
	}
}

func serve(t *testing.T, s reclaimerv1.ReclaimerServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	reclaimerv1.RegisterReclaimerServiceServer(g, s)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// TestReclaimOfAHeldRelease: a Reclaim of the very release this replica
// holds is answered from memory, without reading the API server; any
// other request (another claim UID, policy, phase or volume UID, or no
// volume sent) takes the full path, which reads the volume: here it is
// Bound, so the full path refuses where the shortcut would answer.
func TestReclaimOfAHeldRelease(t *testing.T) {
	kc, j := newFakeCluster(), newFakeJournal()
	s := &server{c: newReplica(t, "me", kc, j, nil, config{}).controller}
	kc.addPV(releasedPV("held", corev1.PersistentVolumeReclaimDelete, withCSI("csi.example.com"),
		func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeBound }))
	s.c.entries["held"] = &entry{held: true, rec: &reclaimerv1.Reclaim{VolumeName: "held", VolumeUid: "uid-held", ClaimUid: "claim-uid",
		Policy: string(corev1.PersistentVolumeReclaimDelete), Owner: "me", State: reclaimerv1.State_STATE_RUNNING}}
	same := releasedPV("held", corev1.PersistentVolumeReclaimDelete, withCSI("csi.example.com"))
	for _, tc := range []struct {
		name string
		req  *reclaimerv1.ReclaimRequest
		ok   bool
		msg  string // of the full path's refusal; `volume "held" is Bound` when empty
	}{
		{"the held release", &reclaimerv1.ReclaimRequest{VolumeName: "held", VolumeUid: "uid-held", Volume: encoded(t, same)}, true, ""},
		{"the held release, uid from the volume", &reclaimerv1.ReclaimRequest{VolumeName: "held", Volume: encoded(t, same)}, true, ""},
		{"another claim", &reclaimerv1.ReclaimRequest{VolumeName: "held", Volume: encoded(t, releasedPV("held", corev1.PersistentVolumeReclaimDelete,
			func(v *corev1.PersistentVolume) { v.Spec.ClaimRef.UID = "other" }))}, false, ""},
		{"no claim UID", &reclaimerv1.ReclaimRequest{VolumeName: "held", Volume: encoded(t, releasedPV("held", corev1.PersistentVolumeReclaimDelete,
			func(v *corev1.PersistentVolume) { v.Spec.ClaimRef.UID = "" }))}, false, ""},
		{"another policy", &reclaimerv1.ReclaimRequest{VolumeName: "held", Volume: encoded(t, releasedPV("held", corev1.PersistentVolumeReclaimRecycle))}, false, ""},
		{"sent Bound", &reclaimerv1.ReclaimRequest{VolumeName: "held", Volume: encoded(t, releasedPV("held", corev1.PersistentVolumeReclaimDelete,
			func(v *corev1.PersistentVolume) { v.Status.Phase = corev1.VolumeBound }))}, false, ""},
		{"another volume UID", &reclaimerv1.ReclaimRequest{VolumeName: "held", Volume: encoded(t, releasedPV("held", corev1.PersistentVolumeReclaimDelete,
			func(v *corev1.PersistentVolume) { v.UID = "uid-other" }))}, false, "it was recreated"},
		{"no volume sent", &reclaimerv1.ReclaimRequest{VolumeName: "held", VolumeUid: "uid-held"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := s.Reclaim(t.Context(), tc.req)
			if !tc.ok {
				if tc.msg == "" {
					tc.msg = `volume "held" is Bound`
				}
				wantCode(t, "Reclaim", err, codes.FailedPrecondition, tc.msg)
				return
			}
			if err != nil || resp.GetReclaim().GetOwner() != "me" || resp.GetReclaim().GetState() != reclaimerv1.State_STATE_RUNNING {
				t.Fatalf("Reclaim = %v, %v; want the held record", resp, err)
			}
		})
	}
}
