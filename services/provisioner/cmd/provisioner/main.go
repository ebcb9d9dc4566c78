// Command provisioner runs a volplane provisioner replica: it wraps CSI
// drivers for dynamic provisioning and deletion.
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
	"github.com/volplane/volplane/services/provisioner"
)

// listFlag collects a repeatable, comma-separated flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func main() {
	var o provisioner.Options
	var etcd, level, format string
	var qps float64
	var csiEndpoints listFlag
	flag.StringVar(&o.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "path to a kubeconfig; empty ($KUBECONFIG unset) uses the in-cluster configuration")
	flag.Float64Var(&qps, "kube-api-qps", 0, "client-side limit on Kubernetes API requests per second; 0 means no limit")
	flag.IntVar(&o.KubeBurst, "kube-api-burst", 0, "burst above --kube-api-qps")
	flag.StringVar(&etcd, "etcd-endpoints", "http://127.0.0.1:2379", "comma-separated etcd client URLs for membership")
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7703", "gRPC listen address (host:port or unix:///path)")
	flag.StringVar(&o.AdvertiseAddress, "advertise-address", "", "address peers reach this replica at; defaults to --listen")
	flag.StringVar(&o.MemberID, "member-id", "", "this replica's member id in etcd; defaults to hostname plus a random suffix")
	flag.Var(&csiEndpoints, "csi-endpoint", "a CSI driver's gRPC address (unix:///path/csi.sock or host:port); repeat or comma-separate for several drivers")
	flag.StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	flag.StringVar(&format, "log-format", "text", "log format: text or json")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "provisioner: unexpected arguments %q (flags only; see --help)\n", flag.Args())
		os.Exit(2)
	}
	o.KubeQPS = float32(qps)
	o.EtcdEndpoints = strings.Split(etcd, ",")
	o.CSIEndpoints = csiEndpoints

	log, err := grpcutil.NewLogger(os.Stderr, provisioner.Service, level, format)
	if err == nil {
		o.Logger = log
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = provisioner.Run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "provisioner:", err)
		os.Exit(1)
	}
}
