package conformance

import (
	"fmt"
	"slices"
	"sort"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

func reclaimerChecks() []Check {
	kube := []string{"kube"}
	return []Check{
		{Name: "reclaim-invalid-argument", run: checkReclaimInvalid,
			Doc: "Reclaim answers InvalidArgument for no volume_name, an invalid name, volume bytes that are not Kubernetes protobuf, a volume in the request of another name, and a volume_uid that is not the sent volume's UID."},
		{Name: "get-reclaim-errors", run: checkGetReclaimErrors,
			Doc: "GetReclaim answers InvalidArgument for an invalid volume name and NotFound for a volume it knows no reclaim of."},
		{Name: "list-reclaims", run: checkListReclaims,
			Doc: "ListReclaims answers InvalidArgument for an unknown state; without a state it lists reclaims in volume name order."},
		{Name: "retry-reclaim-errors", run: checkRetryErrors,
			Doc: "RetryReclaim answers InvalidArgument for no or an invalid volume name, and FailedPrecondition for a volume that does not exist and has no reclaim."},
		{Name: "reclaim-unknown-volume", run: checkReclaimUnknown,
			Doc: "Reclaim of a volume that does not exist (and has no journaled reclaim) is NotFound (the proto) or FailedPrecondition (the README): the two documents differ, the suite accepts either."},
		{Name: "reclaim-not-released", Needs: kube, run: checkReclaimNotReleased,
			Doc: "Reclaim of a volume that is not Released or Failed is FailedPrecondition, also when the request carries a forged Released copy of it (the volume is not touched), and so is a volume_uid that is not the volume's (recreated)."},
		{Name: "reclaim-retain", Needs: kube, run: checkReclaimRetain,
			Doc: "Reclaim of a Released volume with policy Retain answers the reclaim (volume name and UID, policy, the released claim) and reaches RETAINED with method NONE; asked again it answers the same reclaim; GetReclaim and ListReclaims (with state RETAINED, not with FAILED) show it; RetryReclaim is FailedPrecondition; the volume stays, Released."},
		{Name: "reclaim-skipped", Needs: kube, run: checkReclaimSkipped,
			Doc: "A Released volume with policy Delete provisioned by a provisioner nobody serves (pv.kubernetes.io/provisioned-by) is left to its own deleter: SKIPPED, method NONE; the volume stays."},
		{Name: "reclaim-failed-retry", Needs: kube, run: checkReclaimFailedRetry,
			Doc: "A Released volume with policy Delete that nothing can delete (NFS, as in Kubernetes, has no deleter) reaches FAILED, the volume goes Failed with a VolumeFailedDelete Event; RetryReclaim of the FAILED reclaim answers the reclaim."},
		{Name: "reclaim-delete", Needs: []string{"kube", "provisioner-address", "provisioner-name"}, run: checkReclaimDelete,
			Doc: "A volume provisioned through --provisioner-address for a claim that is then deleted (the volume Released, policy Delete) is reclaimed: the reclaim reaches SUCCEEDED with method PROVISIONER and data_removed, the PersistentVolume is deleted, the backing volume too (with --csi-endpoint)."},
	}
}

func (t *T) reclaimer() reclaimerv1.ReclaimerServiceClient {
	return reclaimerv1.NewReclaimerServiceClient(t.s.conn)
}

func checkReclaimInvalid(t *T) {
	const uid = "9b4a1a8e-0000-4000-8000-000000000011"
	named := func(name, uid string) []byte {
		return mustEncode(t, &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(uid)}})
	}
	for _, tc := range []struct {
		what string
		req  *reclaimerv1.ReclaimRequest
	}{
		{"an empty request", &reclaimerv1.ReclaimRequest{}},
		{"an invalid volume_name", &reclaimerv1.ReclaimRequest{VolumeName: "not a name!"}},
		{"volume bytes that are not a PersistentVolume", &reclaimerv1.ReclaimRequest{VolumeName: "conformance-absent", Volume: garbage}},
		{"a volume in the request of another name", &reclaimerv1.ReclaimRequest{VolumeName: "conformance-absent", Volume: named("another-volume", uid)}},
		{"a volume_uid that is not the sent volume's", &reclaimerv1.ReclaimRequest{VolumeName: "conformance-absent", VolumeUid: "9b4a1a8e-0000-4000-8000-000000000012", Volume: named("conformance-absent", uid)}},
	} {
		resp, err := t.reclaimer().Reclaim(t.ctx, tc.req)
		if expectCode(t, "Reclaim with "+tc.what, err, codes.InvalidArgument) || err != nil {
			continue
		}
		t.Errorf("Reclaim with %s answered %v", tc.what, resp)
	}
}

