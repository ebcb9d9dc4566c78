// Package timeline tests a claim's timeline end to end: a real
// kube-apiserver and etcd, the watcher, binder and provisioner services
// with the dev CSI driver made slow on purpose, and the REST gateway with
// the cluster's RBAC, all in this process; the services export their
// spans to an in-process OTLP collector fake, which records them.
package timeline

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"k8s.io/client-go/kubernetes"

	"github.com/volplane/volplane/internal/devcsi"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/pkg/timeline"
	"github.com/volplane/volplane/services/binder"
	"github.com/volplane/volplane/services/provisioner"
	"github.com/volplane/volplane/services/reclaimer"
	"github.com/volplane/volplane/services/watcher"
	"github.com/volplane/volplane/test/harness/devenv"
	"github.com/volplane/volplane/test/harness/e2e"
)

// createDelay is how long the dev driver takes for each CreateVolume.
const createDelay = 1500 * time.Millisecond

var cluster struct {
	env         *devenv.Env
	client      kubernetes.Interface
	e2e         *e2e.Cluster
	binderAddr  string
	reclaimAddr string
	watchAddr   string
	provAddr    string
	collector   *collector
	csiCalls    *csiCalls
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e/timeline: skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := e2e.StartCluster(ctx, "e2e/timeline", e2e.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/timeline:", err)
		return 1
	}
	defer c.Stop()
	env, dir := c.Env, c.Dir()
	cluster.env, cluster.client, cluster.e2e = env, c.Client, c
	logger := func(name string) *slog.Logger { return c.Logger(name, slog.LevelDebug) }

	// The OTLP collector fake.
	cluster.collector = &collector{}
	otlpLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	otlpSrv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(otlpSrv, cluster.collector)
	go otlpSrv.Serve(otlpLis)
	defer otlpSrv.Stop()
	tl := timeline.Options{OTLPEndpoint: "http://" + otlpLis.Addr().String()}

	// The dev CSI driver, slow on purpose, recording the trace context
	// each CreateVolume arrives with.
	drv, err := devcsi.New(devcsi.Options{RootDir: filepath.Join(dir, "csi"), NodeID: "node-a", Logger: logger("csi")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e/timeline: dev CSI driver:", err)
		return 1
	}
	if err := drv.Faults().Parse("CreateVolume=delay:" + createDelay.String()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := devcsi.RegisterNode(ctx, c.Client, drv.Name(), drv.NodeID()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/timeline:", err)
		return 1
	}
	sock := "unix://" + filepath.Join(dir, "csi.sock")
	lis, err := grpcutil.Listen(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cluster.csiCalls = &csiCalls{}
	csiSrv := grpcutil.NewCSIServer(logger("csi"), grpc.ChainUnaryInterceptor(cluster.csiCalls.intercept, drv.Faults().UnaryServerInterceptor()))
	drv.Register(csiSrv.Server)
	csiSrv.SetServing(true)

	cluster.watchAddr, cluster.provAddr, cluster.binderAddr, cluster.reclaimAddr = freeAddr(), freeAddr(), freeAddr(), freeAddr()
	errc := make(chan error, 5)
	go func() { errc <- csiSrv.Serve(ctx, lis, 10*time.Second) }()
	go func() {
		errc <- watcher.Run(ctx, watcher.Options{Kubeconfig: env.Kubeconfig, Listen: cluster.watchAddr, TLS: c.TLS("watcher"), Logger: logger("watcher")})
	}()
	go func() {
		errc <- provisioner.Run(ctx, provisioner.Options{
			Options: replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.provAddr,
				TLS: c.TLS("provisioner"), Logger: logger("provisioner"), Timeline: tl},
			CSIEndpoints:   []string{sock},
			WatcherAddress: cluster.watchAddr,
			Timeout:        30 * time.Second,
		})
	}()
	if err := c.WaitServing(ctx, cluster.provAddr, 2*time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/timeline: provisioner did not start:", err)
		c.DumpLogs(os.Stderr)
		return 1
	}
	go func() {
		errc <- reclaimer.Run(ctx, reclaimer.Options{
			Options: replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.reclaimAddr,
				TLS: c.TLS("reclaimer"), Logger: logger("reclaimer"), Timeline: tl},
			ProvisionerAddress: cluster.provAddr,
		})
	}()
	if err := c.WaitServing(ctx, cluster.reclaimAddr, 2*time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/timeline: reclaimer did not start:", err)
		c.DumpLogs(os.Stderr)
		return 1
	}
	go func() {
		errc <- binder.Run(ctx, binder.Options{
			Options: replica.Options{Kubeconfig: env.Kubeconfig, EtcdEndpoints: env.EtcdEndpoints, Listen: cluster.binderAddr,
				TLS: c.TLS("binder"), Logger: logger("binder"), Timeline: tl},
			WatcherAddress:     cluster.watchAddr,
			ProvisionerAddress: cluster.provAddr,
			ReclaimerAddress:   cluster.reclaimAddr,
		})
	}()
	if err := c.WaitServing(ctx, cluster.binderAddr, 2*time.Minute); err != nil {
		fmt.Fprintln(os.Stderr, "e2e/timeline: binder did not start:", err)
		c.DumpLogs(os.Stderr)
		return 1
	}
	return c.RunTests(m, "e2e/timeline", cancel, errc, 5)
}

func freeAddr() string {
	a, err := devenv.FreeAddr()
	if err != nil {
		panic(err)
	}
	return a
}

// collector is an OTLP/gRPC trace collector fake: it keeps every span it
// is sent, with the service.name of its resource.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []exported
}

type exported struct {
	service string
	span    *tracepb.Span
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				c.spans = append(c.spans, exported{service: service, span: sp})
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func (c *collector) all() []exported {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]exported(nil), c.spans...)
}

// csiCalls records the traceparent each CreateVolume arrived with, by
// volume name, and each DeleteVolume, by "delete " and volume ID.
type csiCalls struct {
	mu          sync.Mutex
	traceparent map[string]string
}

func (r *csiCalls) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	key := ""
	if cv, ok := req.(interface{ GetName() string }); ok && filepath.Base(info.FullMethod) == "CreateVolume" {
		key = cv.GetName()
	}
	if dv, ok := req.(interface{ GetVolumeId() string }); ok && filepath.Base(info.FullMethod) == "DeleteVolume" {
		key = "delete " + dv.GetVolumeId()
	}
	if key != "" {
		md, _ := metadata.FromIncomingContext(ctx)
		r.mu.Lock()
		if r.traceparent == nil {
			r.traceparent = map[string]string{}
		}
		if v := md.Get("traceparent"); len(v) > 0 {
			r.traceparent[key] = v[0]
		}
		r.mu.Unlock()
	}
	return h(ctx, req)
}

func (r *csiCalls) traceparentOf(name string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.traceparent[name]
}
