// Command binder runs a volplane binder replica: the binding state machine
// of Kubernetes' PersistentVolume controller, fed by the watcher's event
// stream, with its reservations and membership in etcd.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/services/binder"
)

func main() {
	var o binder.Options
	var etcd, level, format string
	var qps float64
	flag.StringVar(&o.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "path to a kubeconfig; empty ($KUBECONFIG unset) uses the in-cluster configuration")
	flag.Float64Var(&qps, "kube-api-qps", 0, "client-side limit on Kubernetes API requests per second; 0 means no limit")
	flag.IntVar(&o.KubeBurst, "kube-api-burst", 0, "burst above --kube-api-qps")
	flag.StringVar(&etcd, "etcd-endpoints", "http://127.0.0.1:2379", "comma-separated etcd client URLs for membership and reservations")
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7702", "gRPC listen address (host:port or unix:///path)")
	flag.StringVar(&o.AdvertiseAddress, "advertise-address", "", "address other components reach this replica at; defaults to --listen")
	flag.StringVar(&o.WatcherAddress, "watcher-address", "127.0.0.1:7701", "gRPC address of the watcher service")
	flag.StringVar(&o.ReclaimerAddress, "reclaimer-address", "", "gRPC address of the reclaimer service; empty leaves Released volumes alone")
	flag.StringVar(&o.ProvisionerAddress, "provisioner-address", "", "gRPC address of the provisioner service")
	flag.IntVar(&o.Workers, "workers", binder.DefaultWorkers, "number of claim workers and of volume workers")
	flag.DurationVar(&o.ResyncPeriod, "resync-period", binder.DefaultResyncPeriod, "how often every claim and volume is synced again; 0 disables")
	flag.StringVar(&o.MemberID, "member-id", "", "this replica's member id in etcd; defaults to hostname plus a random suffix")
	flag.StringVar(&o.DebugAddress, "debug-address", "", "HTTP address serving /metrics (Prometheus) and /debug/pprof; empty disables")
	flag.StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	flag.StringVar(&format, "log-format", "text", "log format: text or json")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "binder: unexpected arguments %q (flags only; see --help)\n", flag.Args())
		os.Exit(2)
	}
	o.KubeQPS = float32(qps)
	o.EtcdEndpoints = strings.Split(etcd, ",")

	log, err := grpcutil.NewLogger(os.Stderr, "binder", level, format)
	if err == nil {
		o.Logger = log
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = binder.Run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "binder:", err)
		os.Exit(1)
	}
}
