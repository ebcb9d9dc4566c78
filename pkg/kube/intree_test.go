package kube

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The expectations are kube-controller-manager v1.36.3's
// (findProvisionablePlugin, provisionClaimOperation[External]).
func TestDecideProvisioning(t *testing.T) {
	withSource := &corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{
		DataSource: &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}}}
	for _, tc := range []struct {
		name, provisioner string
		mountOptions      []string
		claim             *corev1.PersistentVolumeClaim
		want              ProvisionDecision
	}{
		{name: "external", provisioner: "hostpath.csi.volplane.io", want: ProvisionDecision{Provisioner: "hostpath.csi.volplane.io"}},
		{name: "migrated aws-ebs", provisioner: "kubernetes.io/aws-ebs", want: ProvisionDecision{Provisioner: "ebs.csi.aws.com"}},
		{name: "migrated gce-pd", provisioner: "kubernetes.io/gce-pd", want: ProvisionDecision{Provisioner: "pd.csi.storage.gke.io"}},
		{name: "migrated azure-disk", provisioner: "kubernetes.io/azure-disk", want: ProvisionDecision{Provisioner: "disk.csi.azure.com"}},
		{name: "migrated azure-file", provisioner: "kubernetes.io/azure-file", want: ProvisionDecision{Provisioner: "file.csi.azure.com"}},
		{name: "migrated cinder", provisioner: "kubernetes.io/cinder", want: ProvisionDecision{Provisioner: "cinder.csi.openstack.org"}},
		{name: "migrated vsphere", provisioner: "kubernetes.io/vsphere-volume", want: ProvisionDecision{Provisioner: "csi.vsphere.vmware.com"}},
		{name: "migrated portworx", provisioner: "kubernetes.io/portworx-volume", want: ProvisionDecision{Provisioner: "pxd.portworx.com"}},
		{name: "migrated with a data source", provisioner: "kubernetes.io/aws-ebs", claim: withSource, want: ProvisionDecision{Provisioner: "ebs.csi.aws.com"}},
		{name: "no-provisioner", provisioner: "kubernetes.io/no-provisioner", want: ProvisionDecision{Failure: "no volume plugin matched name: kubernetes.io/no-provisioner"}},
		{name: "removed plugin", provisioner: "kubernetes.io/rbd", want: ProvisionDecision{Failure: "no volume plugin matched name: kubernetes.io/rbd"}},
		{name: "registered, not provisionable", provisioner: "kubernetes.io/nfs", want: ProvisionDecision{Failure: "no provisionable volume plugin matched"}},
		// The PV controller holds only host-path and nfs
		// (ProbeProvisionableRecyclableVolumePlugins): fc, iscsi and csi are
		// not provisionable, deletable or recyclable, so it does not know them.
		{name: "in-tree csi", provisioner: "kubernetes.io/csi", want: ProvisionDecision{Failure: "no volume plugin matched name: kubernetes.io/csi"}},
		{name: "in-tree fc", provisioner: "kubernetes.io/fc", want: ProvisionDecision{Failure: "no volume plugin matched name: kubernetes.io/fc"}},
		{name: "in-tree iscsi", provisioner: "kubernetes.io/iscsi", want: ProvisionDecision{Failure: "no volume plugin matched name: kubernetes.io/iscsi"}},
		{name: "host-path disabled", provisioner: "kubernetes.io/host-path", want: ProvisionDecision{Provisioner: "kubernetes.io/host-path",
			Failure: `Failed to create provisioner: provisioning in volume plugin "kubernetes.io/host-path" is disabled`}},
		{name: "host-path with mount options", provisioner: "kubernetes.io/host-path", mountOptions: []string{"ro"}, want: ProvisionDecision{Provisioner: "kubernetes.io/host-path",
			Failure: `Mount options are not supported by the provisioner but StorageClass "c" has mount options [ro]`}},
		{name: "host-path with a data source", provisioner: "kubernetes.io/host-path", claim: withSource, want: ProvisionDecision{
			Failure: `plugin "kubernetes.io/host-path" is not a CSI plugin. Only CSI plugin can provision a claim with a datasource`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := tc.claim
			if claim == nil {
				claim = &corev1.PersistentVolumeClaim{}
			}
			class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Provisioner: tc.provisioner, MountOptions: tc.mountOptions}
			if got := DecideProvisioning(class, claim); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestInTreeDeleteFailure(t *testing.T) {
	pv := func(by, path string) *corev1.PersistentVolume {
		v := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv"}}
		if by != "" {
			v.Annotations = map[string]string{AnnDynamicallyProvisioned: by}
		}
		if path != "" {
			v.Spec.HostPath = &corev1.HostPathVolumeSource{Path: path}
		}
		return v
	}
	for _, tc := range []struct {
		name string
		v    *corev1.PersistentVolume
		want string
		ok   bool
	}{
		{name: "static", v: pv("", "/data")},
		{name: "external", v: pv("hostpath.csi.volplane.io", "")},
		{name: "migrated", v: pv("kubernetes.io/gce-pd", "")},
		{name: "removed plugin", v: pv("kubernetes.io/glusterfs", ""), want: "no volume plugin matched name: kubernetes.io/glusterfs", ok: true},
		{name: "registered, not deletable", v: pv("kubernetes.io/nfs", ""), want: "no deletable volume plugin matched", ok: true},
		{name: "not in the PV controller", v: pv("kubernetes.io/fc", ""), want: "no volume plugin matched name: kubernetes.io/fc", ok: true},
		{name: "host-path outside /tmp", v: pv("kubernetes.io/host-path", "/data/x"), want: "host_path deleter only supports /tmp/.+ but received provided /data/x", ok: true},
		{name: "host-path under /tmp", v: pv("kubernetes.io/host-path", "/tmp/x"), want: "volplane does not run kube-controller-manager's test-only host_path deleter: delete /tmp/x on its node by hand", ok: true},
		{name: "host-path without a path", v: pv("kubernetes.io/host-path", ""), want: `failed to create deleter for volume "pv": spec.PersistentVolumeSource.HostPath is nil`, ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := InTreeDeleteFailure(tc.v)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("got %q %v, want %q %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// The expectations are kube-controller-manager v1.36.3's for a volume no
// provisioner annotated (findDeletablePlugin by the volume's source among
// the PV controller's host-path and nfs plugins, then the host_path
// deleter), except under /tmp, where its test-only deleter would remove
// the directory on its own node.
func TestStaticDeleteFailure(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  corev1.PersistentVolumeSource
		want string
	}{
		{"hostPath outside /tmp", corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/data/x"}},
			"host_path deleter only supports /tmp/.+ but received provided /data/x"},
		{"hostPath with /tmp/ inside", corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/data/tmp/x"}},
			"volplane does not run kube-controller-manager's test-only host_path deleter: delete /data/tmp/x on its node by hand"},
		{"hostPath /tmp itself", corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/tmp/"}},
			"host_path deleter only supports /tmp/.+ but received provided /tmp/"},
		{"nfs", corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "s", Path: "/e"}},
			`error getting deleter volume plugin for volume "pv": no deletable volume plugin matched`},
		{"local", corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/mnt/x"}},
			`error getting deleter volume plugin for volume "pv": no volume plugin matched`},
		{"fc", corev1.PersistentVolumeSource{FC: &corev1.FCVolumeSource{TargetWWNs: []string{"5005"}}},
			`error getting deleter volume plugin for volume "pv": no volume plugin matched`},
		{"no source", corev1.PersistentVolumeSource{},
			`error getting deleter volume plugin for volume "pv": no volume plugin matched`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv"}, Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: tc.src}}
			if got := StaticDeleteFailure(v); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// The expectations are updateMigrationAnnotations' and
// modifyDeletionFinalizers' in kube-controller-manager v1.36.3.
func TestMigrationBookkeeping(t *testing.T) {
	ann := map[string]string{AnnBetaStorageProvisioner: "kubernetes.io/aws-ebs"}
	if !UpdateMigrationAnnotations(ann, true) || ann[AnnMigratedTo] != "ebs.csi.aws.com" {
		t.Fatalf("claim of a migrated name: %v", ann)
	}
	if UpdateMigrationAnnotations(ann, true) {
		t.Fatal("a second pass changed the claim again")
	}
	ann = map[string]string{AnnStorageProvisioner: "ebs.csi.aws.com", AnnMigratedTo: "ebs.csi.aws.com"}
	if !UpdateMigrationAnnotations(ann, true) || ann[AnnMigratedTo] != "" {
		t.Fatalf("a claim of a CSI name keeps migrated-to: %v", ann)
	}
	if UpdateMigrationAnnotations(map[string]string{AnnStorageProvisioner: "x"}, false) {
		t.Fatal("a volume without provisioned-by changed")
	}

	vol := func(by string, policy corev1.PersistentVolumeReclaimPolicy, finalizers ...string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{AnnDynamicallyProvisioned: by}, Finalizers: finalizers},
			Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: policy}}
	}
	for _, tc := range []struct {
		name    string
		v       *corev1.PersistentVolume
		want    []string
		changed bool
	}{
		{name: "in-tree Delete gains pv-controller", v: vol("kubernetes.io/rbd", corev1.PersistentVolumeReclaimDelete, FinalizerPVProtection),
			want: []string{FinalizerPVProtection, FinalizerPVController}, changed: true},
		{name: "in-tree Delete loses external-provisioner's", v: vol("kubernetes.io/rbd", corev1.PersistentVolumeReclaimDelete, FinalizerPVController, FinalizerExternalProvisioner),
			want: []string{FinalizerPVController}, changed: true},
		{name: "in-tree Retain loses pv-controller", v: vol("kubernetes.io/rbd", corev1.PersistentVolumeReclaimRetain, FinalizerPVController),
			want: []string{}, changed: true},
		{name: "in-tree Recycle has none", v: vol("kubernetes.io/rbd", corev1.PersistentVolumeReclaimRecycle), want: nil},
		{name: "migrated loses pv-controller", v: vol("kubernetes.io/aws-ebs", corev1.PersistentVolumeReclaimDelete, FinalizerPVController, FinalizerExternalProvisioner),
			want: []string{FinalizerExternalProvisioner}, changed: true},
		{name: "external left alone", v: vol("hostpath.csi.volplane.io", corev1.PersistentVolumeReclaimRetain, FinalizerExternalProvisioner),
			want: []string{FinalizerExternalProvisioner}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := DeletionFinalizers(tc.v)
			if changed != tc.changed || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v %v, want %v %v", got, changed, tc.want, tc.changed)
			}
		})
	}
}
