package conformance

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

func checkDeleteNotServed(t *T) {
	nfs := t.releasedVolume(corev1.PersistentVolumeReclaimDelete, func(v *corev1.PersistentVolume) {
		metav1.SetMetaDataAnnotation(&v.ObjectMeta, annProvisionedBy, handsOff)
		v.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.conformance.invalid", Path: "/exports/absent"}}
	})
	other := t.releasedVolume(corev1.PersistentVolumeReclaimDelete, func(v *corev1.PersistentVolume) {
		metav1.SetMetaDataAnnotation(&v.ObjectMeta, annProvisionedBy, handsOff)
	})
	for _, tc := range []struct{ what, name string }{{"an NFS volume", nfs.Name}, {"a CSI volume of a driver not served", other.Name}} {
		_, err := t.provisioner().DeleteVolume(t.ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: tc.name})
		expectCode(t, "DeleteVolume of "+tc.what, err, codes.FailedPrecondition)
	}
}

func checkDeleteInvalid(t *T) {
	other := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "another-volume"}}
	for _, tc := range []struct {
		what string
		req  *provisionerv1.DeleteVolumeRequest
	}{
		{"an empty request", &provisionerv1.DeleteVolumeRequest{}},
		{"an invalid volume_name", &provisionerv1.DeleteVolumeRequest{VolumeName: "not a name!"}},
		{"volume bytes that are not a PersistentVolume", &provisionerv1.DeleteVolumeRequest{VolumeName: "conformance-absent", Volume: garbage}},
		{"a volume in the request of another name", &provisionerv1.DeleteVolumeRequest{VolumeName: "conformance-absent", Volume: mustEncode(t, other)}},
	} {
		resp, err := t.provisioner().DeleteVolume(t.ctx, tc.req)
		if expectCode(t, "DeleteVolume with "+tc.what, err, codes.InvalidArgument) || err != nil {
			continue
		}
		t.Errorf("DeleteVolume with %s answered %v", tc.what, resp)
	}
}

func checkDeleteUnknown(t *T) {
	_, err := t.provisioner().DeleteVolume(t.ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: t.s.name("absent")})
	expectCode(t, "DeleteVolume of a PersistentVolume that does not exist", err, codes.FailedPrecondition)
}

func checkDeleteLifecycle(t *T) {
	ns := t.namespace()
	d := t.driver()
	pc := t.provisioner()
	p := t.provisionClaim(pc, ns, "lifecycle", d)
	v := p.volume
	handle := v.Spec.CSI.VolumeHandle
	stillThere := func(when string) {
		if t.getVolume(v.Name) == nil {
			t.Fatalf("PersistentVolume %s is gone after %s", v.Name, when)
		}
		if exists, ok := t.backingExists(handle); ok && !exists {
			t.Fatalf("the backing volume %q is gone after %s", handle, when)
		}
	}

	_, err := pc.DeleteVolume(t.ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: v.Name})
	expectCode(t, "DeleteVolume while the claim exists", err, codes.FailedPrecondition)
	stillThere("DeleteVolume while the claim exists")
	// The request decides nothing: a forged copy that says Released is
	// only a hint, the API server's volume is what counts.
	forged := v.DeepCopy()
	forged.Status.Phase, forged.Spec.ClaimRef = corev1.VolumeReleased, nil
	_, err = pc.DeleteVolume(t.ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: v.Name, Volume: mustEncode(t, forged)})
	expectCode(t, "DeleteVolume with a forged Released copy of a volume whose claim exists", err, codes.FailedPrecondition)
	stillThere("DeleteVolume with a forged Released copy")

	// Keep every deleter but this check's calls off the volume, then
	// release it as Kubernetes does when the claim goes.
	t.updateVolume(v.Name, func(pv *corev1.PersistentVolume) {
		metav1.SetMetaDataAnnotation(&pv.ObjectMeta, annProvisionedBy, handsOff)
	})
	t.deleteClaimWait(ns, p.claim.Name)
	t.setPhase(v.Name, corev1.VolumeReleased)

	t.updateVolume(v.Name, func(pv *corev1.PersistentVolume) {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	})
	_, err = pc.DeleteVolume(t.ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: v.Name})
	expectCode(t, "DeleteVolume of a Released volume with policy Retain", err, codes.FailedPrecondition)
	stillThere("DeleteVolume of a volume with policy Retain")
	cur := t.updateVolume(v.Name, func(pv *corev1.PersistentVolume) {
		pv.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
	})

	recreated := cur.DeepCopy()
	recreated.UID = types.UID("9b4a1a8e-0000-4000-8000-000000000004")
	_, err = pc.DeleteVolume(t.ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: v.Name, Volume: mustEncode(t, recreated)})
	expectCode(t, "DeleteVolume with a volume sent of another UID (recreated)", err, codes.FailedPrecondition)
	stillThere("DeleteVolume with a volume of another UID")

	for _, when := range []string{"first", "again (the backing volume is deleted already)"} {
		t.deleteUntilFinished(pc, v.Name, when)
	}
	if t.getVolume(v.Name) == nil {
		t.Errorf("DeleteVolume deleted the PersistentVolume object %s: it deletes only the backing volume", v.Name)
	}
	if exists, ok := t.backingExists(handle); ok && exists {
		t.Errorf("DeleteVolume FINISHED, but the driver still lists volume %q", handle)
	}
	t.noOperation(v.Name)
}

