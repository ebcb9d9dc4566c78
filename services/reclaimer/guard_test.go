package reclaimer

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/kube"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Every way a caller could get Reclaim to destroy a volume's data, each
// refused with FailedPrecondition before anything is journaled or the
// provisioner is asked.
func TestReclaimGuards(t *testing.T) {
	boundPV := func(name string) *corev1.PersistentVolume {
		return releasedPV(name, corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver), func(v *corev1.PersistentVolume) {
			v.Status.Phase = corev1.VolumeBound
		})
	}
	for _, tc := range []struct {
		name   string
		api    *corev1.PersistentVolume // in the API server
		claims []*corev1.PersistentVolumeClaim
		sent   *corev1.PersistentVolume // in the request
		uid    string
		msg    string
	}{
		{name: "forged as Released, Bound in the API", api: boundPV("v"),
			sent: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver)), msg: `volume "v" is Bound`},
		{name: "forged as Released with another handle", api: boundPV("v"),
			sent: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI("other.example.com")), msg: `is Bound`},
		{name: "forged with the API's UID", api: boundPV("v"), uid: "uid-v",
			sent: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver)), msg: `is Bound`},
		{name: "forged with another UID", api: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver)),
			sent: releasedPV("v", corev1.PersistentVolumeReclaimDelete, func(v *corev1.PersistentVolume) { v.UID = "other" }), msg: `it was recreated`},
		{name: "name only, Bound", api: boundPV("v"), msg: `is Bound`},
		{name: "live claim by claimRef", api: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver)),
			claims: []*corev1.PersistentVolumeClaim{claim("ns", "data", "claim-uid", "v")}, msg: "claim ns/data (uid claim-uid) still exists"},
		{name: "live claim by claimRef, recycle", api: releasedPV("v", corev1.PersistentVolumeReclaimRecycle),
			claims: []*corev1.PersistentVolumeClaim{claim("ns", "data", "claim-uid", "")}, msg: "still exists"},
		{name: "live claim by spec.volumeName", api: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver)),
			claims: []*corev1.PersistentVolumeClaim{claim("elsewhere", "mine", "m-uid", "v")}, msg: "claim elsewhere/mine (uid m-uid) asks for this volume"},
		{name: "claim recreated with the same name asking for it", api: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver)),
			claims: []*corev1.PersistentVolumeClaim{claim("ns", "data", "new-uid", "v")}, msg: "claim ns/data (uid new-uid) asks for this volume"},
		{name: "gone", sent: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver)), msg: `volume "v" does not exist and no reclaim of it is journaled`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
			p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
			r := newReplica(t, "me", kc, j, p, config{})
			if tc.api != nil {
				kc.addPV(tc.api)
			}
			for _, c := range tc.claims {
				kc.addPVC(c)
			}
			req := &reclaimerv1.ReclaimRequest{VolumeName: "v", VolumeUid: tc.uid}
			if tc.sent != nil {
				req.Volume = encoded(t, tc.sent)
			}
			_, err := (&server{c: r.controller}).Reclaim(t.Context(), req)
			wantCode(t, "Reclaim", err, codes.FailedPrecondition, tc.msg)
			if j.len() != 0 || r.queue.Len() != 0 {
				t.Errorf("a refused reclaim was journaled (%d) or queued (%d)", j.len(), r.queue.Len())
			}
			for r.queue.Len() > 0 {
				r.handle(t.Context(), "v")
			}
			if p.calls() != 0 {
				t.Errorf("the provisioner was asked to delete %d times", p.calls())
			}
		})
	}
}

// Retain destroys nothing: Reclaim records it (the binder hands every
// Released volume over) and a retry of it is refused.
func TestReclaimOfRetainIsOnlyRecorded(t *testing.T) {
	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	r := newReplica(t, "me", kc, j, p, config{})
	v := releasedPV("v", corev1.PersistentVolumeReclaimRetain, withCSI(devDriver))
	kc.addPV(v)
	s := &server{c: r.controller}
	resp, err := s.Reclaim(t.Context(), &reclaimerv1.ReclaimRequest{VolumeName: "v", Volume: encoded(t, releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver)))})
	if err != nil || resp.Reclaim.State != reclaimerv1.State_STATE_RETAINED {
		t.Fatalf("Reclaim of a Retain volume sent as Delete: %v %v", resp, err)
	}
	_, err = s.RetryReclaim(t.Context(), &reclaimerv1.RetryReclaimRequest{VolumeName: "v"})
	wantCode(t, "RetryReclaim", err, codes.FailedPrecondition, `reclaim policy "Retain"`)
	if j.len() != 0 || p.calls() != 0 {
		t.Errorf("journal %d, provisioner calls %d", j.len(), p.calls())
	}
}

