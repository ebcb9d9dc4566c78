// Command provisioner runs a volplane provisioner replica: it wraps CSI
// drivers for dynamic provisioning and deletion.
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
	cmdutil.EtcdFlag(&o.EtcdEndpoints, "membership")
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7703", "gRPC listen address (host:port or unix:///path)")
	flag.StringVar(&o.AdvertiseAddress, "advertise-address", "", "address peers reach this replica at; defaults to --listen")
	flag.StringVar(&o.MemberID, "member-id", "", "this replica's member id in etcd; defaults to hostname plus a random suffix")
	cmdutil.ListFlag(&o.CSIEndpoints, "csi-endpoint", "a CSI driver's gRPC address (unix:///path/csi.sock or host:port); repeat or comma-separate for several drivers")
	logging := cmdutil.LogFlags()
	flag.Parse()
	os.Exit(cmdutil.Run(provisioner.Service, logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return provisioner.Run(ctx, o)
	}))
}
