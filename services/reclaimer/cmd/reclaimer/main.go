// Command reclaimer runs a volplane reclaimer replica: it carries out the
// reclaim policy of Released PersistentVolumes.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/services/reclaimer"
)

func main() {
	var o reclaimer.Options
	cmdutil.KubeFlags(&o.Kubeconfig, &o.KubeQPS, &o.KubeBurst)
	cmdutil.EtcdFlag(&o.EtcdEndpoints, "membership")
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:7704", "gRPC listen address (host:port or unix:///path)")
	flag.StringVar(&o.AdvertiseAddress, "advertise-address", "", "address peers reach this replica at; defaults to --listen")
	flag.StringVar(&o.MemberID, "member-id", "", "this replica's member id in etcd; defaults to hostname plus a random suffix")
	logging := cmdutil.LogFlags()
	flag.Parse()
	os.Exit(cmdutil.Run(reclaimer.Service, logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return reclaimer.Run(ctx, o)
	}))
}
