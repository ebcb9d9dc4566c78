// Command reclaimer runs a volplane reclaimer replica: it carries out the
// reclaim policy of Released PersistentVolumes.
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
	"github.com/volplane/volplane/services/reclaimer"
)

func main() {
	var o reclaimer.Options
	var etcd, level, format string
	var qps float64
	flag.StringVar(&o.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "path to a kubeconfig; empty ($KUBECONFIG unset) uses the in-cluster configuration")
	flag.Float64Var(&qps, "kube-api-qps", 0, "client-side limit on Kubernetes API requests per second; 0 means no limit")
	flag.IntVar(&o.KubeBurst, "kube-api-burst", 0, "burst above --kube-api-qps")
	flag.StringVar(&etcd, "etcd-endpoints", "http://127.0.0.1:2379", "comma-separated etcd client URLs for membership")
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7704", "gRPC listen address (host:port or unix:///path)")
	flag.StringVar(&o.AdvertiseAddress, "advertise-address", "", "address peers reach this replica at; defaults to --listen")
	flag.StringVar(&o.MemberID, "member-id", "", "this replica's member id in etcd; defaults to hostname plus a random suffix")
	flag.StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	flag.StringVar(&format, "log-format", "text", "log format: text or json")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "reclaimer: unexpected arguments %q (flags only; see --help)\n", flag.Args())
		os.Exit(2)
	}
	o.KubeQPS = float32(qps)
	o.EtcdEndpoints = strings.Split(etcd, ",")

	log, err := grpcutil.NewLogger(os.Stderr, reclaimer.Service, level, format)
	if err == nil {
		o.Logger = log
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = reclaimer.Run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "reclaimer:", err)
		os.Exit(1)
	}
}
