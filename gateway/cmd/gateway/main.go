// Command gateway serves volplane's APIs as REST/JSON with an OpenAPI
// document, for platform tooling. Every caller is authenticated (bearer
// token or client certificate) and authorized by the cluster's RBAC; see
// gateway/README.md.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/metrics"
)

func main() {
	var o gateway.Options
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:8080", "HTTP(S) listen address")
	flag.StringVar(&o.WatcherAddress, "watcher-address", "127.0.0.1:7701", "gRPC address of the watcher; empty leaves its routes out")
	flag.StringVar(&o.BinderAddress, "binder-address", "127.0.0.1:7702", "gRPC address of the binder (required)")
	flag.StringVar(&o.ProvisionerAddress, "provisioner-address", "127.0.0.1:7703", "gRPC address of the provisioner; empty leaves its routes out")
	flag.StringVar(&o.ReclaimerAddress, "reclaimer-address", "127.0.0.1:7704", "gRPC address of the reclaimer; empty leaves its routes out")
	flag.StringVar(&o.DebugAddress, "debug-address", "", "HTTP address serving /metrics (Prometheus) and /livez (/healthz the same), and /debug/pprof with --enable-pprof; empty disables")
	flag.BoolVar(&o.EnablePprof, "enable-pprof", false, metrics.PprofFlagUsage)
	cmdutil.TLSFlags(&o.TLS)
	gateway.AuthFlags(flag.CommandLine, &o.Auth)
	gateway.HTTPFlags(flag.CommandLine, &o.HTTP)
	gateway.ExpensiveFlags(flag.CommandLine, &o.Expensive)
	logging := cmdutil.LogFlags()
	flag.Parse()
	os.Exit(cmdutil.Run("gateway", logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		return gateway.Run(ctx, o)
	}))
}
