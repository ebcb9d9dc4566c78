// Command volplane-bench measures how fast volplane binds: it starts a
// local kube-apiserver and etcd, the watcher and the binder, creates N
// volumes and then N claims, and prints binds/s, create-to-Bound latency
// percentiles and the binder's peak RSS. With --dynamic it measures
// dynamic provisioning instead: the dev CSI driver and the provisioner
// run too, no volumes are made up front, and it prints volumes/s.
// `make bench` runs both.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/volplane/volplane/internal/bench"
)

func main() {
	var o bench.Options
	flag.IntVar(&o.N, "n", 1000, "number of volume/claim pairs (try 10000 for the big run)")
	flag.StringVar(&o.BinDir, "bin-dir", "bin", "directory holding the watcher and binder binaries (make build)")
	flag.StringVar(&o.KubeAPIServer, "kube-apiserver", "", "kube-apiserver binary; empty uses the cached build (make kube-apiserver)")
	flag.IntVar(&o.Workers, "workers", 0, "binder --workers; 0 keeps the binder's default")
	flag.IntVar(&o.Clients, "clients", 32, "goroutines creating objects in parallel")
	flag.StringVar(&o.ProfileDir, "profile-dir", "", "save CPU profiles of the binder and the watcher taken while claims are bound into this directory")
	flag.StringVar(&o.KCM, "kube-controller-manager", "", "compare: bind with this kube-controller-manager binary's PV binder instead of volplane (make kube-controller-manager)")
	flag.IntVar(&o.KCMQPS, "kcm-qps", 20, "kube-controller-manager's --kube-api-qps and burst (its default is 20)")
	flag.StringVar(&o.ExternalProvisioner, "external-provisioner", "", "compare dynamic provisioning: with --dynamic and --kube-controller-manager, provision with this csi-provisioner binary (make external-provisioner) through the same dev CSI driver")
	flag.BoolVar(&o.Dynamic, "dynamic", false, "measure dynamic provisioning: N claims of a class of the dev CSI driver, no volumes up front (volumes/s)")
	flag.Parse()
	o.Out = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := bench.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "volplane-bench:", err)
		os.Exit(1)
	}
	r.Print(os.Stdout)
}
