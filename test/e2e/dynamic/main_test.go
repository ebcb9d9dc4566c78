// Package dynamic tests dynamic provisioning and the reclaim of provisioned
// volumes end to end: a real kube-apiserver and etcd, the watcher, binder,
// provisioner and reclaimer services, and volplane's dev CSI driver, all in
// this process.
package dynamic

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/provisioner/capacity"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// cluster is what every test shares.
var cluster struct {
	env         *devenv.Env
	client      kubernetes.Interface
	driver      *devcsi.Driver
	csi         csi.ControllerClient
	csiEndpoint string
	requests    *recorder
	// reclaims counts the Reclaim calls the reclaimer served, by volume
	// (reclaimcalls_test.go).
	reclaims        *reclaimCalls
	provisionerAddr string
	reclaimerAddr   string
	binderAddr      string
	etcd            []string
	logs            string
	// e2e dials the services and hands out their certificates.
	e2e *e2e.Cluster
}

// Timeouts the services run with here: short, so that retries and recovery
// show within a test's patience.
const (
	csiTimeout     = 2 * time.Second
	recoveryPeriod = 500 * time.Millisecond
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/dynamic: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// kube-apiserver keeps dataSourceRef.namespace only with its
	// CrossNamespaceVolumeDataSource gate (crossns_test.go).
	c, err := e2e.StartCluster(ctx, "e2e/dynamic", e2e.Options{APIServerArgs: []string{"--feature-gates=CrossNamespaceVolumeDataSource=true"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/dynamic:", err)
		return 1
	}
	defer c.Stop()
	env, dir := c.Env, c.Dir()
	cluster.env = env
	cluster.etcd = env.EtcdEndpoints
	cluster.client = c.Client
	cluster.logs = c.LogPath
	cluster.e2e = c
	logger := func(name string) *slog.Logger { return c.Logger(name, slog.LevelDebug) }
	testLogger = logger
	dumpLogs = c.DumpLogs

	// The dev CSI driver, behind a recorder of the requests it gets and
	// its fault injector.
	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(dir, "csi"), NodeID: "node-a", Logger: logger("csi")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/dynamic: dev CSI driver:", err)
		return 1
	}
	cluster.driver, cluster.requests = drv, &recorder{}
	cluster.reclaims = &reclaimCalls{}
	if err := devcsi.RegisterNode(ctx, c.Client, drv.Name(), drv.NodeID()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/dynamic:", err)
		return 1
	}
	sock := "unix://" + filepath.Join(dir, "csi.sock")
	cluster.csiEndpoint = sock
	lis, err := grpcutil.Listen(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	csiSrv := grpcutil.NewCSIServer(logger("csi"), grpc.ChainUnaryInterceptor(cluster.requests.intercept, drv.Faults().UnaryServerInterceptor()))
	drv.Register(csiSrv.Server)
	csiSrv.SetServing(true)
	csiConn, err := grpcutil.DialCSI(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer csiConn.Close()
	cluster.csi = csi.NewControllerClient(csiConn)

	watcherAddr := freeAddr()
	cluster.provisionerAddr = freeAddr()
	cluster.reclaimerAddr = freeAddr()
	cluster.binderAddr = freeAddr()
	errc := make(chan error, 5)
	go func() { errc <- csiSrv.Serve(ctx, lis, 10*time.Second) }()
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{Kubeconfig: env.Kubeconfig, Listen: watcherAddr, TLS: c.TLS("watcher"), Logger: logger("watcher")})
	}()
	go func() {
		errc <- provisioner.Run(ctx, provisioner.Options{
			Options:             replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.provisionerAddr, TLS: c.TLS("provisioner"), Logger: logger("provisioner")},
			CSIEndpoints:        []string{sock},
			WatcherAddress:      watcherAddr,
			Timeout:             csiTimeout,
			RecoveryPeriod:      recoveryPeriod,
			ExtraCreateMetadata: true,
			// snapshotsource_test.go waits for the sweeper; crossns_test.go
			// needs the gate.
			SnapshotOrphanSweepInterval: time.Second,
			FeatureGates:                provisioner.FeatureGates{provisioner.GateCrossNamespaceVolumeDataSource: true},
			// The poll is slow, so capacity_test.go proves the refresh
			// after each CreateVolume and DeleteVolume.
			Capacity: capacity.Options{Enabled: true, Namespace: capacityNamespace, PollInterval: 10 * time.Minute},
		})
	}()
	go func() {
		errc <- reclaimer.Run(ctx, reclaimer.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.reclaimerAddr, TLS: c.TLS("reclaimer"), Logger: slog.New(cluster.reclaims.wrap(logger("reclaimer").Handler()))},
			ProvisionerAddress: cluster.provisionerAddr,
		})
	}()
	if err := c.WaitServing(ctx, cluster.provisionerAddr, 2*time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/dynamic: provisioner did not start:", err)
		dumpLogs(os.Stderr)
		return 1
	}
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.binderAddr, TLS: c.TLS("binder"), Logger: logger("binder")},
			WatcherAddress:     watcherAddr,
			ReclaimerAddress:   cluster.reclaimerAddr,
			ProvisionerAddress: cluster.provisionerAddr,
			// Every test below proves the event-driven path and the
			// binder's own retries, not the periodic resync.
			ResyncPeriod: 10 * time.Minute,
		})
	}()
	if err := c.WaitServing(ctx, cluster.binderAddr, 2*time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/dynamic: binder did not start:", err)
		dumpLogs(os.Stderr)
		return 1
	}
	return c.RunTests(m, "e2e/dynamic", cancel, errc, 5)
}

