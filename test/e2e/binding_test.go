package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/test/harness/e2e"
)

// Each test uses its own storage class name so volumes of one test never
// serve claims of another.

func TestBindBestMatch(t *testing.T) {
	n, cls := ns(t), "best-match"
	createPV(t, "bm-10g", "10Gi", cls)
	createPV(t, "bm-5g", "5Gi", cls)
	createPV(t, "bm-1g", "1Gi", cls)
	// PVs and claims reach the binder through separate watches (as they
	// reach kube-controller-manager): wait until it has seen every volume
	// (it makes them Available), or the claim may come first and get the
	// only volume seen so far.
	for _, v := range []string{"bm-10g", "bm-5g", "bm-1g"} {
		pvPhase(t, v, corev1.VolumeAvailable)
	}
	createPVC(t, n, "data", "3Gi", cls)

	c := pvcPhase(t, n, "data", corev1.ClaimBound)
	if c.Spec.VolumeName != "bm-5g" {
		t.Fatalf("claim bound to %q, want the smallest that fits, bm-5g", c.Spec.VolumeName)
	}
	for _, a := range []string{kube.AnnBindCompleted, kube.AnnBoundByController} {
		if c.Annotations[a] != "yes" {
			t.Errorf("claim annotation %s = %q, want yes", a, c.Annotations[a])
		}
	}
	if got := c.Status.Capacity[corev1.ResourceStorage]; got.String() != "5Gi" {
		t.Errorf("claim capacity %s, want the volume's 5Gi", got.String())
	}
	if len(c.Status.AccessModes) != 1 || c.Status.AccessModes[0] != corev1.ReadWriteOnce {
		t.Errorf("claim access modes %v, want [ReadWriteOnce]", c.Status.AccessModes)
	}
	v := pvPhase(t, "bm-5g", corev1.VolumeBound)
	if v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != c.UID || v.Spec.ClaimRef.Name != "data" {
		t.Fatalf("volume claimRef %+v, want data with UID %s", v.Spec.ClaimRef, c.UID)
	}
	if v.Annotations[kube.AnnBoundByController] != "yes" {
		t.Errorf("volume lacks %s", kube.AnnBoundByController)
	}
	pvPhase(t, "bm-10g", corev1.VolumeAvailable)
	pvPhase(t, "bm-1g", corev1.VolumeAvailable)
}

func TestBindVolumeAddedAfterClaim(t *testing.T) {
	n, cls := ns(t), "late-volume"
	createPVC(t, n, "data", "1Gi", cls)
	pvcPhase(t, n, "data", corev1.ClaimPending)
	// The resync is 10 minutes: only the new volume's event can bind it.
	createPV(t, "late-1g", "1Gi", cls)
	c := pvcPhase(t, n, "data", corev1.ClaimBound)
	if c.Spec.VolumeName != "late-1g" {
		t.Fatalf("bound to %q", c.Spec.VolumeName)
	}
}

func TestBindVolumePreboundByUser(t *testing.T) {
	n, cls := ns(t), "prebound-pv"
	createPV(t, "pb-small", "1Gi", cls)
	createPV(t, "pb-big", "9Gi", cls, withClaimRef(n, "data", ""))
	pvPhase(t, "pb-big", corev1.VolumeAvailable) // pre-bound by name only: Available
	createPVC(t, n, "data", "1Gi", cls)

	c := pvcPhase(t, n, "data", corev1.ClaimBound)
	if c.Spec.VolumeName != "pb-big" {
		t.Fatalf("bound to %q, want the pre-bound pb-big over the smaller pb-small", c.Spec.VolumeName)
	}
	v := pvPhase(t, "pb-big", corev1.VolumeBound)
	if v.Spec.ClaimRef.UID != c.UID {
		t.Fatalf("claimRef UID %q, want %q", v.Spec.ClaimRef.UID, c.UID)
	}
	if annotated(v.ObjectMeta, kube.AnnBoundByController) {
		t.Errorf("a volume the user pre-bound must not get %s", kube.AnnBoundByController)
	}
	if c.Annotations[kube.AnnBoundByController] != "yes" {
		t.Errorf("claim lacks %s", kube.AnnBoundByController)
	}
}

