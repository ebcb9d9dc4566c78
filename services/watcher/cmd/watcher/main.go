// Command watcher runs volplane's watcher: client-go informers on
// PersistentVolumes, PersistentVolumeClaims and StorageClasses, served to
// any number of subscribers as one ordered, resumable gRPC event stream.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/services/watcher"
)

const description = `watcher is volplane's watcher: client-go informers on PersistentVolumes,
PersistentVolumeClaims, StorageClasses and the pods that use claims, served to the binder, the
provisioner and any other subscriber as one ordered, resumable gRPC event stream
(volplane.watcher.v1.WatcherService). It makes no decisions and writes nothing to the API.
Outside a cluster, point --kubeconfig (or $KUBECONFIG) at the cluster.`

func main() {
	var o watcher.Options
	cmd := cmdutil.NewCommand(watcher.Service, description)
	fs := cmd.Flags("Watcher")
	fs.DurationVar(&o.ResyncPeriod, "resync-period", 0, "informer resync period; 0 disables (a resync changes nothing, so it sends no events)")
	fs.IntVar(&o.HistorySize, "history-size", watcher.DefaultHistorySize, "events kept so that a subscriber whose stream broke, or that reads slowly, can resume without a full list")
	cmd.Flags(cmdutil.GroupServing).StringVar(&o.Listen, "listen", "127.0.0.1:7701", "gRPC listen address: host:port (\":7701\" for every interface) or unix:///path")
	cmd.ReflectionFlag(&o.GRPCReflection)
	cmd.KubeFlags(&o.Kubeconfig, &o.KubeQPS, &o.KubeBurst)
	cmd.TLSFlags(&o.TLS)
	cmd.DebugAddressFlag(&o.DebugAddress)
	cmd.Flags(cmdutil.GroupDebug).BoolVar(&o.EnablePprof, "enable-pprof", false, metrics.PprofFlagUsage)
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return watcher.Run(ctx, o)
	}))
}