func checkGetReclaimErrors(t *T) {
	_, err := t.reclaimer().GetReclaim(t.ctx, &reclaimerv1.GetReclaimRequest{VolumeName: "not a name!"})
	expectCode(t, "GetReclaim of an invalid name", err, codes.InvalidArgument)
	_, err = t.reclaimer().GetReclaim(t.ctx, &reclaimerv1.GetReclaimRequest{VolumeName: t.s.name("absent")})
	expectCode(t, "GetReclaim of a volume with no reclaim", err, codes.NotFound)
}

func checkListReclaims(t *T) {
	_, err := t.reclaimer().ListReclaims(t.ctx, &reclaimerv1.ListReclaimsRequest{State: reclaimerv1.State(99)})
	expectCode(t, "ListReclaims of an unknown state", err, codes.InvalidArgument)
	resp, err := t.reclaimer().ListReclaims(t.ctx, &reclaimerv1.ListReclaimsRequest{})
	if err != nil {
		t.Fatalf("ListReclaims: %s", describe(err))
	}
	names := make([]string, len(resp.GetReclaims()))
	for i, r := range resp.GetReclaims() {
		names[i] = r.GetVolumeName()
	}
	if !sort.StringsAreSorted(names) {
		t.Errorf("ListReclaims is not in volume name order: %v", names)
	}
}

func checkRetryErrors(t *T) {
	for _, tc := range []struct {
		what, name string
		want       codes.Code
	}{
		{"no volume_name", "", codes.InvalidArgument},
		{"an invalid volume_name", "not a name!", codes.InvalidArgument},
		{"a volume that does not exist and has no reclaim", t.s.name("absent"), codes.FailedPrecondition},
	} {
		_, err := t.reclaimer().RetryReclaim(t.ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: tc.name})
		expectCode(t, "RetryReclaim of "+tc.what, err, tc.want)
	}
}

func checkReclaimUnknown(t *T) {
	_, err := t.reclaimer().Reclaim(t.ctx, &reclaimerv1.ReclaimRequest{VolumeName: t.s.name("absent")})
	expectCode(t, "Reclaim of a volume that does not exist", err, codes.NotFound, codes.FailedPrecondition)
}

// releasedVolume creates a volume of policy whose claimRef names a claim
// that does not exist, Released as Kubernetes leaves it when its claim
// goes; change changes it before it is created.
func (t *T) releasedVolume(policy corev1.PersistentVolumeReclaimPolicy, change func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	ns := t.namespace()
	v := t.newVolume(t.s.name("pv"), t.s.name("class"), "1Mi")
	v.Spec.PersistentVolumeReclaimPolicy = policy
	v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: "released", UID: types.UID("9b4a1a8e-0000-4000-8000-000000000013")}
	if change != nil {
		change(v)
	}
	v.Status.Phase = corev1.VolumeReleased
	return t.createVolume(v)
}

// reclaimState waits until GetReclaim of a volume shows one of the states.
func (t *T) reclaimState(name string, states ...reclaimerv1.State) *reclaimerv1.Reclaim {
	var out *reclaimerv1.Reclaim
	t.Eventually(fmt.Sprintf("reclaim of %s in state %v", name, states), func() string {
		resp, err := t.reclaimer().GetReclaim(t.ctx, &reclaimerv1.GetReclaimRequest{VolumeName: name})
		if err != nil {
			return t.retry("GetReclaim", err)
		}
		out = resp.GetReclaim()
		if !slices.Contains(states, out.GetState()) {
			return fmt.Sprintf("state %s (%s)", out.GetState(), out.GetMessage())
		}
		return ""
	})
	return out
}

// checkRecord checks a reclaim names the volume and its release.
func checkRecord(t *T, what string, r *reclaimerv1.Reclaim, v *corev1.PersistentVolume) {
	if r == nil {
		t.Fatalf("%s answered no reclaim", what)
	}
	if r.GetVolumeName() != v.Name || r.GetVolumeUid() != string(v.UID) {
		t.Errorf("%s: reclaim of volume %q (uid %q), want %q (uid %q)", what, r.GetVolumeName(), r.GetVolumeUid(), v.Name, v.UID)
	}
	if r.GetPolicy() != string(v.Spec.PersistentVolumeReclaimPolicy) {
		t.Errorf("%s: policy %q, want %q", what, r.GetPolicy(), v.Spec.PersistentVolumeReclaimPolicy)
	}
	if ref := v.Spec.ClaimRef; ref != nil && (r.GetClaimNamespace() != ref.Namespace || r.GetClaimName() != ref.Name || r.GetClaimUid() != string(ref.UID)) {
		t.Errorf("%s: released claim %s/%s (uid %s), want %s/%s (uid %s)", what, r.GetClaimNamespace(), r.GetClaimName(), r.GetClaimUid(), ref.Namespace, ref.Name, ref.UID)
	}
}

