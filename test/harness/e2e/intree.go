package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/kube"
)

// InTreeTimeout is how long each in-tree expectation may take to show.
const InTreeTimeout = time.Minute

// InTree runs the in-tree, migrated and no-provisioner cases of a drop-in
// PV binder against whatever binds in the cluster behind c: volplane's
// services (test/e2e) or kube-controller-manager itself (test/e2e/kcm,
// `make compare-kcm`), so that every expectation here is checked against
// upstream. ns is a fresh namespace; names are made unique with it.
func InTree(t *testing.T, c kubernetes.Interface, ns string) {
	ctx := context.Background()
	immediate, wffc := storagev1.VolumeBindingImmediate, storagev1.VolumeBindingWaitForFirstConsumer
	class := func(name, provisioner string, mode storagev1.VolumeBindingMode, opts ...func(*storagev1.StorageClass)) string {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name}, Provisioner: provisioner, VolumeBindingMode: &mode}
		for _, o := range opts {
			o(sc)
		}
		CreateClass(t, c, sc)
		return sc.Name
	}
	claim := func(t *testing.T, name, cls string, opts ...func(*corev1.PersistentVolumeClaim)) {
		t.Helper()
		if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, Claim(ns, name, "1Gi", cls, opts...), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	noAnnotations := func(t *testing.T, name string) {
		t.Helper()
		Consistently(t, time.Second, func() string {
			pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			for _, a := range []string{kube.AnnStorageProvisioner, kube.AnnBetaStorageProvisioner, kube.AnnMigratedTo} {
				if v, ok := pvc.Annotations[a]; ok {
					return fmt.Sprintf("claim %s has %s=%q", name, a, v)
				}
			}
			if pvc.Status.Phase != corev1.ClaimPending {
				return fmt.Sprintf("claim %s is %q, want Pending", name, pvc.Status.Phase)
			}
			return ""
		})
	}
	annotated := func(t *testing.T, name, provisioner string) {
		t.Helper()
		Eventually(t, InTreeTimeout, func() string {
			pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if a, b := pvc.Annotations[kube.AnnStorageProvisioner], pvc.Annotations[kube.AnnBetaStorageProvisioner]; a != provisioner || b != provisioner {
				return fmt.Sprintf("claim %s has storage-provisioner %q and %q, want %q", name, a, b, provisioner)
			}
			return ""
		})
	}

	failures := []struct{ name, provisioner, message string }{
		{"no-provisioner", "kubernetes.io/no-provisioner", "no volume plugin matched name: kubernetes.io/no-provisioner"},
		{"removed-plugin", "kubernetes.io/glusterfs", "no volume plugin matched name: kubernetes.io/glusterfs"},
		{"not-provisionable", "kubernetes.io/nfs", "no provisionable volume plugin matched"},
		// Registered in kube-controller-manager, but not in its PV
		// controller, which keeps only plugins that provision, delete or
		// recycle.
		{"not-in-the-pv-controller", "kubernetes.io/iscsi", "no volume plugin matched name: kubernetes.io/iscsi"},
	}
	for _, f := range failures {
		t.Run("provisioning fails: "+f.name, func(t *testing.T) {
			t.Parallel()
			cls := class(f.name, f.provisioner, immediate)
			claim(t, f.name, cls)
			HasEvent(t, c, ns, "PersistentVolumeClaim", f.name, kube.EventProvisioningFailed, f.message, "", InTreeTimeout)
			noAnnotations(t, f.name)
		})
	}

	// A WaitForFirstConsumer claim of kubernetes.io/no-provisioner (local
	// volumes) whose node the scheduler chose, and no local volume fits.
	t.Run("no-provisioner, WaitForFirstConsumer, node selected", func(t *testing.T) {
		t.Parallel()
		cls := class("local", "kubernetes.io/no-provisioner", wffc)
		claim(t, "local", cls, func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Annotations = map[string]string{kube.AnnSelectedNode: "node-1"}
		})
		HasEvent(t, c, ns, "PersistentVolumeClaim", "local", kube.EventProvisioningFailed,
			"no volume plugin matched name: kubernetes.io/no-provisioner", "", InTreeTimeout)
		noAnnotations(t, "local")
	})

	t.Run("host-path provisioning disabled", func(t *testing.T) {
		t.Parallel()
		cls := class("host-path", kube.PluginHostPath, immediate)
		claim(t, "host-path", cls)
		annotated(t, "host-path", kube.PluginHostPath)
		HasEvent(t, c, ns, "PersistentVolumeClaim", "host-path", kube.EventProvisioningFailed,
			`Failed to create provisioner: provisioning in volume plugin "kubernetes.io/host-path" is disabled`, "", InTreeTimeout)
	})

	t.Run("host-path, claim with a data source", func(t *testing.T) {
		t.Parallel()
		cls := class("host-path-source", kube.PluginHostPath, immediate)
		claim(t, "host-path-source", cls, func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "elsewhere"}
		})
		HasEvent(t, c, ns, "PersistentVolumeClaim", "host-path-source", kube.EventProvisioningFailed,
			`plugin "kubernetes.io/host-path" is not a CSI plugin. Only CSI plugin can provision a claim with a datasource`, "", InTreeTimeout)
		noAnnotations(t, "host-path-source")
	})

	// A migrated in-tree class: the claim is handed to the CSI driver's
	// external provisioner under the driver's name, with or without a
	// data source.
	for _, m := range []struct{ name, plugin, driver string }{
		{"aws-ebs", "kubernetes.io/aws-ebs", "ebs.csi.aws.com"},
		{"gce-pd-clone", "kubernetes.io/gce-pd", "pd.csi.storage.gke.io"},
	} {
		t.Run("migrated: "+m.name, func(t *testing.T) {
			t.Parallel()
			cls := class(m.name, m.plugin, immediate)
			claim(t, m.name, cls, func(pvc *corev1.PersistentVolumeClaim) {
				if m.name == "gce-pd-clone" {
					pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "elsewhere"}
				}
			})
			annotated(t, m.name, m.driver)
			HasEvent(t, c, ns, "PersistentVolumeClaim", m.name, kube.EventExternalProvisioning,
				fmt.Sprintf("Waiting for a volume to be created either by the external provisioner '%s'", m.driver), "", InTreeTimeout)
			Consistently(t, time.Second, func() string {
				pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, m.name, metav1.GetOptions{})
				if err != nil {
					return err.Error()
				}
				if v, ok := pvc.Annotations[kube.AnnMigratedTo]; ok {
					return fmt.Sprintf("claim has %s=%q; its storage-provisioner is the CSI name", kube.AnnMigratedTo, v)
				}
				return ""
			})
		})
	}

	// Old objects of a migrated in-tree plugin: the claim and the volume
	// get migrated-to, the volume loses the in-tree finalizer, binding
	// works, and once the claim is gone the volume stays Released for the
	// CSI driver's deleter, with no VolumeFailedDelete.
	t.Run("migrated volume and claim", func(t *testing.T) {
		t.Parallel()
		pv := staticVolume(t, c, ns+"-migrated", "kubernetes.io/gce-pd", corev1.PersistentVolumeReclaimDelete, kube.FinalizerPVController)
		claim(t, "migrated", "", func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Spec.VolumeName = pv
			pvc.Annotations = map[string]string{kube.AnnStorageProvisioner: "kubernetes.io/gce-pd"}
		})
		ClaimPhase(t, c, ns, "migrated", corev1.ClaimBound, InTreeTimeout)
		Eventually(t, InTreeTimeout, func() string {
			pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "migrated", metav1.GetOptions{})
			if err != nil {
				return err.Error()
			}
			if got := pvc.Annotations[kube.AnnMigratedTo]; got != "pd.csi.storage.gke.io" {
				return fmt.Sprintf("claim migrated-to %q", got)
			}
			return volumeState(c, pv, "pd.csi.storage.gke.io", nil, corev1.VolumeBound)
		})
		if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "migrated", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		VolumePhase(t, c, pv, corev1.VolumeReleased, InTreeTimeout)
		Consistently(t, 2*time.Second, func() string {
			if s := volumeState(c, pv, "pd.csi.storage.gke.io", nil, corev1.VolumeReleased); s != "" {
				return s
			}
			evs, err := Events(c, "default", "PersistentVolume", pv)
			if err != nil {
				return err.Error()
			}
			for _, e := range evs {
				if e.Reason == kube.EventVolumeFailedDelete {
					return "a migrated volume got " + e.Reason + ": " + e.Message
				}
			}
			return ""
		})
	})

	// A volume an in-tree plugin provisioned that no plugin deletes: the
	// in-tree finalizer while the policy is Delete (and not the
	// external-provisioner's), and Failed with VolumeFailedDelete once
	// Released.
	t.Run("in-tree volume, Delete", func(t *testing.T) {
		t.Parallel()
		pv := staticVolume(t, c, ns+"-rbd", "kubernetes.io/rbd", corev1.PersistentVolumeReclaimDelete, kube.FinalizerExternalProvisioner)
		claim(t, "rbd", "", func(pvc *corev1.PersistentVolumeClaim) { pvc.Spec.VolumeName = pv })
		ClaimPhase(t, c, ns, "rbd", corev1.ClaimBound, InTreeTimeout)
		Eventually(t, InTreeTimeout, func() string {
			return volumeState(c, pv, "", []string{kube.FinalizerPVController}, corev1.VolumeBound)
		})
		if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "rbd", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		VolumePhase(t, c, pv, corev1.VolumeFailed, InTreeTimeout)
		HasEvent(t, c, "default", "PersistentVolume", pv, kube.EventVolumeFailedDelete, "no volume plugin matched name: kubernetes.io/rbd", "", InTreeTimeout)
	})

	// An in-tree plugin the PV controller does not hold has no deleter.
	t.Run("in-tree volume, Delete, plugin unknown to the PV controller", func(t *testing.T) {
		t.Parallel()
		pv := staticVolume(t, c, ns+"-fc", "kubernetes.io/fc", corev1.PersistentVolumeReclaimDelete, kube.FinalizerPVController)
		claim(t, "fc", "", func(pvc *corev1.PersistentVolumeClaim) { pvc.Spec.VolumeName = pv })
		ClaimPhase(t, c, ns, "fc", corev1.ClaimBound, InTreeTimeout)
		if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "fc", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		VolumePhase(t, c, pv, corev1.VolumeFailed, InTreeTimeout)
		HasEvent(t, c, "default", "PersistentVolume", pv, kube.EventVolumeFailedDelete, "no volume plugin matched name: kubernetes.io/fc", "", InTreeTimeout)
	})

	// Static volumes (no provisioned-by) with policy Delete: the PV
	// controller looks for a deleter by their source. Its host_path
	// deleter refuses a path outside /tmp; nfs has none.
	for _, st := range []struct {
		name string
		src  corev1.PersistentVolumeSource
		want func(pv string) string
	}{
		{"hostPath", corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/data/" + ns + "-static-hostpath"}},
			func(string) string {
				return "host_path deleter only supports /tmp/.+ but received provided /data/" + ns + "-static-hostpath"
			}},
		{"nfs", corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/exports/x"}},
			func(pv string) string {
				return fmt.Sprintf("error getting deleter volume plugin for volume %q: no deletable volume plugin matched", pv)
			}},
	} {
		t.Run("static "+st.name+" volume, Delete", func(t *testing.T) {
			t.Parallel()
			pv := staticVolume(t, c, ns+"-static-"+strings.ToLower(st.name), "", corev1.PersistentVolumeReclaimDelete, "", func(v *corev1.PersistentVolume) {
				v.Spec.PersistentVolumeSource = st.src
			})
			name := "static-" + strings.ToLower(st.name)
			claim(t, name, "", func(pvc *corev1.PersistentVolumeClaim) { pvc.Spec.VolumeName = pv })
			ClaimPhase(t, c, ns, name, corev1.ClaimBound, InTreeTimeout)
			if err := c.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			VolumePhase(t, c, pv, corev1.VolumeFailed, InTreeTimeout)
			HasEvent(t, c, "default", "PersistentVolume", pv, kube.EventVolumeFailedDelete, st.want(pv), "", InTreeTimeout)
		})
	}

	t.Run("in-tree host-path volume, Delete, its claim bound to another volume", func(t *testing.T) {
		t.Parallel()
		HostPathVolumeOfAClaimBoundElsewhere(t, c, ns)
	})

	t.Run("in-tree volume, Retain", func(t *testing.T) {
		t.Parallel()
		pv := staticVolume(t, c, ns+"-rbd-retain", "kubernetes.io/rbd", corev1.PersistentVolumeReclaimRetain, kube.FinalizerPVController)
		Eventually(t, InTreeTimeout, func() string {
			return volumeState(c, pv, "", nil, corev1.VolumeAvailable)
		})
	})
}