func TestBindClaimPreboundByUser(t *testing.T) {
	n, cls := ns(t), "prebound-claim"
	createPV(t, "pc-small", "1Gi", cls)
	createPV(t, "pc-big", "9Gi", cls)
	createPVC(t, n, "data", "1Gi", cls, wantVolume("pc-big"))

	c := pvcPhase(t, n, "data", corev1.ClaimBound)
	if c.Spec.VolumeName != "pc-big" {
		t.Fatalf("bound to %q", c.Spec.VolumeName)
	}
	if annotated(c.ObjectMeta, kube.AnnBoundByController) {
		t.Errorf("a claim the user pre-bound must not get %s", kube.AnnBoundByController)
	}
	v := pvPhase(t, "pc-big", corev1.VolumeBound)
	if v.Annotations[kube.AnnBoundByController] != "yes" {
		t.Errorf("volume lacks %s", kube.AnnBoundByController)
	}
}

func TestPreboundClaimVolumeMissing(t *testing.T) {
	n, cls := ns(t), "prebound-missing"
	createPVC(t, n, "data", "1Gi", cls, wantVolume("pm-later"))
	pvcPhase(t, n, "data", corev1.ClaimPending)
	createPV(t, "pm-later", "1Gi", cls)
	c := pvcPhase(t, n, "data", corev1.ClaimBound)
	if c.Spec.VolumeName != "pm-later" {
		t.Fatalf("bound to %q", c.Spec.VolumeName)
	}
}

func TestPreboundClaimVolumeMismatch(t *testing.T) {
	n, cls := ns(t), "prebound-mismatch"
	createPV(t, "mm-small", "1Gi", cls)
	createPVC(t, n, "data", "5Gi", cls, wantVolume("mm-small"))
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventVolumeMismatch, `Cannot bind to requested volume "mm-small": requested PV is too small`)
	pvcPhase(t, n, "data", corev1.ClaimPending)
	pvPhase(t, "mm-small", corev1.VolumeAvailable)
}

func TestPreboundClaimVolumeTaken(t *testing.T) {
	n, cls := ns(t), "prebound-taken"
	createPV(t, "tk-1", "1Gi", cls)
	createPVC(t, n, "first", "1Gi", cls)
	pvcPhase(t, n, "first", corev1.ClaimBound)
	createPVC(t, n, "second", "1Gi", cls, wantVolume("tk-1"))
	hasEvent(t, n, "PersistentVolumeClaim", "second", kube.EventFailedBinding, `volume "tk-1" already bound to a different claim.`)
	pvcPhase(t, n, "second", corev1.ClaimPending)
}

func TestHalfDoneBindIsFinished(t *testing.T) {
	// The claim says bind-completed and names the volume, but the volume
	// has no claimRef: a bind interrupted after the claim was written.
	n, cls := ns(t), "half-done"
	createPV(t, "hd-1", "1Gi", cls)
	createPVC(t, n, "data", "1Gi", cls, wantVolume("hd-1"), claimAnnotation(kube.AnnBindCompleted, "yes"))
	c := pvcPhase(t, n, "data", corev1.ClaimBound)
	v := pvPhase(t, "hd-1", corev1.VolumeBound)
	if v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != c.UID {
		t.Fatalf("claimRef %+v, want UID %s", v.Spec.ClaimRef, c.UID)
	}
}

func TestVolumeClaimRefToThisClaimIsFinished(t *testing.T) {
	// The volume already points to the claim (with its UID) but the claim
	// was never updated: bind finishes from the claim's side.
	n, cls := ns(t), "half-done-volume"
	c := createPVC(t, n, "data", "1Gi", cls, wantVolume("hv-1"))
	createPV(t, "hv-1", "1Gi", cls, withClaimRef(n, "data", string(c.UID)), withAnnotation(kube.AnnBoundByController, "yes"))
	pvcPhase(t, n, "data", corev1.ClaimBound)
	pvPhase(t, "hv-1", corev1.VolumeBound)
}

