package kube

import (
	"fmt"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	csitrans "k8s.io/csi-translation-lib"
)

// FinalizerPVController keeps a volume provisioned by an in-tree plugin
// with policy Delete until kube-controller-manager's PV controller deleted
// its backing volume (storagehelpers.PVDeletionInTreeProtectionFinalizer).
const FinalizerPVController = "kubernetes.io/pv-controller"

// In-tree volume plugins kube-controller-manager v1.36 still registers
// (cmd/kube-controller-manager/app/plugins.go). Its PV controller keeps
// only those that provision, delete or recycle
// (ProbeProvisionableRecyclableVolumePlugins): host-path and nfs. Of
// these only host-path provisions (when --enable-hostpath-provisioner is
// set, off by default), and only host-path deletes; fc, iscsi and csi are
// unknown to it.
const (
	PluginHostPath = "kubernetes.io/host-path"
	PluginNFS      = "kubernetes.io/nfs"
	PluginFC       = "kubernetes.io/fc"
	PluginISCSI    = "kubernetes.io/iscsi"
	PluginCSI      = "kubernetes.io/csi"
)

// pvControllerPlugins are the plugins kube-controller-manager's PV
// controller holds.
var pvControllerPlugins = []string{PluginHostPath, PluginNFS}

var translator = csitrans.New()

// tmpPath is the paths kube-controller-manager's host_path deleter accepts.
var tmpPath = regexp.MustCompile("/tmp/.+")

// MigratedTo returns the CSI driver an in-tree plugin name is migrated to,
// and whether it is one. Kubernetes 1.36 migrates every plugin
// csi-translation-lib translates (aws-ebs, gce-pd, azure-disk, azure-file,
// cinder, vsphere-volume, portworx-volume), unconditionally.
func MigratedTo(plugin string) (string, bool) {
	if !translator.IsMigratableIntreePluginByName(plugin) {
		return "", false
	}
	name, err := translator.GetCSINameFromInTreeName(plugin)
	if err != nil {
		return "", false
	}
	return name, true
}

// ProvisionDecision is what kube-controller-manager's PV controller does
// with a claim that needs a new volume of a class (provisionClaim,
// findProvisionablePlugin, provisionClaimOperation[External]).
type ProvisionDecision struct {
	// Provisioner is the name for the claim's storage-provisioner
	// annotations: the class's, or the CSI driver a migrated in-tree name
	// translates to. Empty: no annotation is set.
	Provisioner string
	// Failure, when not empty, is the ProvisioningFailed event's message:
	// no plugin provisions the class, and the claim stays Pending.
	Failure string
}

// DecideProvisioning reproduces kube-controller-manager v1.36.3 for a
// class's provisioner name: an external (non-"kubernetes.io/") name and a
// migrated in-tree name go to an external provisioner (the latter under
// its CSI driver's name); an in-tree name no plugin provisions fails with
// upstream's message, as does host-path, whose provisioning is disabled by
// default, after it annotated the claim as upstream does.
func DecideProvisioning(class *storagev1.StorageClass, claim *corev1.PersistentVolumeClaim) ProvisionDecision {
	p := class.Provisioner
	if csi, ok := MigratedTo(p); ok {
		return ProvisionDecision{Provisioner: csi}
	}
	if !strings.HasPrefix(p, "kubernetes.io/") {
		return ProvisionDecision{Provisioner: p}
	}
	switch {
	case p == PluginHostPath:
		if claim.Spec.DataSource != nil {
			return ProvisionDecision{Failure: fmt.Sprintf("plugin %q is not a CSI plugin. Only CSI plugin can provision a claim with a datasource", p)}
		}
		if len(class.MountOptions) > 0 {
			return ProvisionDecision{Provisioner: p,
				Failure: fmt.Sprintf("Mount options are not supported by the provisioner but StorageClass %q has mount options %v", class.Name, class.MountOptions)}
		}
		return ProvisionDecision{Provisioner: p,
			Failure: fmt.Sprintf("Failed to create provisioner: provisioning in volume plugin %q is disabled", p)}
	case slices.Contains(pvControllerPlugins, p):
		return ProvisionDecision{Failure: "no provisionable volume plugin matched"}
	}
	return ProvisionDecision{Failure: "no volume plugin matched name: " + p}
}

