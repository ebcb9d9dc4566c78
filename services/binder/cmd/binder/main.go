// Command binder runs a volplane binder replica: the binding state machine
// of Kubernetes' PersistentVolume controller, fed by the watcher's event
// stream, with its reservations and membership in etcd.
package main

import (
	"context"
	"log/slog"
	"os"
	"strings"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/services/binder"
)

const description = `binder is a replica of volplane's binder: the binding state machine of
Kubernetes' PersistentVolume controller (kube-controller-manager's persistentvolume-binder),
which binds PersistentVolumeClaims to PersistentVolumes, asks the provisioner for new volumes
and hands Released volumes to the reclaimer. It reads PersistentVolumes, claims and
StorageClasses from the watcher's event stream, writes to the Kubernetes API, and shares the
work with the other replicas through etcd (membership and reservations).`

func main() {
	var o binder.Options
	cmd := cmdutil.NewCommand("binder", description)
	fs := cmd.Flags("Binder")
	watchers := []string{"127.0.0.1:7701"}
	fs.Var(cmdutil.NewList(&watchers, "addresses"), "watcher-address", "gRPC address of the watcher service; repeat the flag or separate addresses with commas for several watcher replicas (the binder streams from one and fails over to another)")
	fs.DurationVar(&o.StaleAfter, "watcher-stale-after", binder.DefaultStaleAfter, "how long without a live, caught-up watcher stream before the binder turns NOT_SERVING and hands off no reclaim or provisioning; at least 2s")
	fs.StringVar(&o.ReclaimerAddress, "reclaimer-address", "", "gRPC address of the reclaimer service; empty leaves Released volumes alone")
	fs.StringVar(&o.ProvisionerAddress, "provisioner-address", "", "gRPC address of the provisioner service")
	fs.IntVar(&o.Workers, "workers", binder.DefaultWorkers, "number of claim workers and of volume workers")
	fs.IntVar(&o.ProvisionCalls, "provision-calls", binder.DefaultProvisionCalls, "provisioner calls in flight at most (they run off the workers, so a hanging CSI driver never holds one)")
	fs.DurationVar(&o.RetryIntervalStart, "retry-interval-start", binder.DefaultRetryIntervalStart, "initial retry interval of failed provisioning of a claim; it doubles with each failure, up to --retry-interval-max (external-provisioner's flag)")
	fs.DurationVar(&o.RetryIntervalMax, "retry-interval-max", binder.DefaultRetryIntervalMax, "maximum retry interval of failed provisioning of a claim (external-provisioner's flag)")
	fs.DurationVar(&o.ResyncPeriod, "resync-period", binder.DefaultResyncPeriod, "how often every claim and volume is synced again; 0 disables")
	byShard := fs.Bool("claims-by-shard", binder.DefaultClaimsByShard, "ask the watcher for this replica's shard of the claims only, so that replicas divide the claims' CPU and memory (ListClaims then asks every replica for its shard); false: every replica caches every claim")
	fs.DurationVar(&o.OwnershipSettle, "ownership-settle", binder.DefaultOwnershipSettle, "how long the replica waits before acting on a claim or volume it gains (ring change, new etcd session, start), so that the previous owner has stopped")
	foreign := append([]string{}, binder.DefaultForeignBinderManagers...)
	fs.Var(cmdutil.NewList(&foreign, "strings"), "foreign-binder-managers", "field managers of other binders (kube-controller-manager's PV binder left on): their binding writes to this replica's claims and volumes are reported as a ForeignBinder Event, volplane_binder_foreign_binds_total and a warning; empty reports none")
	o.AddFlags(cmd, "127.0.0.1:7702", "reservations")
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.WatcherAddress = strings.Join(watchers, ",")
		o.AllClaims = !*byShard
		o.ForeignBinderManagers = append([]string{}, foreign...) // empty, not nil: none
		o.Logger = log
		return binder.Run(ctx, o)
	}))
}
