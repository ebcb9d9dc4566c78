// Package ha tests volplane through failures of what it depends on, end to
// end against a real kube-apiserver, etcd and the dev CSI driver: two
// watchers with one stopped mid-run (the binder fails over and keeps
// binding, no phase flips), etcd down for longer than the lease TTL and
// restarted on its data, and kube-apiserver down for a while. The services
// run in this process; a service's Run must never return during an outage.
package ha

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/client-go/kubernetes"

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

var (
	cl     *e2e.Cluster
	client kubernetes.Interface
	// The services, each restartable by the tests.
	watchers         [2]*service
	prov, recl, bind *service
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/ha: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

// service is one service's Run in a goroutine.
type service struct {
	name   string
	addr   string
	run    func(ctx context.Context, addr string) error
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan error
}

func newService(name string, run func(ctx context.Context, addr string) error) *service {
	addr, err := devenv.FreeAddr()
	if err != nil {
		panic(err)
	}
	return &service{name: name, addr: addr, run: run}
}

func (s *service) start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan error, 1)
	done := s.done
	go func() { done <- s.run(ctx, s.addr) }()
}

// stop ends the service and returns what Run returned.
func (s *service) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	err := <-s.done
	s.cancel = nil
	return err
}

// exited reports whether Run returned on its own (and with what).
func (s *service) exited() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel == nil {
		return false, nil
	}
	select {
	case err := <-s.done:
		s.done <- err
		return true, err
	default:
		return false, nil
	}
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	cl, err = e2e.StartCluster(ctx, "e2e/ha", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/ha:", err)
		return 1
	}
	defer cl.Stop()
	client = cl.Client
	env := cl.Env
	logger := func(name string) *slog.Logger { return cl.Logger(name, slog.LevelInfo) }

	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(cl.Dir(), "csi"), NodeID: "node-a", Logger: logger("csi")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/ha: dev CSI driver:", err)
		return 1
	}
	if err := devcsi.RegisterNode(ctx, client, drv.Name(), drv.NodeID()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/ha:", err)
		return 1
	}
	sock := "unix://" + filepath.Join(cl.Dir(), "csi.sock")
	lis, err := grpcutil.Listen(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	csiSrv := grpcutil.NewCSIServer(logger("csi"))
	drv.Register(csiSrv.Server)
	csiSrv.SetServing(true)
	go func() { _ = csiSrv.Serve(ctx, lis, 10*time.Second) }()

	for i := range watchers {
		name := fmt.Sprintf("watcher-%d", i)
		watchers[i] = newService(name, func(ctx context.Context, addr string) error {
			return watcher.Run(ctx, watcher.Options{Kubeconfig: env.Kubeconfig, Listen: addr, TLS: cl.TLS("watcher"), Logger: logger(name)})
		})
	}
	prov = newService("provisioner", func(ctx context.Context, addr string) error {
		return provisioner.Run(ctx, provisioner.Options{
			Options:        replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: addr, TLS: cl.TLS("provisioner"), Logger: logger("provisioner")},
			CSIEndpoints:   []string{sock},
			WatcherAddress: watchers[0].addr + "," + watchers[1].addr,
			Timeout:        2 * time.Second,
			RecoveryPeriod: 500 * time.Millisecond,
		})
	})
	recl = newService("reclaimer", func(ctx context.Context, addr string) error {
		return reclaimer.Run(ctx, reclaimer.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: addr, TLS: cl.TLS("reclaimer"), Logger: logger("reclaimer")},
			ProvisionerAddress: prov.addr,
			TakeoverPeriod:     time.Second,
		})
	})
	bind = newService("binder", func(ctx context.Context, addr string) error {
		return binder.Run(ctx, binder.Options{
			Options:            replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: addr, TLS: cl.TLS("binder"), Logger: logger("binder")},
			WatcherAddress:     watchers[0].addr + "," + watchers[1].addr,
			ReclaimerAddress:   recl.addr,
			ProvisionerAddress: prov.addr,
			ResyncPeriod:       10 * time.Minute,
		})
	})
	for _, s := range []*service{watchers[0], watchers[1], prov, recl, bind} {
		s.start()
		if err := cl.WaitServing(ctx, s.addr, 2*time.Minute); err != nil {
			fmt.Fprintf(os.Stderr, "e2e/ha: %s did not start: %v\n", s.name, err)
			cl.DumpLogs(os.Stderr)
			return 1
		}
	}
	code := m.Run()
	if code != 0 {
		cl.DumpLogs(os.Stderr)
	}
	for _, s := range []*service{bind, recl, prov, watchers[0], watchers[1]} {
		if err := s.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e/ha: %s stopped with: %v\n", s.name, err)
			code = 1
		}
	}
	if !cl.NoSecretsLogged("e2e/ha") {
		code = 1
	}
	return code
}

// health asks a service for its gRPC health (the whole server).
func health(t *testing.T, addr string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	cc, err := cl.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.GetStatus()
}

// waitHealth waits until every service in ss reports want.
func waitHealth(t *testing.T, timeout time.Duration, want healthpb.HealthCheckResponse_ServingStatus, ss ...*service) {
	t.Helper()
	e2e.Eventually(t, timeout, func() string {
		for _, s := range ss {
			if got := health(t, s.addr); got != want {
				return fmt.Sprintf("%s is %v, want %v", s.name, got, want)
			}
		}
		return ""
	})
}

// running fails the test if any service's Run has returned on its own.
func running(t *testing.T, ss ...*service) {
	t.Helper()
	for _, s := range ss {
		if done, err := s.exited(); done {
			t.Fatalf("%s's Run returned during the outage: %v", s.name, err)
		}
	}
}
