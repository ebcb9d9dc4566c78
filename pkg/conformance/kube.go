package conformance

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// Kubernetes names the checks use.
const (
	annProvisionedBy = "pv.kubernetes.io/provisioned-by"
	// handsOff is a provisioner name nobody serves. A volume whose
	// pv.kubernetes.io/provisioned-by names it is left alone by every
	// deleter (Kubernetes deleters act only on the volumes their own
	// provisioner made), so the suite can drive DeleteVolume itself
	// while a binder and a reclaimer run.
	handsOff = "hands-off.conformance.volplane.io"
	// unservedDriver is a CSI driver name nobody serves.
	unservedDriver = "unserved.conformance.volplane.io"
	// labelGen numbers the versions of an object the watcher suite writes.
	labelGen = "conformance.volplane.io/gen"
)

func (t *T) kube() kubernetes.Interface { return t.s.cfg.Kube }

func (t *T) labels() map[string]string { return map[string]string{LabelRun: t.s.run} }

// namespace creates a namespace for the check and deletes it (and its
// claims) after the check.
func (t *T) namespace() string {
	name := t.s.name("ns")
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: t.labels()}}
	if _, err := t.kube().CoreV1().Namespaces().Create(t.ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	t.Cleanup(func(ctx context.Context) {
		claims, err := t.kube().CoreV1().PersistentVolumeClaims(name).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, c := range claims.Items {
				deleteClaim(ctx, t.kube(), name, c.Name)
			}
		}
		_ = t.kube().CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}

// createClass creates a StorageClass (Immediate, policy Delete unless
// changed by opts) and deletes it after the check.
func (t *T) createClass(provisioner string, opts ...func(*storagev1.StorageClass)) *storagev1.StorageClass {
	policy := corev1.PersistentVolumeReclaimDelete
	mode := storagev1.VolumeBindingImmediate
	sc := &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: t.s.name("sc"), Labels: t.labels()},
		Provisioner:       provisioner,
		ReclaimPolicy:     &policy,
		VolumeBindingMode: &mode,
	}
	for _, o := range opts {
		o(sc)
	}
	created, err := t.kube().StorageV1().StorageClasses().Create(t.ctx, sc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create StorageClass %s: %v", sc.Name, err)
	}
	t.Cleanup(func(ctx context.Context) {
		_ = t.kube().StorageV1().StorageClasses().Delete(ctx, sc.Name, metav1.DeleteOptions{})
	})
	return created
}

// newClaim builds a ReadWriteOnce claim of class asking for size.
func (t *T) newClaim(namespace, name, class, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: t.labels()},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: &class,
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			},
		},
	}
}

// createClaim creates a claim; its namespace's cleanup deletes it.
func (t *T) createClaim(c *corev1.PersistentVolumeClaim) *corev1.PersistentVolumeClaim {
	created, err := t.kube().CoreV1().PersistentVolumeClaims(c.Namespace).Create(t.ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s/%s: %v", c.Namespace, c.Name, err)
	}
	return created
}

// newVolume builds a static volume of class that nothing can mount or
// delete (a CSI volume of a driver nobody serves), policy Retain.
func (t *T) newVolume(name, class, size string) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: t.labels()},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: unservedDriver, VolumeHandle: name},
			},
		},
	}
}

// createVolume creates a volume and deletes it after the check. A phase in
// v.Status is written after the creation.
func (t *T) createVolume(v *corev1.PersistentVolume) *corev1.PersistentVolume {
	phase := v.Status.Phase
	created, err := t.kube().CoreV1().PersistentVolumes().Create(t.ctx, v, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create PersistentVolume %s: %v", v.Name, err)
	}
	t.Cleanup(func(ctx context.Context) { deleteVolume(ctx, t.kube(), v.Name) })
	if phase != "" {
		return t.setPhase(v.Name, phase)
	}
	return created
}