// HostPathVolumeOfAClaimBoundElsewhere makes a volume the in-tree
// host-path plugin provisioned (policy Delete, a path outside /tmp) whose
// claimRef, with its UID, names a claim bound to another volume, and
// checks that it ends as kube-controller-manager ends it: the claim
// releases it (isVolumeReleased), the host_path deleter refuses the path,
// and the volume is Failed with VolumeFailedDelete, nothing deleted and
// the claim left Bound to its own volume. It returns the volume's name.
func HostPathVolumeOfAClaimBoundElsewhere(t *testing.T, c kubernetes.Interface, ns string) string {
	t.Helper()
	ctx := context.Background()
	other := staticVolume(t, c, ns+"-hp-other", "", corev1.PersistentVolumeReclaimRetain, "")
	if _, err := c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, Claim(ns, "hp-elsewhere", "1Gi", "", func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Spec.VolumeName = other
	}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bound := ClaimPhase(t, c, ns, "hp-elsewhere", corev1.ClaimBound, InTreeTimeout)
	pv := staticVolume(t, c, ns+"-hp-elsewhere", kube.PluginHostPath, corev1.PersistentVolumeReclaimDelete, kube.FinalizerPVController, func(v *corev1.PersistentVolume) {
		v.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: bound.Name, UID: bound.UID}
	})
	VolumePhase(t, c, pv, corev1.VolumeFailed, InTreeTimeout)
	want := "host_path deleter only supports /tmp/.+ but received provided /data/" + pv
	HasEvent(t, c, "default", "PersistentVolume", pv, kube.EventVolumeFailedDelete, want, "", InTreeTimeout)
	Consistently(t, 2*time.Second, func() string {
		v, err := c.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if v.Status.Phase != corev1.VolumeFailed || v.Status.Message != want {
			return fmt.Sprintf("volume %s is %q (%q), want Failed (%q)", pv, v.Status.Phase, v.Status.Message, want)
		}
		if r := v.Spec.ClaimRef; r == nil || r.UID != bound.UID || v.DeletionTimestamp != nil {
			return fmt.Sprintf("volume %s changed: claimRef %+v, deletion %v", pv, r, v.DeletionTimestamp)
		}
		pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, bound.Name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName != other {
			return fmt.Sprintf("claim %s is %q on %q, want Bound on %q", pvc.Name, pvc.Status.Phase, pvc.Spec.VolumeName, other)
		}
		return ""
	})
	return pv
}