// InTreeDeleteFailure is kube-controller-manager's VolumeFailedDelete
// message for a Released volume with policy Delete that an in-tree plugin
// provisioned (provisioned-by a non-migrated "kubernetes.io/" name): no
// v1.36 plugin deletes it (findDeletablePlugin), except host-path, whose
// deleter removes only directories under /tmp on kube-controller-manager's
// own node, which volplane does not do. ok is false for any other volume.
func InTreeDeleteFailure(v *corev1.PersistentVolume) (message string, ok bool) {
	by := v.Annotations[AnnDynamicallyProvisioned]
	if !strings.HasPrefix(by, "kubernetes.io/") {
		return "", false
	}
	if _, migrated := MigratedTo(by); migrated {
		return "", false
	}
	switch {
	case by == PluginHostPath:
		if v.Spec.HostPath == nil {
			return fmt.Sprintf("failed to create deleter for volume %q: spec.PersistentVolumeSource.HostPath is nil", v.Name), true
		}
		return hostPathDeleteFailure(v.Spec.HostPath.Path), true
	case slices.Contains(pvControllerPlugins, by):
		return "no deletable volume plugin matched", true
	}
	return "no volume plugin matched name: " + by, true
}

// StaticDeleteFailure is kube-controller-manager's VolumeFailedDelete
// message for a Released volume with policy Delete that no provisioner
// annotated and that has no CSI source: findDeletablePlugin looks for a
// plugin by the volume's source among the PV controller's own (host-path
// and nfs), and only host-path's deletes, only under /tmp (see
// hostPathDeleteFailure).
func StaticDeleteFailure(v *corev1.PersistentVolume) string {
	switch {
	case v.Spec.HostPath != nil:
		return hostPathDeleteFailure(v.Spec.HostPath.Path)
	case v.Spec.NFS != nil:
		return fmt.Sprintf("error getting deleter volume plugin for volume %q: no deletable volume plugin matched", v.Name)
	}
	return fmt.Sprintf("error getting deleter volume plugin for volume %q: no volume plugin matched", v.Name)
}

// hostPathDeleteFailure is what kube-controller-manager's host_path
// deleter answers for path: outside /tmp it refuses, with this message;
// under /tmp it removes the directory on kube-controller-manager's own
// node (a test-only deleter), which volplane does not do: the volume
// fails, saying so.
func hostPathDeleteFailure(path string) string {
	if !tmpPath.MatchString(path) {
		return "host_path deleter only supports /tmp/.+ but received provided " + path
	}
	return fmt.Sprintf("volplane does not run kube-controller-manager's test-only host_path deleter: delete %s on its node by hand", path)
}

// UpdateMigrationAnnotations sets or removes pv.kubernetes.io/migrated-to in
// ann as kube-controller-manager's updateMigrationAnnotations does: from a
// claim's storage-provisioner annotation (or its beta spelling) or a
// volume's provisioned-by, the CSI driver when that name is a migrated
// in-tree plugin, and no annotation otherwise. It reports whether ann
// changed.
func UpdateMigrationAnnotations(ann map[string]string, claim bool) bool {
	if ann == nil {
		return false
	}
	var provisioner string
	var ok bool
	if claim {
		if provisioner, ok = ann[AnnStorageProvisioner]; !ok {
			if provisioner, ok = ann[AnnBetaStorageProvisioner]; !ok {
				return false
			}
		}
	} else if provisioner, ok = ann[AnnDynamicallyProvisioned]; !ok {
		return false
	}
	current := ann[AnnMigratedTo]
	if csi, migrated := MigratedTo(provisioner); migrated {
		if current != csi {
			ann[AnnMigratedTo] = csi
			return true
		}
		return false
	}
	if current != "" {
		delete(ann, AnnMigratedTo)
		return true
	}
	return false
}

// DeletionFinalizers returns a provisioned volume's finalizers as
// kube-controller-manager's modifyDeletionFinalizers leaves them, and
// whether they changed: a migrated in-tree volume loses
// kubernetes.io/pv-controller; a non-migrated in-tree one has it exactly
// while its policy is Delete, and never has the external-provisioner
// finalizer. Volumes of external provisioners (and static ones) are left
// alone: external-provisioner keeps their finalizer.
func DeletionFinalizers(v *corev1.PersistentVolume) ([]string, bool) {
	by, ok := v.Annotations[AnnDynamicallyProvisioned]
	if !ok {
		return v.Finalizers, false
	}
	out := slices.Clone(v.Finalizers)
	changed := false
	remove := func(f string) {
		if slices.Contains(out, f) {
			out = slices.DeleteFunc(out, func(s string) bool { return s == f })
			changed = true
		}
	}
	if _, migrated := MigratedTo(by); migrated {
		remove(FinalizerPVController)
		return out, changed
	}
	if !strings.HasPrefix(by, "kubernetes.io/") {
		return v.Finalizers, false
	}
	switch v.Spec.PersistentVolumeReclaimPolicy {
	case corev1.PersistentVolumeReclaimDelete:
		if !slices.Contains(out, FinalizerPVController) {
			out = append(out, FinalizerPVController)
			changed = true
		}
	case corev1.PersistentVolumeReclaimRetain, corev1.PersistentVolumeReclaimRecycle:
		remove(FinalizerPVController)
	}
	remove(FinalizerExternalProvisioner)
	return out, changed
}