func TestClaimLostWhenVolumeDeleted(t *testing.T) {
	n, cls := ns(t), "lost"
	createPV(t, "lost-1", "1Gi", cls)
	createPVC(t, n, "data", "1Gi", cls)
	pvcPhase(t, n, "data", corev1.ClaimBound)
	if err := cluster.client.CoreV1().PersistentVolumes().Delete(t.Context(), "lost-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pvcPhase(t, n, "data", corev1.ClaimLost)
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventClaimLost, "Bound claim has lost its PersistentVolume. Data on the volume is lost!")
}

func TestClaimLostWithoutVolumeName(t *testing.T) {
	n, cls := ns(t), "lost-name"
	createPVC(t, n, "data", "1Gi", cls, claimAnnotation(kube.AnnBindCompleted, "yes"))
	pvcPhase(t, n, "data", corev1.ClaimLost)
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventClaimLost, "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!")
}

func TestClaimMisbound(t *testing.T) {
	n, cls := ns(t), "misbound"
	createPV(t, "mb-1", "1Gi", cls)
	createPVC(t, n, "owner", "1Gi", cls)
	pvcPhase(t, n, "owner", corev1.ClaimBound)
	// A second claim claims, falsely, to be bound to the same volume.
	createPVC(t, n, "intruder", "1Gi", cls, wantVolume("mb-1"), claimAnnotation(kube.AnnBindCompleted, "yes"))
	pvcPhase(t, n, "intruder", corev1.ClaimLost)
	hasEvent(t, n, "PersistentVolumeClaim", "intruder", kube.EventClaimMisbound, "Two claims are bound to the same volume, this one is bound incorrectly")
	pvcPhase(t, n, "owner", corev1.ClaimBound)
}

func TestReleasedAndRetained(t *testing.T) {
	n, cls := ns(t), "retain"
	createPV(t, "rt-1", "1Gi", cls)
	createPVC(t, n, "data", "1Gi", cls)
	c := pvcPhase(t, n, "data", corev1.ClaimBound)
	if err := cluster.client.CoreV1().PersistentVolumeClaims(n).Delete(t.Context(), "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	v := pvPhase(t, "rt-1", corev1.VolumeReleased)
	if v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != c.UID {
		t.Fatalf("a Retained volume keeps its claimRef; got %+v", v.Spec.ClaimRef)
	}
	// A new claim of the same name must not get the released volume.
	createPVC(t, n, "data", "1Gi", cls)
	consistently(t, 2*time.Second, func() string {
		if c := getPVC(t, n, "data"); c != nil && c.Spec.VolumeName != "" {
			return "the new claim got " + c.Spec.VolumeName
		}
		if v := getPV(t, "rt-1"); v.Status.Phase != corev1.VolumeReleased {
			return "the volume left Released: " + string(v.Status.Phase)
		}
		return ""
	})
}

func TestUnbindWhenClaimBoundElsewhere(t *testing.T) {
	for _, byController := range []bool{true, false} {
		t.Run(fmt.Sprintf("boundByController=%v", byController), func(t *testing.T) {
			n := ns(t)
			cls := fmt.Sprintf("unbind-%v", byController)
			other := fmt.Sprintf("ub-other-%v", byController)
			stray := fmt.Sprintf("ub-stray-%v", byController)
			createPV(t, other, "1Gi", cls)
			c := createPVC(t, n, "data", "1Gi", cls, wantVolume(other))
			pvcPhase(t, n, "data", corev1.ClaimBound)
			opts := []pvOpt{withClaimRef(n, "data", string(c.UID))}
			if byController {
				opts = append(opts, withAnnotation(kube.AnnBoundByController, "yes"))
			}
			createPV(t, stray, "1Gi", cls, opts...)
			v := pvPhase(t, stray, corev1.VolumeAvailable)
			eventually(t, 30*time.Second, func() string {
				v = getPV(t, stray)
				switch {
				case byController && v.Spec.ClaimRef != nil:
					return fmt.Sprintf("claimRef %+v not cleared", v.Spec.ClaimRef)
				case byController && annotated(v.ObjectMeta, kube.AnnBoundByController):
					return "bound-by-controller not removed"
				case !byController && (v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != "" || v.Spec.ClaimRef.Name != "data"):
					return fmt.Sprintf("a user's pre-bind keeps its claimRef without UID; got %+v", v.Spec.ClaimRef)
				}
				return ""
			})
		})
	}
}

func TestProvisionedVolumeOfClaimBoundElsewhereIsReleased(t *testing.T) {
	n, cls := ns(t), "provisioned-elsewhere"
	createPV(t, "pe-chosen", "1Gi", cls)
	c := createPVC(t, n, "data", "1Gi", cls, wantVolume("pe-chosen"))
	pvcPhase(t, n, "data", corev1.ClaimBound)
	createPV(t, "pe-extra", "1Gi", cls, withClaimRef(n, "data", string(c.UID)),
		withAnnotation(kube.AnnDynamicallyProvisioned, "example.com/csi"), withPolicy(corev1.PersistentVolumeReclaimDelete))
	pvPhase(t, "pe-extra", corev1.VolumeReleased)
}

func TestVolumeModeMismatchEvents(t *testing.T) {
	n, cls := ns(t), "mode-mismatch"
	c := createPVC(t, n, "data", "1Gi", cls, blockMode())
	createPV(t, "vm-fs", "1Gi", cls, withClaimRef(n, "data", string(c.UID)))
	hasEvent(t, "default", "PersistentVolume", "vm-fs", kube.EventVolumeMismatch, `Cannot bind PersistentVolume to requested PersistentVolumeClaim "data" due to incompatible volumeMode.`)
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventVolumeMismatch, `Cannot bind PersistentVolume "vm-fs" to requested PersistentVolumeClaim due to incompatible volumeMode.`)
	pvcPhase(t, n, "data", corev1.ClaimPending)
}