// staticVolume creates a hostPath volume that says provisioner made it
// (none when empty), with the policy and an extra finalizer (none when
// empty), changed by opts, and deletes it (finalizers removed) when the
// test ends.
func staticVolume(t *testing.T, c kubernetes.Interface, name, provisioner string, policy corev1.PersistentVolumeReclaimPolicy, finalizer string, opts ...func(*corev1.PersistentVolume)) string {
	t.Helper()
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: policy,
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/data/" + name}},
		},
	}
	if provisioner != "" {
		pv.Annotations = map[string]string{kube.AnnDynamicallyProvisioned: provisioner}
	}
	if finalizer != "" {
		pv.Finalizers = []string{finalizer}
	}
	for _, o := range opts {
		o(pv)
	}
	if _, err := c.CoreV1().PersistentVolumes().Create(context.Background(), pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = c.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
		for range 20 {
			v, err := c.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return
			}
			v.Finalizers = nil
			if _, err := c.CoreV1().PersistentVolumes().Update(ctx, v, metav1.UpdateOptions{}); err == nil {
				return
			}
		}
	})
	return name
}

// volumeState says how volume name differs from the expected migrated-to
// annotation, finalizers (in any order) and phase; "" when it does not.
func volumeState(c kubernetes.Interface, name, migratedTo string, finalizers []string, phase corev1.PersistentVolumePhase) string {
	v, err := c.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	if got := v.Annotations[kube.AnnMigratedTo]; got != migratedTo {
		return fmt.Sprintf("volume %s migrated-to %q, want %q", name, got, migratedTo)
	}
	got, want := slices.Sorted(slices.Values(v.Finalizers)), slices.Sorted(slices.Values(finalizers))
	if !slices.Equal(got, want) {
		return fmt.Sprintf("volume %s finalizers %v, want %v", name, got, want)
	}
	if v.Status.Phase != phase {
		return fmt.Sprintf("volume %s is %q, want %q", name, v.Status.Phase, phase)
	}
	return ""
}
