// Command watcher runs volplane's watcher: client-go informers on
// PersistentVolumes, PersistentVolumeClaims and StorageClasses, served to
// any number of subscribers as one ordered, resumable gRPC event stream.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/services/watcher"
)

func main() {
	var o watcher.Options
	cmdutil.KubeFlags(&o.Kubeconfig, &o.KubeQPS, &o.KubeBurst)
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7701", "gRPC listen address (host:port or unix:///path)")
	flag.DurationVar(&o.ResyncPeriod, "resync-period", 0, "informer resync period; 0 disables (subscribers resync on their own)")
	flag.IntVar(&o.HistorySize, "history-size", watcher.DefaultHistorySize, "events kept so that a subscriber whose stream broke can resume without a full list")
	flag.StringVar(&o.DebugAddress, "debug-address", "", "HTTP address serving /metrics (Prometheus) and /debug/pprof; empty disables")
	logging := cmdutil.LogFlags()
	flag.Parse()
	os.Exit(cmdutil.Run(watcher.Service, logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return watcher.Run(ctx, o)
	}))
}
