// Command volplane-bench measures how fast volplane binds, each run on a
// fresh local etcd and kube-apiserver: a burst of N claims (binds/s and
// create-to-Bound latency), the same bound by a bare client doing only a
// bind's API writes (--ceiling, or interleaved with --vs-ceiling), or
// claims arriving at fixed rates (--rate). --dynamic measures dynamic
// provisioning through the dev CSI driver instead, --dynamic --delete the
// deletion of N provisioned volumes at once, --hop dynamic provisioning
// through volplane-csi-sidecar against the in-pod socket; --existing runs on a
// cluster already holding that many volumes. Every run prints each
// process's peak RSS and CPU time and the apiserver's and etcd's requests
// per claim. `make bench`, `make bench-rate` and `make help` show the
// usual invocations.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/test/harness/bench"
)

const description = `volplane-bench measures how fast volplane binds, each run on a fresh local etcd
and kube-apiserver: a burst of N claims (binds/s and create-to-Bound latency), the same bound by
a bare client doing only a bind's API writes (--ceiling, or interleaved with --vs-ceiling), or
claims arriving at fixed rates (--rate). --dynamic measures dynamic provisioning through the dev
CSI driver instead, --dynamic --delete the deletion of N provisioned volumes at once, --hop
dynamic provisioning through volplane-csi-sidecar against the in-pod socket; --existing runs on a
cluster already holding that many volumes. Every run
prints each process's peak RSS and CPU time and the API server's and etcd's requests per claim.`

func main() {
	var o bench.Options
	cmd := cmdutil.NewCommand("volplane-bench", description)
	fs := cmd.Flags("Benchmark")
	fs.IntVarP(&o.N, "n", "n", 1000, "claims of a burst (and volumes, static); try 10000 for the big run")
	fs.StringVar(&o.BinDir, "bin-dir", "bin", "directory holding the service binaries and volplane-etcd (make build)")
	fs.StringVar(&o.KubeAPIServer, "kube-apiserver", "", "kube-apiserver binary; empty uses the cached build (make kube-apiserver)")
	fs.IntVar(&o.Binders, "binders", 1, "binder replicas (sharing the claims through etcd membership, as in production)")
	fs.IntVar(&o.Workers, "workers", 0, "binder --workers and the ceiling's workers; 0 means 128 (bench.DefaultWorkers)")
	fs.IntVar(&o.Clients, "clients", 32, "goroutines creating a burst's claims, the volumes and the --existing population")
	fs.StringVar(&o.ProfileDir, "profile-dir", "", "save CPU and heap profiles of what binds (the binder, the watcher and, dynamic, the provisioner; or kube-controller-manager and, dynamic, csi-provisioner) and a CPU profile of kube-apiserver, taken during a burst (or, with --rate, while each rate's claims arrive, in rate-<R>/) into this directory; a single burst then prints each process's CPU per claim by cause")
	fs.IntVar(&o.ProfileSeconds, "profile-seconds", 0, "with --profile-dir, how long a burst is profiled from its first create; 0 means n/300 s, 2 s at least (longer than the burst covers all of it)")
	fs.BoolVar(&o.KeepLogs, "keep-logs", false, "keep each run's directory with every process's log (printed at the end of the run) instead of removing it")
	fs.StringVar(&o.KCM, "kube-controller-manager", "", "compare: bind with this kube-controller-manager binary's PV binder instead of volplane (make kube-controller-manager)")
	fs.IntVar(&o.KCMQPS, "kcm-qps", 20, "kube-controller-manager's (and csi-provisioner's) --kube-api-qps and burst (its default is 20)")
	fs.StringVar(&o.ExternalProvisioner, "external-provisioner", "", "compare dynamic provisioning: with --dynamic and --kube-controller-manager, provision with this csi-provisioner binary (make external-provisioner) through the same dev CSI driver")
	fs.BoolVar(&o.Dynamic, "dynamic", false, "measure dynamic provisioning: claims of a class of the dev CSI driver, no volumes up front (volumes/s)")
	fs.BoolVar(&o.Delete, "delete", false, "with --dynamic, measure a deletion burst: provision the claims (reclaim policy Delete), then delete them all at once and time each until its volume is gone and the dev CSI driver holds none (volumes deleted/s)")
	fs.BoolVar(&o.Ceiling, "ceiling", false, "bind with the bare client instead: only the API writes (and, with --dynamic, Events and CreateVolume) of a bind, from as many workers as the binder")
	fs.IntVar(&o.VsCeiling, "vs-ceiling", 0, "interleave this many bursts of the binder with as many of --ceiling (A/B/A/B, fresh control plane each) and print their ratio")
	fs.Var(&o.Rates, "rate", "open-loop arrivals instead of a burst: claims per second, comma separated (e.g. 25,50,100,150,200), each for --duration on a fresh control plane")
	fs.DurationVar(&o.Duration, "duration", bench.DefaultDuration, "how long claims arrive at each --rate")
	fs.IntVar(&o.Existing, "existing", 0, "volumes (90 % Bound to claims) created before the services start, e.g. 100000")
	fs.StringArrayVar(&o.ServiceFlags, "service-flag", nil, "a flag for volplane's binder and provisioner, repeatable (e.g. --service-flag=--timeline=false to measure the timeline's cost)")
	fs.StringArrayVar(&o.BinderFlags, "binder-flag", nil, "a flag for volplane's binders only, repeatable (e.g. --binder-flag=--claims-by-shard=false with --binders 2, every replica caching every claim)")
	fs.IntVar(&o.Compare, "compare", 0, "run this many rounds of volplane and of --kube-controller-manager (with --external-provisioner, dynamic) interleaved, static then dynamic, at each of --sizes, and print one table of both and their ratios")
	fs.IntVar(&o.Hop, "hop", 0, "measure the sidecar's hop: this many rounds of dynamic provisioning with the dev CSI driver on the provisioner's unix socket (--csi-endpoint) and through a volplane-csi-sidecar over mutual TLS (--discover-sidecars), interleaved, and one table of both and their ratio")
	fs.Var(&o.Sizes, "sizes", "with --compare, the burst sizes, comma separated (e.g. 1000,10000); default -n")
	fs.StringVar(&o.Placement, "placement", bench.PlacementShared, "where the processes run: shared (any CPU) or split (kube-apiserver and etcd on --control-plane-cpus, everything else, the bench included, on the other CPUs; the ceiling too)")
	fs.Var(&o.ControlPlaneCPUs, "control-plane-cpus", "with --placement split, the control plane's CPUs (e.g. 0 or 0-3); default the first half of the CPUs the bench may use")
	if code, done := cmd.Parse(os.Args[1:]); done {
		os.Exit(code)
	}
	if err := cmd.NoArgs(); err != nil {
		os.Exit(cmd.UsageError(err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.Run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "volplane-bench:", err)
		stop()
		os.Exit(1)
	}
}