// A FAILED reclaim is retried only while the volume, as the API server has
// it, still allows it; a volume gone is retried only from its journaled
// reclaim (which then ends without touching data).
func TestRetryReclaimGuards(t *testing.T) {
	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_NO_CHANGE, Message: "disk busy"}, nil)
	r := newReplica(t, "me", kc, j, p, config{})
	s := &server{c: r.controller}
	ctx := t.Context()
	v := releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver))
	kc.addPV(v)
	if _, err := s.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: "v"}); err != nil {
		t.Fatal(err)
	}
	if rec := r.step(t, "v"); rec.State != reclaimerv1.State_STATE_FAILED || p.calls() != 1 {
		t.Fatalf("record %v, calls %d", rec, p.calls())
	}

	kc.addPVC(claim("other", "wants-it", "w-uid", "v"))
	_, err := s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "v"})
	wantCode(t, "retry with a live claim by spec.volumeName", err, codes.FailedPrecondition, "other/wants-it (uid w-uid) asks for this volume")
	kc.deletePVC("other", "wants-it")

	kc.addPVC(claim("ns", "data", "claim-uid", ""))
	_, err = s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "v"})
	wantCode(t, "retry with the released claim back", err, codes.FailedPrecondition, "claim ns/data (uid claim-uid) still exists")
	kc.deletePVC("ns", "data")

	// Bound again (in the API server): no retry.
	cur := kc.pv("v")
	cur.Status.Phase = corev1.VolumeBound
	if _, err := kc.UpdateVolumeStatus(ctx, cur); err != nil {
		t.Fatal(err)
	}
	_, err = s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "v"})
	wantCode(t, "retry of a Bound volume", err, codes.FailedPrecondition, `volume "v" is Bound`)
	if p.calls() != 1 {
		t.Fatalf("the provisioner was asked again: %d", p.calls())
	}

	// Gone, with its reclaim journaled: the retry ends the reclaim.
	kc.mu.Lock()
	delete(kc.pvs, "v")
	kc.mu.Unlock()
	resp, err := s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "v"})
	if err != nil || resp.Reclaim.State != reclaimerv1.State_STATE_PENDING {
		t.Fatalf("retry of a journaled reclaim of a volume gone: %v %v", resp, err)
	}
	if rec := r.step(t, "v"); rec.State != reclaimerv1.State_STATE_CANCELLED || p.calls() != 1 {
		t.Fatalf("record %v, calls %d", rec, p.calls())
	}
	_, err = s.RetryReclaim(ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: "v"})
	wantCode(t, "retry of a volume gone, reclaim ended", err, codes.FailedPrecondition, "")
}

// A Reclaim refused for a live claim says why in GetReclaim, and the next
// Reclaim, once the claim is gone, starts the reclaim.
func TestRefusedReclaimIsVisibleAndRetried(t *testing.T) {
	kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
	p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
	r := newReplica(t, "me", kc, j, p, config{})
	s := &server{c: r.controller}
	ctx := t.Context()
	kc.addPV(releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver)))
	kc.addPVC(claim("ns", "data", "new-uid", "v"))
	_, err := s.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: "v"})
	wantCode(t, "Reclaim", err, codes.FailedPrecondition, "asks for this volume")
	got, err := s.GetReclaim(ctx, &reclaimerv1.GetReclaimRequest{VolumeName: "v"})
	if err != nil || got.Reclaim.State != reclaimerv1.State_STATE_PENDING || !strings.Contains(got.Reclaim.Message, "refused") || !strings.Contains(got.Reclaim.Message, "asks for this volume") {
		t.Fatalf("GetReclaim after a refusal: %v %v", got, err)
	}
	kc.deletePVC("ns", "data")
	resp, err := s.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: "v"})
	if err != nil || resp.Reclaim.Owner != "me" || j.len() != 1 {
		t.Fatalf("Reclaim once the claim is gone: %v %v (journal %d)", resp, err, j.len())
	}
	if rec := r.step(t, "v"); rec.State != reclaimerv1.State_STATE_SUCCEEDED || p.calls() != 1 {
		t.Fatalf("record %v, calls %d", rec, p.calls())
	}
}

