// Command volplane-chaos runs volplane under a seeded storm of claims and
// deletions while killing its processes, then checks and prints the
// invariants (test/harness/chaos, docs/chaos.md). It exits 1 when any
// invariant is violated, 2 when the run could not be carried out. `make
// chaos SEED=... DURATION=...` runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/volplane/volplane/pkg/cmdutil"
	"github.com/volplane/volplane/test/harness/chaos"
)

const description = `volplane-chaos runs volplane under a seeded storm of claims and deletions
while killing its processes (and etcd members) at random, then checks and prints the safety
invariants: no volume bound twice, no live claim's data deleted, no backing volume leaked, every
claim converged. It exits 1 when any invariant is violated, 2 when the run could not be carried
out. See docs/chaos.md.`

func main() {
	var o chaos.Options
	var keep bool
	cmd := cmdutil.NewCommand("volplane-chaos", description)
	fs := cmd.Flags("Chaos run")
	exe, _ := os.Executable()
	fs.StringVar(&o.Cluster.BinDir, "bin-dir", filepath.Dir(exe), "directory holding the binaries (make build)")
	fs.StringVar(&o.Cluster.KubeAPIServer, "kube-apiserver", "", "kube-apiserver binary; default: the cached build (make kube-apiserver)")
	fs.StringVar(&o.Cluster.Dir, "dir", "", "state directory (etcd data, certificates, logs, volumes); default a new temporary directory")
	fs.BoolVar(&keep, "keep", false, "keep the state directory (its logs/) after the run; it is kept anyway when an invariant is violated")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the storm and the faults")
	fs.DurationVar(&o.Duration, "duration", chaos.DefaultDuration, "how long the storm and the faults last")
	fs.IntVar(&o.StaticPairs, "static", 1000, "static PV/PVC pairs (half the PVs Recycle, half Retain)")
	fs.IntVar(&o.DynamicClaims, "dynamic", 500, "claims of the dev CSI driver's class (policy Delete)")
	fs.IntVar(&o.Deletions, "deletions", 300, "claims deleted during the storm, most while they bind or provision")
	fs.DurationVar(&o.KillEvery, "kill-every", chaos.DefaultKillEvery, "mean time between two SIGKILLs of a random replica")
	fs.DurationVar(&o.Converge, "converge-timeout", chaos.DefaultConverge, "longest wait for the cluster to converge after the last fault")
	fs.BoolVar(&o.RebindReleased, "rebind-released", false, "put the rebind policy volplane.io/rebind-released: SameClaimName on the classes and most static PVs, and create half the deleted claims again under their name (docs/rebind.md)")
	fs.IntVar(&o.Cluster.EtcdMembers, "etcd-members", 1, "1, or 3 to run etcd as a cluster and kill one member at a time")
	fs.StringVar(&o.Cluster.LogLevel, "log-level", "info", "the services' log level")
	if code, done := cmd.Parse(os.Args[1:]); done {
		os.Exit(code)
	}
	if err := cmd.NoArgs(); err != nil {
		os.Exit(cmd.UsageError(err))
	}
	if o.Cluster.Dir == "" {
		dir, err := os.MkdirTemp("", "volplane-chaos-")
		if err != nil {
			fmt.Fprintln(os.Stderr, "volplane-chaos:", err)
			os.Exit(2)
		}
		o.Cluster.Dir = dir
	}
	o.Out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "volplane-chaos: %v (state and logs in %s)\n", err, o.Cluster.Dir)
		os.Exit(2)
	}
	if err := rep.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "volplane-chaos: %v\nstate and logs in %s\n", err, o.Cluster.Dir)
		os.Exit(1)
	}
	if keep {
		fmt.Println("state and logs in", o.Cluster.Dir)
	} else {
		os.RemoveAll(o.Cluster.Dir)
	}
}