// updateVolume changes a volume with f, retrying conflicts.
func (t *T) updateVolume(name string, f func(*corev1.PersistentVolume)) *corev1.PersistentVolume {
	var out *corev1.PersistentVolume
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		v, err := t.kube().CoreV1().PersistentVolumes().Get(t.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		f(v)
		out, err = t.kube().CoreV1().PersistentVolumes().Update(t.ctx, v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("update PersistentVolume %s: %v", name, err)
	}
	return out
}

// setPhase writes a volume's status.phase (Released as Kubernetes' PV
// controller writes it once the claim is gone), retrying conflicts; it
// leaves a volume that is already Released or Failed as it is when phase
// is Released.
func (t *T) setPhase(name string, phase corev1.PersistentVolumePhase) *corev1.PersistentVolume {
	var out *corev1.PersistentVolume
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		v, err := t.kube().CoreV1().PersistentVolumes().Get(t.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v.Status.Phase == phase || (phase == corev1.VolumeReleased && v.Status.Phase == corev1.VolumeFailed) {
			out = v
			return nil
		}
		v.Status.Phase = phase
		out, err = t.kube().CoreV1().PersistentVolumes().UpdateStatus(t.ctx, v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("set phase %s of PersistentVolume %s: %v", phase, name, err)
	}
	return out
}

// updateClaim changes a claim with f, retrying conflicts.
func (t *T) updateClaim(namespace, name string, f func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
	var out *corev1.PersistentVolumeClaim
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		c, err := t.kube().CoreV1().PersistentVolumeClaims(namespace).Get(t.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		f(c)
		out, err = t.kube().CoreV1().PersistentVolumeClaims(namespace).Update(t.ctx, c, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("update claim %s/%s: %v", namespace, name, err)
	}
	return out
}

// deleteClaimWait deletes a claim and waits until it is gone.
func (t *T) deleteClaimWait(namespace, name string) {
	deleteClaim(t.ctx, t.kube(), namespace, name)
	t.Eventually("claim "+namespace+"/"+name+" deleted", func() string {
		_, err := t.kube().CoreV1().PersistentVolumeClaims(namespace).Get(t.ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return ""
		case err != nil:
			return err.Error()
		}
		deleteClaim(t.ctx, t.kube(), namespace, name)
		return "still there"
	})
}

// deleteClaim deletes a claim of the suite's. A claim held only by
// kubernetes.io/pvc-protection after its deletion loses that finalizer: no
// pod uses the suite's claims (the pvc-protection controller would remove
// it too, and some test clusters run none).
func deleteClaim(ctx context.Context, c kubernetes.Interface, namespace, name string) {
	err := c.CoreV1().PersistentVolumeClaims(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil {
		return
	}
	cl, err := c.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil || cl.DeletionTimestamp == nil || len(cl.Finalizers) == 0 {
		return
	}
	if time.Since(cl.DeletionTimestamp.Time) < 5*time.Second {
		return
	}
	var keep []string
	for _, f := range cl.Finalizers {
		if f != "kubernetes.io/pvc-protection" {
			keep = append(keep, f)
		}
	}
	cl.Finalizers = keep
	_, _ = c.CoreV1().PersistentVolumeClaims(namespace).Update(ctx, cl, metav1.UpdateOptions{})
}

// deleteVolume deletes a volume object of the suite's, with its
// finalizers: the suite deletes the backing volume first where there is
// one.
func deleteVolume(ctx context.Context, c kubernetes.Interface, name string) {
	_ = retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		v, err := c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(v.Finalizers) == 0 {
			return nil
		}
		v.Finalizers = nil
		_, err = c.CoreV1().PersistentVolumes().Update(ctx, v, metav1.UpdateOptions{})
		return err
	})
	_ = c.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
}

// volumesOfClaim lists the volumes whose claimRef has the claim's UID.
func (t *T) volumesOfClaim(uid types.UID) []string {
	var out []string
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := t.kube().CoreV1().PersistentVolumes().List(t.ctx, opts)
		if err != nil {
			t.Fatalf("list PersistentVolumes: %v", err)
		}
		for _, v := range list.Items {
			if v.Spec.ClaimRef != nil && v.Spec.ClaimRef.UID == uid {
				out = append(out, v.Name)
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out
		}
	}
}

// volumeEvents lists "Reason: message" of the Events about a volume.
func (t *T) volumeEvents(name string) []string {
	sel := fields.Set{"involvedObject.kind": "PersistentVolume", "involvedObject.name": name}.AsSelector().String()
	list, err := t.kube().CoreV1().Events(metav1.NamespaceAll).List(t.ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		t.Fatalf("list events of PersistentVolume %s: %v", name, err)
	}
	var out []string
	for _, e := range list.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out
}

func hasReason(events []string, reason string) bool {
	for _, e := range events {
		if strings.HasPrefix(e, reason+":") {
			return true
		}
	}
	return false
}

// getVolume reads a volume; nil when it is gone.
func (t *T) getVolume(name string) *corev1.PersistentVolume {
	v, err := t.kube().CoreV1().PersistentVolumes().Get(t.ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		t.Fatalf("read PersistentVolume %s: %v", name, err)
	}
	return v
}

func claimKey(c *corev1.PersistentVolumeClaim) string { return c.Namespace + "/" + c.Name }