func TestNoClassNoVolume(t *testing.T) {
	n := ns(t)
	createPVC(t, n, "data", "1Gi", "")
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventFailedBinding, "no persistent volumes available for this claim and no storage class is set")
	pvcPhase(t, n, "data", corev1.ClaimPending)
}

func TestWaitForFirstConsumer(t *testing.T) {
	n, cls := ns(t), "wffc"
	createClass(t, cls, "kubernetes.io/no-provisioner", storagev1.VolumeBindingWaitForFirstConsumer)
	createPV(t, "wffc-1", "1Gi", cls)
	createPVC(t, n, "data", "1Gi", cls)
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventWaitForFirstConsumer, "waiting for first consumer to be created before binding")
	pvcPhase(t, n, "data", corev1.ClaimPending)
	pvPhase(t, "wffc-1", corev1.VolumeAvailable)
}

func TestExternalProvisioning(t *testing.T) {
	n, cls := ns(t), "external"
	createClass(t, cls, "example.com/external", storagev1.VolumeBindingImmediate)
	createPVC(t, n, "data", "1Gi", cls)
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventExternalProvisioning,
		"Waiting for a volume to be created either by the external provisioner 'example.com/external' or manually by the system administrator.")
	c := pvcPhase(t, n, "data", corev1.ClaimPending)
	for _, a := range []string{kube.AnnStorageProvisioner, kube.AnnBetaStorageProvisioner} {
		if c.Annotations[a] != "example.com/external" {
			t.Errorf("claim annotation %s = %q", a, c.Annotations[a])
		}
	}
	// A volume the external provisioner creates for the claim binds it.
	createPV(t, "ext-made", "1Gi", cls, withClaimRef(n, "data", string(c.UID)),
		withAnnotation(kube.AnnDynamicallyProvisioned, "example.com/external"))
	pvcPhase(t, n, "data", corev1.ClaimBound)
}

func TestMissingClass(t *testing.T) {
	n := ns(t)
	createPVC(t, n, "data", "1Gi", "no-such-class")
	hasEvent(t, n, "PersistentVolumeClaim", "data", kube.EventProvisioningFailed, `storageclass.storage.k8s.io "no-such-class" not found`)
	pvcPhase(t, n, "data", corev1.ClaimPending)
}

// In-tree, migrated and no-provisioner classes and volumes end as
// kube-controller-manager leaves them (test/harness/e2e.InTree; the same
// scenario runs against kube-controller-manager itself in test/e2e/kcm).
func TestInTreeFidelity(t *testing.T) {
	e2e.InTree(t, cluster.client, e2e.Namespace(t, cluster.client))
}
