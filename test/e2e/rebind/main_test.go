// Package rebind tests the opt-in rebinding of a Released volume to its
// recreated claim (services/binder/rebind.go, docs/rebind.md) end to end:
// a real kube-apiserver and etcd, and the watcher, binder and reclaimer
// services in this process.
package rebind

import (
	"context"
	"flag"
	"fmt"
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

// cluster is what every test shares.
var cluster struct {
	client kubernetes.Interface
	etcd   []string
}

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
		fmt.Println("e2e/rebind: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := e2e.StartCluster(ctx, "e2e/rebind", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/rebind:", err)
		return 1
	}
	defer c.Stop()
	cluster.client, cluster.etcd = c.Client, c.EtcdEndpoints
	logger := func(name string) *slog.Logger { return c.Logger(name, slog.LevelInfo) }

	watcherAddr, binderAddr, reclaimerAddr := freeAddr(), freeAddr(), freeAddr()
	errc := make(chan error, 3)
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{Kubeconfig: c.Kubeconfig, Listen: watcherAddr, TLS: c.TLS("watcher"), Logger: logger("watcher")})
	}()
	go func() {
		errc <- reclaimer.Run(ctx, reclaimer.Options{
			Options:            replica.Options{Kubeconfig: c.Kubeconfig, EtcdEndpoints: c.EtcdEndpoints, Listen: reclaimerAddr, TLS: c.TLS("reclaimer"), Logger: logger("reclaimer")},
			RetryIntervalStart: 100 * time.Millisecond,
			RetryIntervalMax:   2 * time.Second,
		})
	}()
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options:          replica.Options{Kubeconfig: c.Kubeconfig, EtcdEndpoints: c.EtcdEndpoints, Listen: binderAddr, TLS: c.TLS("binder"), Logger: logger("binder")},
			WatcherAddress:   watcherAddr,
			ReclaimerAddress: reclaimerAddr,
			// Long enough that the tests prove the event-driven path.
			ResyncPeriod: 10 * time.Minute,
		})
	}()
	for _, addr := range []string{watcherAddr, reclaimerAddr, binderAddr} {
		if err := c.WaitServing(ctx, addr, 2*time.Minute); err != nil {
			fmt.Fprintln(os.Stderr, "e2e/rebind: services did not start:", err)
			c.DumpLogs(os.Stderr)
			return 1
		}
	}
	return c.RunTests(m, "e2e/rebind", cancel, errc, 3)
}
