// Package replica is the start-up every replica of a volplane service
// shares (the binder, the provisioner, the reclaimer): its Kubernetes
// client, its etcd session (a coord.Keeper, kept through outages), its
// Event broadcaster, its gRPC server and listener, its API server probe,
// and the group of goroutines that serve them until the context ends.
// Each service adds its own controller and tasks to the group.
package replica

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/health"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
)

// APIGrace is how long the API server may not answer before a replica is
// not ready (readiness check "api-server").
const APIGrace = 3 * time.Second

// Config is what a replica starts from: the flags every service shares.
type Config struct {
	// Service names the replica's etcd membership group and its user
	// agent (volplane-<Service>).
	Service string
	// RESTConfig, when set (tests), is used instead of Kube.Kubeconfig.
	RESTConfig *rest.Config
	// Kube is the client's kubeconfig and rate limits (--kubeconfig,
	// --kube-api-qps, --kube-api-burst).
	Kube kube.ClientOptions
	// Etcd is the coordination store (--etcd-endpoints and its security
	// flags).
	Etcd coord.Options
	// MemberID, AdvertiseAddress: this replica in etcd (see Defaults).
	MemberID, AdvertiseAddress string
	// Listen is the gRPC address; DebugAddress serves /metrics and health
	// ("" serves nothing), and what Debug asks for.
	Listen, DebugAddress string
	Debug                metrics.Debug
	// TLS is the mutual TLS of the gRPC server; Reflection serves gRPC
	// reflection.
	TLS        grpcutil.TLSFiles
	Reflection bool
	Log        *slog.Logger
}

// Replica is a started replica: what its service builds on.
type Replica struct {
	Log *slog.Logger
	// RESTConfig is the client's configuration, tuned (protobuf, limits,
	// user agent), for the service's other clients.
	RESTConfig *rest.Config
	Client     kubernetes.Interface
	// Coord is the etcd session, kept through outages: without one the
	// replica owns nothing and its fenced writes fail.
	Coord *coord.Keeper
	// Events posts the Events of the service's recorders; Recorder is one
	// for kube-controller-manager's component name.
	Events   record.EventBroadcaster
	Recorder record.EventRecorder
	Server   *grpcutil.Server
	// API says whether the API server answers (readiness).
	API *kube.APIProbe
	// Health is what the debug port's /readyz and /livez report. Start
	// adds the readiness checks "etcd-session" and "api-server"; the
	// service adds its own and runs Health.Loop, which sets the gRPC
	// health from the same verdict (SetServing).
	Health *health.Checks

	lis net.Listener
	cfg Config
}

// Start builds the replica's parts; nothing runs until Run. Close releases
// what Start made when Run is not called.
func Start(ctx context.Context, c Config) (*Replica, error) {
	c.Kube.UserAgent = "volplane-" + c.Service
	cfg := c.RESTConfig
	if cfg == nil {
		var err error
		if cfg, err = kube.RESTConfig(c.Kube); err != nil {
			return nil, err
		}
	}
	cfg = kube.Tune(cfg, c.Kube)
	client, err := kube.Client(cfg, c.Kube)
	if err != nil {
		return nil, err
	}
	c.Etcd.Logger = c.Log
	co, err := coord.NewKeeper(c.Etcd, c.Service, c.MemberID, c.AdvertiseAddress)
	if err != nil {
		return nil, err
	}
	srv, err := grpcutil.NewServer(c.Log, grpcutil.ServerOptions{TLS: c.TLS, Reflection: c.Reflection})
	if err != nil {
		return nil, err
	}
	lis, err := grpcutil.Listen(c.Listen)
	if err != nil {
		return nil, err
	}
	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	r := &Replica{
		Log: c.Log, RESTConfig: cfg, Client: client, Coord: co,
		Events: events, Recorder: events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: kube.ControllerComponent}),
		Server: srv, API: kube.NewAPIProbe(client), Health: health.New(),
		lis: lis, cfg: c,
	}
	r.API.Outage = kube.NewAPIOutage(c.Log)
	r.Health.AddReadiness("etcd-session", r.etcdSession)
	r.Health.AddReadiness("api-server", func() error { return r.API.Check(APIGrace) })
	return r, nil
}

// etcdSession is the readiness check "etcd-session": without a live
// session the replica owns nothing and its fenced writes fail; under an
// etcd alarm (NOSPACE) every write fails too (coord.Keeper.Health).
func (r *Replica) etcdSession() error {
	if !r.Coord.Ready() {
		return fmt.Errorf("not established (etcd at %s)", strings.Join(r.cfg.Etcd.Endpoints, ","))
	}
	return r.Coord.Health()
}

// Readiness runs the replica's readiness loop (Health.Loop) every
// interval until ctx ends: it sets the gRPC health of the server and of
// services from each verdict, and logs each change with its reasons.
func (r *Replica) Readiness(ctx context.Context, interval time.Duration, services ...string) {
	r.Health.Loop(ctx, interval, func(ready, changed bool, results []health.Result) {
		if !changed {
			return
		}
		r.Server.SetServing(ready, services...)
		if ready {
			r.Log.Info(r.cfg.Service+" ready", "member", r.cfg.MemberID)
		} else {
			r.Log.Warn(r.cfg.Service+" not ready", "member", r.cfg.MemberID, "why", health.Summary(results))
		}
	})
}

// Addr is the address the gRPC server listens on.
func (r *Replica) Addr() string { return r.lis.Addr().String() }

// Close stops the Event broadcaster and closes the listener.
func (r *Replica) Close() {
	r.Events.Shutdown()
	r.lis.Close()
}

// Run serves the gRPC server (draining calls for 10 s at the end), the
// debug server (metrics, /readyz, /livez), the etcd session and the API
// server probe, and the service's tasks, until ctx ends or one of them fails; then it stops the
// others and returns the first error.
func (r *Replica) Run(ctx context.Context, tasks ...func(context.Context) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Server.Serve(gctx, r.lis, 10*time.Second) })
	g.Go(func() error {
		return metrics.Serve(gctx, r.cfg.DebugAddress, r.Log, metrics.Handler(r.Health, r.cfg.Debug))
	})
	g.Go(func() error { return r.Coord.Run(gctx) })
	g.Go(func() error {
		r.API.Run(gctx, time.Second)
		return nil
	})
	for _, t := range tasks {
		g.Go(func() error { return t(gctx) })
	}
	return g.Wait()
}