// A volume's claim bound to another volume releases it, as
// kube-controller-manager's isVolumeReleased has it. When nothing can
// delete or recycle the volume (a plan that only marks it Failed, touching
// no data) that is enough: the volume goes Failed with Kubernetes' Event,
// as upstream, and RetryReclaim may retry it. A volume another deleter
// owns is only recorded (SKIPPED), as for any claim. A plan that would
// destroy data is still refused while the claim exists, and so is a
// volume whose claim still has it (or nothing yet).
func TestAClaimBoundElsewhereReleasesAVolumeNothingDeletes(t *testing.T) {
	hostPath := func(v *corev1.PersistentVolume) {
		withProvisionedBy(kube.PluginHostPath)(v)
		withHostPath("/data/" + v.Name)(v)
	}
	for _, tc := range []struct {
		name   string
		pv     *corev1.PersistentVolume
		claim  *corev1.PersistentVolumeClaim
		refuse string // "" accepted
		// skipped: accepted, its own deleter's (nothing done here).
		skipped bool
		event   string // after a step
		phase   corev1.PersistentVolumePhase
	}{
		{name: "host-path provisioned, Delete, claim bound elsewhere", pv: releasedPV("v", corev1.PersistentVolumeReclaimDelete, hostPath),
			claim: claim("ns", "data", "claim-uid", "w"),
			event: "Warning VolumeFailedDelete host_path deleter only supports /tmp/.+ but received provided /data/v", phase: corev1.VolumeFailed},
		{name: "no recycler, claim bound elsewhere", pv: releasedPV("v", corev1.PersistentVolumeReclaimRecycle, withCSI("ebs.csi.aws.com")),
			claim: claim("ns", "data", "claim-uid", "w"),
			event: "Warning VolumeFailedRecycle No recycler plugin found for the volume!", phase: corev1.VolumeFailed},
		{name: "another provisioner's volume, claim bound elsewhere", pv: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withProvisionedBy("example.com/other")),
			claim: claim("ns", "data", "claim-uid", "w"), skipped: true},
		{name: "host-path provisioned, claim bound to this volume", pv: releasedPV("v", corev1.PersistentVolumeReclaimDelete, hostPath),
			claim: claim("ns", "data", "claim-uid", "v"), refuse: "claim ns/data (uid claim-uid) still exists and is not bound to another volume"},
		{name: "host-path provisioned, claim not bound yet", pv: releasedPV("v", corev1.PersistentVolumeReclaimDelete, hostPath),
			claim: claim("ns", "data", "claim-uid", ""), refuse: "still exists and is not bound to another volume"},
		{name: "CSI volume deleted through the provisioner, claim bound elsewhere", pv: releasedPV("v", corev1.PersistentVolumeReclaimDelete, withCSI(devDriver), withProvisionedBy(devDriver)),
			claim: claim("ns", "data", "claim-uid", "w"), refuse: "claim ns/data (uid claim-uid) still exists"},
		{name: "scrub, claim bound elsewhere", pv: releasedPV("v", corev1.PersistentVolumeReclaimRecycle),
			claim: claim("ns", "data", "claim-uid", "w"), refuse: "claim ns/data (uid claim-uid) still exists"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kc, j, p := newFakeCluster(), newFakeJournal(), servedDev()
			p.answer(&provisionerv1.DeleteVolumeResponse{Outcome: provisionerv1.Outcome_OUTCOME_FINISHED}, nil)
			r := newReplica(t, "me", kc, j, p, config{})
			s := &server{c: r.controller}
			kc.addPV(tc.pv)
			kc.addPVC(tc.claim)
			_, err := s.Reclaim(t.Context(), &reclaimerv1.ReclaimRequest{VolumeName: "v"})
			if tc.refuse != "" {
				wantCode(t, "Reclaim", err, codes.FailedPrecondition, tc.refuse)
				if j.len() != 0 || r.queue.Len() != 0 {
					t.Errorf("a refused reclaim was journaled (%d) or queued (%d)", j.len(), r.queue.Len())
				}
				if got := kc.pv("v"); got == nil || got.Status.Phase != corev1.VolumeReleased {
					t.Errorf("volume after a refusal: %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Reclaim: %v", err)
			}
			if tc.skipped {
				rec, err := s.GetReclaim(t.Context(), &reclaimerv1.GetReclaimRequest{VolumeName: "v"})
				if err != nil || rec.Reclaim.State != reclaimerv1.State_STATE_SKIPPED || j.len() != 0 || r.queue.Len() != 0 {
					t.Errorf("record %v (%v), journal %d, queue %d", rec, err, j.len(), r.queue.Len())
				}
				if got := kc.pv("v"); got == nil || got.Status.Phase != corev1.VolumeReleased {
					t.Errorf("volume %+v", got)
				}
				return
			}
			rec := r.step(t, "v")
			if rec.State != reclaimerv1.State_STATE_FAILED || rec.Method != reclaimerv1.Method_METHOD_UNSUPPORTED {
				t.Errorf("record %v", rec)
			}
			got := kc.pv("v")
			if got == nil || got.Status.Phase != tc.phase || got.Spec.ClaimRef == nil {
				t.Fatalf("volume %+v, want it %s with its claimRef", got, tc.phase)
			}
			if events := r.drain(); !slices.Equal(events, []string{tc.event}) {
				t.Errorf("events %q, want %q", events, tc.event)
			}
			if p.calls() != 0 || len(r.scrubs) != 0 {
				t.Errorf("DeleteVolume calls %d, scrubs %v", p.calls(), r.scrubs)
			}
			if _, err := s.RetryReclaim(t.Context(), &reclaimerv1.RetryReclaimRequest{VolumeName: "v"}); err != nil {
				t.Errorf("RetryReclaim of the Failed volume: %v", err)
			}
		})
	}
}