// reclaim calls Reclaim, retrying transient errors.
func (t *T) reclaim(req *reclaimerv1.ReclaimRequest) *reclaimerv1.Reclaim {
	var out *reclaimerv1.Reclaim
	t.Eventually("Reclaim of "+req.GetVolumeName(), func() string {
		resp, err := t.reclaimer().Reclaim(t.ctx, req)
		if err != nil {
			if transient(err) {
				return describe(err)
			}
			t.Fatalf("Reclaim of Released volume %s: %s", req.GetVolumeName(), describe(err))
		}
		out = resp.GetReclaim()
		return ""
	})
	return out
}

func checkReclaimNotReleased(t *T) {
	v := t.newVolume(t.s.name("pv"), t.s.name("class"), "1Mi")
	v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	v = t.createVolume(v)
	_, err := t.reclaimer().Reclaim(t.ctx, &reclaimerv1.ReclaimRequest{VolumeName: v.Name})
	expectCode(t, "Reclaim of a volume that is not Released", err, codes.FailedPrecondition)
	// The request decides nothing: a forged Released copy is refused.
	forged := v.DeepCopy()
	forged.Status.Phase = corev1.VolumeReleased
	_, err = t.reclaimer().Reclaim(t.ctx, &reclaimerv1.ReclaimRequest{VolumeName: v.Name, Volume: mustEncode(t, forged)})
	expectCode(t, "Reclaim with a forged Released copy of a volume that is not Released", err, codes.FailedPrecondition)
	if now := t.getVolume(v.Name); now == nil || now.Status.Phase == corev1.VolumeReleased || now.Status.Phase == corev1.VolumeFailed {
		t.Errorf("a refused Reclaim changed the volume: %v", now)
	}
	r := t.releasedVolume(corev1.PersistentVolumeReclaimRetain, nil)
	_, err = t.reclaimer().Reclaim(t.ctx, &reclaimerv1.ReclaimRequest{VolumeName: r.Name, VolumeUid: "9b4a1a8e-0000-4000-8000-000000000014"})
	expectCode(t, "Reclaim with a volume_uid that is not the volume's", err, codes.FailedPrecondition)
}

func checkReclaimRetain(t *T) {
	v := t.releasedVolume(corev1.PersistentVolumeReclaimRetain, nil)
	req := &reclaimerv1.ReclaimRequest{VolumeName: v.Name, VolumeUid: string(v.UID)}
	checkRecord(t, "Reclaim", t.reclaim(req), v)
	r := t.reclaimState(v.Name, reclaimerv1.State_STATE_RETAINED)
	checkRecord(t, "GetReclaim", r, v)
	if r.GetMethod() != reclaimerv1.Method_METHOD_NONE {
		t.Errorf("reclaim of a Retain volume: method %s, want METHOD_NONE", r.GetMethod())
	}
	again := t.reclaim(req)
	checkRecord(t, "Reclaim again", again, v)
	if again.GetState() != reclaimerv1.State_STATE_RETAINED {
		t.Errorf("Reclaim again: state %s, want RETAINED", again.GetState())
	}
	listed := func(state reclaimerv1.State) bool {
		resp, err := t.reclaimer().ListReclaims(t.ctx, &reclaimerv1.ListReclaimsRequest{State: state})
		if err != nil {
			t.Fatalf("ListReclaims: %s", describe(err))
		}
		return slices.ContainsFunc(resp.GetReclaims(), func(r *reclaimerv1.Reclaim) bool { return r.GetVolumeName() == v.Name })
	}
	if !listed(reclaimerv1.State_STATE_RETAINED) {
		t.Errorf("ListReclaims(STATE_RETAINED) does not list %s", v.Name)
	}
	if listed(reclaimerv1.State_STATE_FAILED) {
		t.Errorf("ListReclaims(STATE_FAILED) lists %s, which is RETAINED", v.Name)
	}
	_, err := t.reclaimer().RetryReclaim(t.ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: v.Name})
	expectCode(t, "RetryReclaim of a RETAINED reclaim", err, codes.FailedPrecondition)
	if now := t.getVolume(v.Name); now == nil || now.Status.Phase != corev1.VolumeReleased {
		t.Errorf("a Retain volume must stay Released: %v", now)
	}
}

func checkReclaimSkipped(t *T) {
	v := t.releasedVolume(corev1.PersistentVolumeReclaimDelete, func(v *corev1.PersistentVolume) {
		metav1.SetMetaDataAnnotation(&v.ObjectMeta, annProvisionedBy, handsOff)
	})
	checkRecord(t, "Reclaim", t.reclaim(&reclaimerv1.ReclaimRequest{VolumeName: v.Name}), v)
	r := t.reclaimState(v.Name, reclaimerv1.State_STATE_SKIPPED)
	if r.GetMethod() != reclaimerv1.Method_METHOD_NONE {
		t.Errorf("a skipped reclaim: method %s, want METHOD_NONE", r.GetMethod())
	}
	if now := t.getVolume(v.Name); now == nil || now.Status.Phase != corev1.VolumeReleased {
		t.Errorf("a volume left to another deleter must stay Released: %v", now)
	}
}

