package minimalprov

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// cluster is a real kube-apiserver and etcd with the dev CSI driver, this
// package's minimal provisioner in front of it, and volplane's watcher,
// binder and reclaimer, the binder and reclaimer configured with the
// minimal provisioner's address. Nil in -short mode: the unit tests run
// without it.
var cluster *struct {
	e2e             *e2e.Cluster
	csiEndpoint     string
	provisionerAddr string
	reclaimerAddr   string
	binderAddr      string
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := e2e.StartCluster(ctx, "e2e/conformance/minimalprov", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/conformance/minimalprov:", err)
		return 1
	}
	defer c.Stop()
	env := c.Env
	logger := func(name string) *slog.Logger { return c.Logger(name, slog.LevelInfo) }
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "e2e/conformance/minimalprov:", err)
		return 1
	}
	cl := &struct {
		e2e             *e2e.Cluster
		csiEndpoint     string
		provisionerAddr string
		reclaimerAddr   string
		binderAddr      string
	}{e2e: c, csiEndpoint: "unix://" + filepath.Join(c.Dir(), "csi.sock")}

	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(c.Dir(), "csi"), NodeID: "node-a", Logger: logger("csi")})
	if err != nil {
		return fail(err)
	}
	csiLis, err := grpcutil.Listen(cl.csiEndpoint)
	if err != nil {
		return fail(err)
	}
	csiSrv := grpcutil.NewCSIServer(logger("csi"))
	drv.Register(csiSrv.Server)
	csiSrv.SetServing(true)
	errc := make(chan error, 5)
	go func() { errc <- csiSrv.Serve(ctx, csiLis, 10*time.Second) }()

	// The minimal provisioner, served as every volplane service is (mutual
	// TLS, the provisioner's certificate), so the binder and reclaimer
	// dial it exactly as they dial volplane's.
	csiConn, err := grpcutil.DialCSI(cl.csiEndpoint)
	if err != nil {
		return fail(err)
	}
	defer csiConn.Close()
	prov, err := New(ctx, c.Client, csiConn, cl.csiEndpoint)
	if err != nil {
		return fail(err)
	}
	srv, err := grpcutil.NewServer(logger("minimalprov"), grpcutil.ServerOptions{TLS: c.TLS("provisioner")})
	if err != nil {
		return fail(err)
	}
	provisionerv1.RegisterProvisionerServiceServer(srv.Server, prov)
	srv.SetServing(true, provisionerv1.ProvisionerService_ServiceDesc.ServiceName)
	provLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	cl.provisionerAddr = provLis.Addr().String()
	go func() { errc <- srv.Serve(ctx, provLis, 10*time.Second) }()

	var watcherAddr string
	for _, a := range []*string{&watcherAddr, &cl.reclaimerAddr, &cl.binderAddr} {
		if *a, err = devenv.FreeAddr(); err != nil {
			return fail(err)
		}
	}
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{Kubeconfig: env.Kubeconfig, Listen: watcherAddr, TLS: c.TLS("watcher"), Logger: logger("watcher")})
	}()
	go func() {
		errc <- reclaimer.Run(ctx, reclaimer.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cl.reclaimerAddr, TLS: c.TLS("reclaimer"), Logger: logger("reclaimer")},
			ProvisionerAddress: cl.provisionerAddr,
		})
	}()
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cl.binderAddr, TLS: c.TLS("binder"), Logger: logger("binder")},
			WatcherAddress:     watcherAddr,
			ReclaimerAddress:   cl.reclaimerAddr,
			ProvisionerAddress: cl.provisionerAddr,
		})
	}()
	cluster = cl
	return c.RunTests(m, "e2e/conformance/minimalprov", cancel, errc, 5)
}

// needCluster skips a test in -short mode.
func needCluster(t *testing.T) {
	t.Helper()
	if cluster == nil {
		t.Skip("needs a kube-apiserver and etcd (not in -short mode)")
	}
}