// deleteUntilFinished calls DeleteVolume until it is FINISHED, retrying
// IN_BACKGROUND and transient errors.
func (t *T) deleteUntilFinished(pc provisionerv1.ProvisionerServiceClient, name, when string) {
	t.Eventually("DeleteVolume of "+name+" FINISHED ("+when+")", func() string {
		resp, err := pc.DeleteVolume(t.ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: name})
		if err != nil {
			if transient(err) {
				return t.retry("DeleteVolume", err)
			}
			t.Fatalf("DeleteVolume of Released volume %s with policy Delete (%s): %s", name, when, describe(err))
		}
		checkAnswer(t, "DeleteVolume of "+name, resp.GetOutcome(), resp.GetMessage())
		switch resp.GetOutcome() {
		case provisionerv1.Outcome_OUTCOME_FINISHED:
			return ""
		case provisionerv1.Outcome_OUTCOME_IN_BACKGROUND:
			return "IN_BACKGROUND: " + resp.GetMessage()
		}
		t.Fatalf("DeleteVolume of Released volume %s with policy Delete (%s) answered %s: %s", name, when, resp.GetOutcome(), resp.GetMessage())
		return ""
	})
}

// volumesOf lists the volumes whose claimRef has uid.
func volumesOf(ctx context.Context, c kubernetes.Interface, uid types.UID) []string {
	list, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, v := range list.Items {
		if v.Spec.ClaimRef != nil && v.Spec.ClaimRef.UID == uid {
			out = append(out, v.Name)
		}
	}
	return out
}

// dispose removes a volume provisioned for a claim of the suite's: the
// claim goes, the volume is released (taken from every other deleter) and
// its backing volume deleted through pc, then the object is deleted.
func dispose(ctx context.Context, c kubernetes.Interface, pc provisionerv1.ProvisionerServiceClient, ns, claim, volume string) {
	_ = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		v, err := c.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{})
		if err != nil {
			return nil
		}
		metav1.SetMetaDataAnnotation(&v.ObjectMeta, annProvisionedBy, handsOff)
		v.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimDelete
		_, err = c.CoreV1().PersistentVolumes().Update(ctx, v, metav1.UpdateOptions{})
		return err
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		deleteClaim(ctx, c, ns, claim)
		if _, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		v, err := c.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{})
		if err != nil || v.Status.Phase == corev1.VolumeReleased || v.Status.Phase == corev1.VolumeFailed {
			return nil
		}
		v.Status.Phase = corev1.VolumeReleased
		_, err = c.CoreV1().PersistentVolumes().UpdateStatus(ctx, v, metav1.UpdateOptions{})
		return err
	})
	for time.Now().Before(deadline) {
		resp, err := pc.DeleteVolume(ctx, &provisionerv1.DeleteVolumeRequest{VolumeName: volume})
		if err == nil && resp.GetOutcome() == provisionerv1.Outcome_OUTCOME_FINISHED {
			break
		}
		if err != nil && !transient(err) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	deleteVolume(ctx, c, volume)
}
