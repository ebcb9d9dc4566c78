// Command watcher runs volplane's watcher: client-go informers on
// PersistentVolumes, PersistentVolumeClaims and StorageClasses, served to
// any number of subscribers as one ordered, resumable gRPC event stream.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/services/watcher"
)

func main() {
	var o watcher.Options
	cmdutil.KubeFlags(&o.Kubeconfig, &o.KubeQPS, &o.KubeBurst)
	cmdutil.TLSFlags(&o.TLS)
	cmdutil.ReflectionFlag(&o.GRPCReflection)
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7701", "gRPC listen address: host:port (\":7701\" for every interface) or unix:///path")
	flag.DurationVar(&o.ResyncPeriod, "resync-period", 0, "informer resync period; 0 disables (a resync changes nothing, so it sends no events)")
	flag.IntVar(&o.HistorySize, "history-size", watcher.DefaultHistorySize, "events kept so that a subscriber whose stream broke, or that reads slowly, can resume without a full list")
	flag.StringVar(&o.DebugAddress, "debug-address", "", "HTTP address serving /metrics (Prometheus), /readyz (readiness: the gRPC health's verdict, check by check), /livez (liveness; /healthz the same), and /debug/pprof with --enable-pprof; empty disables")
	flag.BoolVar(&o.EnablePprof, "enable-pprof", false, metrics.PprofFlagUsage)
	logging := cmdutil.LogFlags()
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), `Usage: watcher [flags]

Serves PersistentVolumes, PersistentVolumeClaims and StorageClasses as one
ordered, resumable gRPC event stream (volplane.watcher.v1.WatcherService).
Outside a cluster, point --kubeconfig (or $KUBECONFIG) at the cluster.

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()
	os.Exit(cmdutil.Run(watcher.Service, logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return watcher.Run(ctx, o)
	}))
}
