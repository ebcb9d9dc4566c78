// Command watcher runs volplane's watcher: client-go informers on
// PersistentVolumes, PersistentVolumeClaims and StorageClasses, served to
// any number of subscribers as one ordered, resumable gRPC event stream.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/services/watcher"
)

func main() {
	var o watcher.Options
	var level, format string
	var qps float64
	flag.StringVar(&o.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "path to a kubeconfig; empty ($KUBECONFIG unset) uses the in-cluster configuration")
	flag.Float64Var(&qps, "kube-api-qps", 0, "client-side limit on Kubernetes API requests per second; 0 means no limit")
	flag.IntVar(&o.KubeBurst, "kube-api-burst", 0, "burst above --kube-api-qps")
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7701", "gRPC listen address (host:port or unix:///path)")
	flag.DurationVar(&o.ResyncPeriod, "resync-period", 0, "informer resync period; 0 disables (subscribers resync on their own)")
	flag.IntVar(&o.HistorySize, "history-size", watcher.DefaultHistorySize, "events kept so that a subscriber whose stream broke can resume without a full list")
	flag.StringVar(&o.DebugAddress, "debug-address", "", "HTTP address serving /metrics (Prometheus) and /debug/pprof; empty disables")
	flag.StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	flag.StringVar(&format, "log-format", "text", "log format: text or json")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "watcher: unexpected arguments %q (flags only; see --help)\n", flag.Args())
		os.Exit(2)
	}
	o.KubeQPS = float32(qps)

	log, err := grpcutil.NewLogger(os.Stderr, watcher.Service, level, format)
	if err == nil {
		o.Logger = log
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = watcher.Run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "watcher:", err)
		os.Exit(1)
	}
}
