// Package conformance runs volplane's conformance suites (pkg/conformance)
// against volplane's own services: a real kube-apiserver and etcd, the
// watcher, binder, provisioner and reclaimer with mutual TLS, and the dev
// CSI driver behind the provisioner, all in this process. The package
// minimalprov runs them against a second, minimal provisioner.
package conformance

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// cluster is what every test shares.
var cluster struct {
	e2e             *e2e.Cluster
	csiEndpoint     string
	watcherAddr     string
	provisionerAddr string
	reclaimerAddr   string
	binderAddr      string
}

// historySize is the watcher's history here: small, so that the watcher
// suite can push a cursor out of it and see the relist.
const historySize = 200

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/conformance: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := e2e.StartCluster(ctx, "e2e/conformance", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/conformance:", err)
		return 1
	}
	defer c.Stop()
	cluster.e2e = c
	env := c.Env
	logger := func(name string) *slog.Logger { return c.Logger(name, slog.LevelInfo) }

	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(c.Dir(), "csi"), NodeID: "node-a", Logger: logger("csi")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/conformance: dev CSI driver:", err)
		return 1
	}
	// The node a kubelet would register for the driver: its topology is
	// what the provisioner offers CreateVolume, as external-provisioner.
	if err := devcsi.RegisterNode(ctx, c.Client, drv.Name(), drv.NodeID()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/conformance:", err)
		return 1
	}
	cluster.csiEndpoint = "unix://" + filepath.Join(c.Dir(), "csi.sock")
	lis, err := grpcutil.Listen(cluster.csiEndpoint)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	csiSrv := grpcutil.NewCSIServer(logger("csi"))
	drv.Register(csiSrv.Server)
	csiSrv.SetServing(true)

	for _, a := range []*string{&cluster.watcherAddr, &cluster.provisionerAddr, &cluster.reclaimerAddr, &cluster.binderAddr} {
		if *a, err = devenv.FreeAddr(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	errc := make(chan error, 5)
	go func() { errc <- csiSrv.Serve(ctx, lis, 10*time.Second) }()
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{Kubeconfig: env.Kubeconfig, Listen: cluster.watcherAddr, HistorySize: historySize,
			TLS: c.TLS("watcher"), Logger: logger("watcher")})
	}()
	go func() {
		errc <- provisioner.Run(ctx, provisioner.Options{
			Options:        replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.provisionerAddr, TLS: c.TLS("provisioner"), Logger: logger("provisioner")},
			CSIEndpoints:   []string{cluster.csiEndpoint},
			Timeout:        5 * time.Second,
			RecoveryPeriod: time.Second,
		})
	}()
	go func() {
		errc <- reclaimer.Run(ctx, reclaimer.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.reclaimerAddr, TLS: c.TLS("reclaimer"), Logger: logger("reclaimer")},
			ProvisionerAddress: cluster.provisionerAddr,
		})
	}()
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.binderAddr, TLS: c.TLS("binder"), Logger: logger("binder")},
			WatcherAddress:     cluster.watcherAddr,
			ReclaimerAddress:   cluster.reclaimerAddr,
			ProvisionerAddress: cluster.provisionerAddr,
		})
	}()
	return c.RunTests(m, "e2e/conformance", cancel, errc, 5)
}

// driverName is the dev CSI driver's name, which the provisioner serves as
// the StorageClass provisioner of the same name.
const driverName = devcsi.DefaultName
