// Command provisioner runs a volplane provisioner replica: it wraps CSI
// drivers, creating volumes (and their PersistentVolumes) for claims and
// deleting them, with every operation journaled in etcd.
package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/provisioner/capacity"
	"github.com/volplane/volplane/services/provisioner/orphans"
)

const description = `provisioner is a replica of volplane's provisioner, in the place of
external-provisioner: it wraps one or many CSI drivers (chosen by a StorageClass's provisioner
name), creating a volume and its PersistentVolume for a claim the binder asks it for, and
deleting volumes for the reclaimer. Every CreateVolume and DeleteVolume is journaled in etcd
before it starts, so that a replica that dies mid-way is finished or undone by another and no
volume is leaked. It can also publish CSIStorageCapacity objects and report orphaned backing
volumes.`

func main() {
	var o provisioner.Options
	cmd := cmdutil.NewCommand(provisioner.Service, description)
	fs := cmd.Flags("Provisioner")
	fs.Var(cmdutil.NewList(&o.CSIEndpoints, "endpoints"), "csi-endpoint", "a CSI driver's gRPC address, [provisioner-name=]unix:///path/csi.sock or host:port; repeat or comma-separate for several drivers (the name defaults to the driver's own); at least one is required unless --discover-sidecars")
	fs.BoolVar(&o.DiscoverSidecars, "discover-sidecars", false, "find the CSI drivers served by volplane-csi-sidecars in the drivers' own pods (registration Leases labelled volplane.io/csi-sidecar), and publish the CA the sidecars check the provisioner with (ConfigMap volplane-provisioner-ca in --namespace); --csi-endpoint is then optional")
	fs.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the provisioner's own namespace, where --discover-sidecars publishes its CA; defaults to $POD_NAMESPACE, else volplane-system")
	fs.StringVar(&o.VolumeNamePrefix, "volume-name-prefix", provisioner.DefaultVolumeNamePrefix, "provisioned PVs are named <prefix>-<claim UID>")
	fs.BoolVar(&o.StrictTopology, "strict-topology", false, "a claim with a selected node asks only for that node's topology segment (as external-provisioner's flag)")
	fs.StringVar(&o.DefaultFSType, "default-fstype", provisioner.DefaultFSType, "filesystem of volumes whose StorageClass sets no csi.storage.k8s.io/fstype; empty leaves it to the driver")
	fs.BoolVar(&o.ExtraCreateMetadata, "extra-create-metadata", false, "pass csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name to CreateVolume")
	fs.DurationVar(&o.Timeout, "timeout", provisioner.DefaultTimeout, "timeout of each CSI call; a call that times out is retried with the same volume name")
	fs.DurationVar(&o.RecoveryPeriod, "recovery-period", provisioner.DefaultRecoveryPeriod, "how often the journal is scanned to finish or undo interrupted operations")
	fs.DurationVar(&o.ProbePeriod, "probe-period", provisioner.DefaultProbePeriod, "how often the CSI drivers are probed")
	fs.Var(&o.FeatureGates, "feature-gates", "external-provisioner v6.3.0's feature gates, Name=true|false comma-separated, accepted and refused as there: CrossNamespaceVolumeDataSource=true lets a claim's dataSourceRef name a claim or VolumeSnapshot of another namespace that a ReferenceGrant there allows (kube-apiserver needs the same gate); Topology=false sends no topology and writes no node affinity; VolumeAttributesClass=false ignores a claim's volumeAttributesClassName; the others change nothing, as there")
	fs.IntVar(&o.VolumeNameUUIDLength, "volume-name-uuid-length", -1, "name PVs <prefix>-<the claim UID without dashes, cut to this length>; -1 keeps the whole UID (external-provisioner's flag; 1 to 32)")
	immediate := fs.Bool("immediate-topology", true, "a claim with Immediate binding, of a class without allowedTopologies, asks for every topology segment of the driver's nodes; false: for none (external-provisioner's flag)")
	fs.BoolVar(&o.ControllerPublishReadOnly, "controller-publish-readonly", false, "the PV of a claim whose only access mode is ReadOnlyMany gets spec.csi.readOnly=true (external-provisioner's flag)")
	fs.DurationVar(&o.SnapshotOrphanSweepInterval, "snapshot-orphan-sweep-interval", provisioner.DefaultSnapshotOrphanSweepInterval, "how often snapshot-as-source finalizers that no Pending claim needs any more are removed from VolumeSnapshots; 0 disables the sweep")
	prevent := fs.Bool("prevent-volume-mode-conversion", true, "refuse to restore a VolumeSnapshot as a volume of another mode (Filesystem, Block) than its source unless its VolumeSnapshotContent has the annotation snapshot.storage.kubernetes.io/allow-volume-mode-change=true (external-provisioner's flag)")
	var watchers []string
	fs.Var(cmdutil.NewList(&watchers, "addresses"), "watcher-address", "gRPC address of the watcher service; repeat the flag or separate addresses with commas for several watcher replicas. When set, claims and StorageClasses come from the watcher's stream instead of the provisioner's own watches on the API server; empty: its own watches")
	fs.DurationVar(&o.StaleAfter, "watcher-stale-after", provisioner.DefaultStaleAfter, "how long without a live, caught-up watcher stream before the provisioner stops trusting its stream-fed cache and reads claims and classes from the API server; at least 2s")
	fs.DurationVar(&o.OrphanScanPeriod, "orphan-scan-period", orphans.DefaultScanPeriod, "how often the orphan report refreshes volplane_provisioner_orphans; negative: only when asked (GET /v1/orphans)")
	sa := cmd.Flags("Standalone mode (managed clusters)")
	sa.BoolVar(&o.Standalone, "standalone", false, "run without volplane's binder, beside kube-controller-manager's: provision every claim whose volume.kubernetes.io/storage-provisioner annotation names a served driver, as external-provisioner does; kube-controller-manager binds the PVs")
	sa.IntVar(&o.StandaloneWorkers, "worker-threads", provisioner.DefaultStandaloneWorkers, "with --standalone: claims provisioned at once (external-provisioner's flag)")
	sa.DurationVar(&o.RetryIntervalStart, "retry-interval-start", provisioner.DefaultRetryIntervalStart, "with --standalone: first delay before a claim whose provisioning did not finish is tried again; doubles per failure")
	sa.DurationVar(&o.RetryIntervalMax, "retry-interval-max", provisioner.DefaultRetryIntervalMax, "with --standalone: longest delay between provisioning attempts of a claim")
	cap := cmd.Flags("Storage capacity")
	cap.BoolVar(&o.Capacity.Enabled, "enable-capacity", false, "publish CSIStorageCapacity objects for drivers with GET_CAPACITY, per topology segment and StorageClass, as external-provisioner does")
	cap.DurationVar(&o.Capacity.PollInterval, "capacity-poll-interval", capacity.DefaultPollInterval, "how often every CSIStorageCapacity object is refreshed (also after each volume created or deleted)")
	cap.StringVar(&o.Capacity.Namespace, "capacity-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the CSIStorageCapacity objects; defaults to $POD_NAMESPACE")
	cap.StringVar(&o.Capacity.ManagedBy, "capacity-managed-by", capacity.DefaultManagedBy, "csi.storage.k8s.io/managed-by label of the objects this provisioner owns (external-provisioner to adopt external-provisioner's)")
	cap.StringVar(&o.Capacity.Owner, "capacity-owner", "", "Kind/name (Deployment, StatefulSet, DaemonSet, ReplicaSet) in --capacity-namespace that owns the objects, so deleting it removes them; empty sets no owner")
	cap.BoolVar(&o.Capacity.ForImmediateBinding, "capacity-for-immediate-binding", false, "also publish for StorageClasses with Immediate binding")
	o.AddFlags(cmd, "127.0.0.1:7703", "the operation journal")
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.WatcherAddress = strings.Join(watchers, ",")
		o.AllowVolumeModeConversion = !*prevent
		o.NoImmediateTopology = !*immediate
		o.Logger = log
		return provisioner.Run(ctx, o)
	}))
}
