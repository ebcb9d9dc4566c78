// Command provisioner runs a volplane provisioner replica: it wraps CSI
// drivers, creating volumes (and their PersistentVolumes) for claims and
// deleting them, with every operation journaled in etcd.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/services/provisioner"
)

func main() {
	var o provisioner.Options
	cmdutil.KubeFlags(&o.Kubeconfig, &o.KubeQPS, &o.KubeBurst)
	cmdutil.EtcdFlag(&o.EtcdEndpoints, "membership and the operation journal")
	cmdutil.EtcdSecurityFlags(&o.Etcd)
	cmdutil.TLSFlags(&o.TLS)
	cmdutil.ReflectionFlag(&o.GRPCReflection)
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7703", "gRPC listen address (host:port or unix:///path)")
	flag.StringVar(&o.AdvertiseAddress, "advertise-address", "", "address peers reach this replica at; defaults to --listen")
	flag.StringVar(&o.MemberID, "member-id", "", "this replica's member id in etcd; defaults to hostname plus a random suffix")
	cmdutil.ListFlag(&o.CSIEndpoints, "csi-endpoint", "a CSI driver's gRPC address, [provisioner-name=]unix:///path/csi.sock or host:port; repeat or comma-separate for several drivers (the name defaults to the driver's own)")
	flag.StringVar(&o.VolumeNamePrefix, "volume-name-prefix", provisioner.DefaultVolumeNamePrefix, "provisioned PVs are named <prefix>-<claim UID>")
	flag.StringVar(&o.DefaultFSType, "default-fstype", provisioner.DefaultFSType, "filesystem of volumes whose StorageClass sets no csi.storage.k8s.io/fstype; empty leaves it to the driver")
	flag.BoolVar(&o.ExtraCreateMetadata, "extra-create-metadata", false, "pass csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name to CreateVolume")
	flag.DurationVar(&o.Timeout, "timeout", provisioner.DefaultTimeout, "timeout of each CSI call; a call that times out is retried with the same volume name")
	flag.DurationVar(&o.RecoveryPeriod, "recovery-period", provisioner.DefaultRecoveryPeriod, "how often the journal is scanned to finish or undo interrupted operations")
	flag.DurationVar(&o.ProbePeriod, "probe-period", provisioner.DefaultProbePeriod, "how often the CSI drivers are probed")
	flag.StringVar(&o.DebugAddress, "debug-address", "", "HTTP address serving /metrics (Prometheus) and /debug/pprof; empty disables")
	logging := cmdutil.LogFlags()
	flag.Parse()
	os.Exit(cmdutil.Run(provisioner.Service, logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return provisioner.Run(ctx, o)
	}))
}