// testLogger makes a logger into the services' log for services tests
// start themselves.
var testLogger func(name string) *slog.Logger

func freeAddr() string {
	a, err := devenv.FreeAddr()
	if err != nil {
		panic(err)
	}
	return a
}

func readLogs() ([]byte, error) { return os.ReadFile(cluster.logs) }

// dumpLogs prints the services' log (set by run).
var dumpLogs func(w io.Writer)

// recorder keeps every CreateVolume and DeleteVolume request the driver
// gets, so tests can check what the provisioner asked for.
type recorder struct {
	mu      sync.Mutex
	creates []*csi.CreateVolumeRequest
	deletes []*csi.DeleteVolumeRequest
	ids     map[string]string // volume name -> id, from CreateVolume answers
}

func (r *recorder) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	r.mu.Lock()
	switch q := req.(type) {
	case *csi.CreateVolumeRequest:
		r.creates = append(r.creates, proto.Clone(q).(*csi.CreateVolumeRequest))
	case *csi.DeleteVolumeRequest:
		r.deletes = append(r.deletes, proto.Clone(q).(*csi.DeleteVolumeRequest))
	}
	r.mu.Unlock()
	resp, err := h(ctx, req)
	if cv, ok := resp.(*csi.CreateVolumeResponse); ok && err == nil {
		r.mu.Lock()
		if r.ids == nil {
			r.ids = map[string]string{}
		}
		r.ids[req.(*csi.CreateVolumeRequest).GetName()] = cv.GetVolume().GetVolumeId()
		r.mu.Unlock()
	}
	return resp, err
}

// idOf is the volume id the driver gave name, "" if it never answered.
func (r *recorder) idOf(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ids[name]
}

// createsFor returns the CreateVolume requests for a volume name.
func (r *recorder) createsFor(name string) []*csi.CreateVolumeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*csi.CreateVolumeRequest
	for _, q := range r.creates {
		if q.GetName() == name {
			out = append(out, q)
		}
	}
	return out
}

// deletesOf returns the DeleteVolume requests for a volume id.
func (r *recorder) deletesOf(id string) []*csi.DeleteVolumeRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*csi.DeleteVolumeRequest
	for _, q := range r.deletes {
		if q.GetVolumeId() == id {
			out = append(out, q)
		}
	}
	return out
}
