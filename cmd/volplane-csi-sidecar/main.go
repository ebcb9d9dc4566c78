// Command volplane-csi-sidecar takes csi-provisioner's place in a CSI
// driver's own pod: it accepts csi-provisioner v6.3.0's command line,
// serves the driver's Identity and Controller services to volplane's
// provisioner over mutual TLS, and registers the driver with a Lease
// (internal/csisidecar, docs/sidecar.md).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/volplane/volplane/internal/csisidecar"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/version"
)

func main() { os.Exit(run()) }

func run() int {
	var o csisidecar.Options
	cmd := csisidecar.NewCommand(&o)
	if code, done := cmd.Parse(os.Args[1:]); done {
		return code
	}
	if err := cmd.NoArgs(); err != nil {
		return cmd.UsageError(err)
	}
	o.Finish(cmd.FlagSet())
	// A refused flag is bad usage: one line naming it.
	if err := o.Validate(); err != nil {
		return cmd.UsageError(err)
	}
	log, err := logging.New(os.Stderr, cmd.Name, strings.ToLower(o.Provisioner.LogLevel().String()), o.Provisioner.LoggingFormat)
	if err != nil {
		return cmd.UsageError(err)
	}
	logging.Route(log)
	v := version.Get()
	log.Info("starting", "version", v.Version, "commit", v.Commit, "go", v.GoVersion, "csiProvisionerFlags", csisidecar.ProvisionerVersion)
	o.Logger = log
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := csisidecar.Run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", cmd.Name, err)
		return 1
	}
	return 0
}