func checkReclaimFailedRetry(t *T) {
	v := t.releasedVolume(corev1.PersistentVolumeReclaimDelete, func(v *corev1.PersistentVolume) {
		v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.conformance.invalid", Path: "/exports/absent"}}
	})
	checkRecord(t, "Reclaim", t.reclaim(&reclaimerv1.ReclaimRequest{VolumeName: v.Name}), v)
	r := t.reclaimState(v.Name, reclaimerv1.State_STATE_FAILED)
	checkRecord(t, "GetReclaim", r, v)
	t.Eventually("volume "+v.Name+" Failed with a VolumeFailedDelete Event", func() string {
		now := t.getVolume(v.Name)
		if now == nil {
			t.Fatalf("volume %s, which nothing can delete, is gone", v.Name)
		}
		if now.Status.Phase != corev1.VolumeFailed {
			return "phase " + string(now.Status.Phase)
		}
		if evs := t.volumeEvents(v.Name); !hasReason(evs, "VolumeFailedDelete") {
			return fmt.Sprintf("events %q", evs)
		}
		return ""
	})
	var retried *reclaimerv1.Reclaim
	t.Eventually("RetryReclaim of the FAILED reclaim of "+v.Name, func() string {
		resp, err := t.reclaimer().RetryReclaim(t.ctx, &reclaimerv1.RetryReclaimRequest{VolumeName: v.Name})
		switch {
		case err == nil:
			retried = resp.GetReclaim()
			return ""
		case transient(err):
			return describe(err)
		}
		t.Fatalf("RetryReclaim of a FAILED reclaim: %s", describe(err))
		return ""
	})
	if retried.GetVolumeName() != v.Name {
		t.Errorf("RetryReclaim answered the reclaim of %q, want %q", retried.GetVolumeName(), v.Name)
	}
}

func checkReclaimDelete(t *T) {
	cc, err := t.s.provisionerConn()
	if err != nil {
		t.Fatalf("dial the provisioner: %v", err)
	}
	pc := provisionerv1.NewProvisionerServiceClient(cc)
	d := pickDriverOf(t, pc)
	ns := t.namespace()
	p := t.provisionClaim(pc, ns, "reclaim-delete", d)
	v := p.volume
	t.deleteClaimWait(ns, p.claim.Name)
	t.setPhase(v.Name, corev1.VolumeReleased)
	r, err := t.reclaimer().Reclaim(t.ctx, &reclaimerv1.ReclaimRequest{VolumeName: v.Name, VolumeUid: string(v.UID)})
	switch {
	case err == nil:
		checkRecord(t, "Reclaim", r.GetReclaim(), v)
	case t.getVolume(v.Name) == nil:
		// Another caller (the binder) handed it over first, and it is
		// done already.
	default:
		t.Fatalf("Reclaim of Released volume %s: %s", v.Name, describe(err))
	}
	done := t.reclaimState(v.Name, reclaimerv1.State_STATE_SUCCEEDED)
	if done.GetMethod() != reclaimerv1.Method_METHOD_PROVISIONER || !done.GetDataRemoved() {
		t.Errorf("reclaim of a provisioned volume: method %s, data_removed %v; want METHOD_PROVISIONER and true", done.GetMethod(), done.GetDataRemoved())
	}
	t.Eventually("PersistentVolume "+v.Name+" deleted", func() string {
		if t.getVolume(v.Name) != nil {
			return "still there"
		}
		return ""
	})
	if exists, ok := t.backingExists(v.Spec.CSI.VolumeHandle); ok && exists {
		t.Errorf("the reclaim SUCCEEDED, but the driver still lists volume %q", v.Spec.CSI.VolumeHandle)
	}
}

// pickDriverOf is the ready driver of Config.ProvisionerName that pc
// serves.
func pickDriverOf(t *T, pc provisionerv1.ProvisionerServiceClient) *provisionerv1.Driver {
	var d *provisionerv1.Driver
	t.Eventually("provisioner "+t.s.cfg.ProvisionerName+" ready", func() string {
		resp, err := pc.ListDrivers(t.ctx, &provisionerv1.ListDriversRequest{})
		if err != nil {
			return t.retry("ListDrivers", err)
		}
		if d = pickDriver(resp.GetDrivers(), t.s.cfg.ProvisionerName); d == nil || !d.GetReady() {
			return fmt.Sprintf("no ready driver of %q in %v", t.s.cfg.ProvisionerName, resp.GetDrivers())
		}
		return ""
	})
	return d
}
