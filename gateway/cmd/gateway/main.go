// Command gateway serves volplane's APIs as REST/JSON with an OpenAPI
// document, for platform tooling. Every caller is authenticated (bearer
// token or client certificate) and authorized by the cluster's RBAC; see
// gateway/README.md.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/pkg/metrics"
)

const description = `gateway is volplane's REST gateway: it serves the gRPC APIs of the watcher,
binder, provisioner and reclaimer as REST/JSON, with an OpenAPI document, for platform tooling
and kubectl volplane. Every caller is authenticated (a bearer token checked with a TokenReview,
or a client certificate) and authorized by the cluster's RBAC (SubjectAccessReviews); expensive
requests are rate limited per user. See gateway/README.md.`

func main() {
	var o gateway.Options
	cmd := cmdutil.NewCommand("gateway", description)
	fs := cmd.Flags("Gateway")
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:8080", "HTTP(S) listen address")
	fs.StringVar(&o.WatcherAddress, "watcher-address", "127.0.0.1:7701", "gRPC address of the watcher; empty leaves its routes out")
	fs.StringVar(&o.BinderAddress, "binder-address", "127.0.0.1:7702", "gRPC address of the binder (required)")
	fs.StringVar(&o.ProvisionerAddress, "provisioner-address", "127.0.0.1:7703", "gRPC address of the provisioner; empty leaves its routes out")
	fs.StringVar(&o.ReclaimerAddress, "reclaimer-address", "127.0.0.1:7704", "gRPC address of the reclaimer; empty leaves its routes out")
	fs.BoolVar(&o.Standalone, "standalone", false, "volplane's binder does not run (kube-controller-manager's binds claims): the binder's routes answer FailedPrecondition naming the mode, explain and timeline the provisioning side; --binder-address is then ignored unless set, and refused when set")
	gateway.HTTPFlags(cmd.Flags("HTTP serving"), &o.HTTP)
	gateway.AuthFlags(cmd.Flags("Authentication and authorization"), &o.Auth)
	gateway.ExpensiveFlags(cmd.Flags("Expensive requests"), &o.Expensive)
	cmd.TLSFlags(&o.TLS)
	dbg := cmd.Flags(cmdutil.GroupDebug)
	dbg.StringVar(&o.DebugAddress, "debug-address", "", "HTTP address serving /metrics (Prometheus) and /livez (/healthz the same), and /debug/pprof with --enable-pprof; empty disables")
	dbg.BoolVar(&o.EnablePprof, "enable-pprof", false, metrics.PprofFlagUsage)
	logging := cmd.LogFlags()
	os.Exit(cmd.Run(logging, func(ctx context.Context, log *slog.Logger) error {
		o.Logger = log
		if o.Standalone && !fs.Changed("binder-address") {
			o.BinderAddress = ""
		}
		return gateway.Run(ctx, o)
	}))
}
