// Command binder runs a volplane binder replica: the binding state machine
// of Kubernetes' PersistentVolume controller, fed by the watcher's event
// stream, with its reservations and membership in etcd.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"strings"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/services/binder"
)

func main() {
	var o binder.Options
	o.AddFlags("127.0.0.1:7702", "reservations")
	watchers := []string{"127.0.0.1:7701"}
	cmdutil.ListFlag(&watchers, "watcher-address", "gRPC address of the watcher service; repeat the flag or separate addresses with commas for several watcher replicas (the binder streams from one and fails over to another)")
	flag.DurationVar(&o.StaleAfter, "watcher-stale-after", binder.DefaultStaleAfter, "how long without a live, caught-up watcher stream before the binder turns NOT_SERVING and hands off no reclaim or provisioning; at least 2s")
	flag.StringVar(&o.ReclaimerAddress, "reclaimer-address", "", "gRPC address of the reclaimer service; empty leaves Released volumes alone")
	flag.StringVar(&o.ProvisionerAddress, "provisioner-address", "", "gRPC address of the provisioner service")
	flag.IntVar(&o.Workers, "workers", binder.DefaultWorkers, "number of claim workers and of volume workers")
	flag.IntVar(&o.ProvisionCalls, "provision-calls", binder.DefaultProvisionCalls, "provisioner calls in flight at most (they run off the workers, so a hanging CSI driver never holds one)")
	flag.DurationVar(&o.ResyncPeriod, "resync-period", binder.DefaultResyncPeriod, "how often every claim and volume is synced again; 0 disables")
	flag.DurationVar(&o.OwnershipSettle, "ownership-settle", binder.DefaultOwnershipSettle, "how long the replica waits before acting on a claim or volume it gains (ring change, new etcd session, start), so that the previous owner has stopped")
	foreign := append([]string{}, binder.DefaultForeignBinderManagers...)
	cmdutil.ListFlag(&foreign, "foreign-binder-managers", "field managers of other binders (kube-controller-manager's PV binder left on): their binding writes to this replica's claims and volumes are reported as a ForeignBinder Event, volplane_binder_foreign_binds_total and a warning; empty reports none")
	logging := cmdutil.LogFlags()
	flag.Parse()
	o.WatcherAddress = strings.Join(watchers, ",")
	o.ForeignBinderManagers = append([]string{}, foreign...) // empty, not nil: none
	os.Exit(cmdutil.Run("binder", logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return binder.Run(ctx, o)
	}))
}
