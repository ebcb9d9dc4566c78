package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// cluster is the environment every test shares: one apiserver, one etcd,
// one watcher, one reclaimer (node-local Recycle, as if on node e2eNode)
// and one binder.
var cluster struct {
	env           *devenv.Env
	client        kubernetes.Interface
	watcherAddr   string
	binderAddr    string
	reclaimerAddr string
	logs          string
	// e2e dials the services and hands out their certificates.
	e2e *e2e.Cluster
}

// e2eNode is the node the shared reclaimer scrubs hostPath volumes on.
const e2eNode = "e2e-node"

func freeAddr() string {
	addr, err := devenv.FreeAddr()
	if err != nil {
		panic(err)
	}
	return addr
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := e2e.StartCluster(ctx, "e2e", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer c.Stop()
	env := c.Env
	cluster.env = env
	cluster.client = c.Client
	// Service logs go to a file, printed when a test fails.
	cluster.logs = c.LogPath
	cluster.e2e = c
	logger := func(name string) *slog.Logger { return c.Logger(name, slog.LevelInfo) }
	dumpLogs = c.DumpLogs

	cluster.watcherAddr = freeAddr()
	cluster.binderAddr = freeAddr()
	reclaimerAddr := freeAddr()
	cluster.reclaimerAddr = reclaimerAddr
	errc := make(chan error, 3)
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{Kubeconfig: env.Kubeconfig, Listen: cluster.watcherAddr, TLS: c.TLS("watcher"), Logger: logger("watcher")})
	}()
	go func() {
		errc <- reclaimer.Run(ctx, reclaimer.Options{
			Options: replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: reclaimerAddr, TLS: c.TLS("reclaimer"), Logger: logger("reclaimer")},
			// The tests' hostPath volumes are directories under the
			// temporary directory.
			RecycleMode:         reclaimer.RecycleNodeLocal,
			NodeName:            e2eNode,
			RecyclePathPrefixes: []string{os.TempDir()},
			RetryIntervalStart:  100 * time.Millisecond,
			RetryIntervalMax:    2 * time.Second,
		})
	}()
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options:          replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.binderAddr, TLS: c.TLS("binder"), Logger: logger("binder")},
			WatcherAddress:   cluster.watcherAddr,
			ReclaimerAddress: reclaimerAddr,
			// Long enough that every test below proves the event-driven
			// path, not the periodic resync.
			ResyncPeriod: 10 * time.Minute,
		})
	}()
	if err := waitServing(ctx, cluster.binderAddr, errc); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: services did not start:", err)
		dumpLogs(os.Stderr)
		return 1
	}
	return c.RunTests(m, "e2e", cancel, errc, 3)
}

// dumpLogs prints the services' log (set by run).
var dumpLogs func(w io.Writer)
