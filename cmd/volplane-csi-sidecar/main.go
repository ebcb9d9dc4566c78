// Command volplane-csi-sidecar takes csi-provisioner's place in a CSI
// driver's own pod: it accepts csi-provisioner v6.3.0's command line,
// serves the driver's Identity and Controller services to volplane's
// provisioner over mutual TLS, and registers the driver with a Lease
// (internal/csisidecar, docs/sidecar.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/volplane/volplane/internal/csisidecar"
	"github.com/volplane/volplane/pkg/logging"
	"github.com/volplane/volplane/pkg/version"
)

func main() { os.Exit(run()) }

func run() int {
	o, err := csisidecar.Parse(os.Args[1:], os.Stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "volplane-csi-sidecar:", err)
		return 2
	}
	v := version.Get()
	if o.Provisioner.ShowVersion {
		fmt.Println(os.Args[0], v.Version)
		return 0
	}
	log, err := logging.New(os.Stderr, "volplane-csi-sidecar", strings.ToLower(o.Provisioner.LogLevel().String()), o.Provisioner.LoggingFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "volplane-csi-sidecar:", err)
		return 2
	}
	logging.Route(log)
	log.Info("starting", "version", v.Version, "commit", v.Commit, "go", v.GoVersion, "csiProvisionerFlags", csisidecar.ProvisionerVersion)
	o.Logger = log
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := csisidecar.Run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "volplane-csi-sidecar:", err)
		return 1
	}
	return 0
}
