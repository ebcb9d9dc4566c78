// Command gateway serves volplane's APIs as REST/JSON with an OpenAPI
// document, for platform tooling.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/volplane/volplane/gateway"
	"github.com/volplane/volplane/pkg/grpcutil"
)

func main() {
	var o gateway.Options
	var level, format string
	flag.StringVar(&o.Listen, "listen", "127.0.0.1:8080", "HTTP listen address")
	flag.StringVar(&o.WatcherAddress, "watcher-address", "127.0.0.1:7701", "gRPC address of the watcher; empty leaves its routes out")
	flag.StringVar(&o.BinderAddress, "binder-address", "127.0.0.1:7702", "gRPC address of the binder (required)")
	flag.StringVar(&o.ProvisionerAddress, "provisioner-address", "127.0.0.1:7703", "gRPC address of the provisioner; empty leaves its routes out")
	flag.StringVar(&o.ReclaimerAddress, "reclaimer-address", "127.0.0.1:7704", "gRPC address of the reclaimer; empty leaves its routes out")
	flag.StringVar(&level, "log-level", "info", "log level: debug, info, warn or error")
	flag.StringVar(&format, "log-format", "text", "log format: text or json")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gateway: unexpected arguments %q (flags only; see --help)\n", flag.Args())
		os.Exit(2)
	}
	log, err := grpcutil.NewLogger(os.Stderr, "gateway", level, format)
	if err == nil {
		o.Logger = log
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		err = gateway.Run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}
