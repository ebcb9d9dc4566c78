package replica

import (
	"context"
	"errors"
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
	"github.com/volplane/volplane/pkg/timeline"
)

// APIGrace is how long the API server may not answer before a replica is
// not ready (readiness check "api-server").
const APIGrace = 3 * time.Second

// DefaultReadyEvery is how often readiness is judged when Readiness.Every
// is 0.
const DefaultReadyEvery = time.Second

// DrainGrace is how long the gRPC server drains calls in flight at
// shutdown.
const DrainGrace = 10 * time.Second

// Config is what a replica starts from: the flags every service shares.
type Config struct {
	// Service names the replica's etcd membership group, its user agent
	// (volplane-<Service>) and its log lines.
	Service string
	// RESTConfig, when set (tests), is used instead of Kube.Kubeconfig.
	RESTConfig *rest.Config
	// Client, when set (tests), is the Kubernetes client instead of one
	// made from RESTConfig or Kube; the replica's RESTConfig is then nil.
	Client kubernetes.Interface
	// Kube is the client's kubeconfig and rate limits (--kubeconfig,
	// --kube-api-qps, --kube-api-burst).
	Kube kube.ClientOptions
	// Etcd is the coordination store (--etcd-endpoints and its security
	// flags). Without endpoints the replica has no etcd session (the
	// watcher): Coord is nil and readiness has no "etcd-session" check.
	Etcd coord.Options
	// MemberID, AdvertiseAddress: this replica in etcd (see Defaults).
	MemberID, AdvertiseAddress string
	// Listen is the gRPC address; Listener, when set (tests), is served
	// instead. DebugAddress serves /metrics and health ("" serves
	// nothing), and what Debug asks for.
	Listen       string
	Listener     net.Listener
	DebugAddress string
	Debug        metrics.Debug
	// TLS is the mutual TLS of the gRPC server; Reflection serves gRPC
	// reflection.
	TLS        grpcutil.TLSFiles
	Reflection bool
	Log        *slog.Logger
	// ReadOnly: the service writes nothing to the API (the watcher), so
	// the replica has no Event broadcaster.
	ReadOnly bool
	// ProbeTimeout bounds one request of the API server probe; 0 means
	// kube.DefaultProbeTimeout.
	ProbeTimeout time.Duration
	// OwnAPICheck: the service judges the API server in checks of its own
	// (the watcher, from its watches and API): no "api-server" check.
	OwnAPICheck bool
	// Readiness is how often readiness is judged and how it is reported.
	Readiness Readiness
	// Timeline bounds the claim timelines the service records into
	// Replica.Timeline, and names the OTLP collector they go to.
	Timeline timeline.Options
}

// Readiness is how a replica's readiness loop runs: every interval it
// evaluates the named checks of Replica.Health (one failing check makes
// the replica not ready), sets the gRPC health of the server and of
// Services from the verdict, and logs each change.
type Readiness struct {
	// Every is the loop's interval; 0 means DefaultReadyEvery.
	Every time.Duration
	// Services are the gRPC services whose health follows the verdict
	// (besides the server's own, ""); they are NOT_SERVING until the
	// first verdict.
	Services []string
	// Ready and NotReady are the messages logged when the verdict
	// changes; "" means "<service> ready" and "<service> not ready".
	Ready, NotReady string
}

// Replica is a started replica: what its service builds on.
type Replica struct {
	Log *slog.Logger
	// RESTConfig is the client's configuration, tuned (protobuf, limits,
	// user agent), for the service's other clients; nil with
	// Config.Client.
	RESTConfig *rest.Config
	Client     kubernetes.Interface
	// Coord is the etcd session, kept through outages: without one the
	// replica owns nothing and its fenced writes fail. Nil without etcd.
	Coord *coord.Keeper
	// Events posts the Events of the service's recorders; Recorder is one
	// for kube-controller-manager's component name. Nil when ReadOnly.
	Events   record.EventBroadcaster
	Recorder record.EventRecorder
	Server   *grpcutil.Server
	// API says whether the API server answers; it is probed every second.
	API *kube.APIProbe
	// Health is what the debug port's /readyz and /livez report and what
	// the gRPC health follows. Start adds the readiness checks
	// "etcd-session" (with etcd) and "api-server" (unless OwnAPICheck);
	// the service adds its own (Health.AddReadiness), and Run evaluates
	// them all in one loop (Readiness).
	Health *health.Checks
	// Timeline is the store of the steps the service takes per claim
	// (mirrored to OpenTelemetry when Config.Timeline names a collector).
	Timeline *timeline.Store

	lis           net.Listener
	cfg           Config
	closeTimeline func(context.Context) error
}

// Start builds the replica's parts; nothing runs until Run. Close releases
// what Start made when Run is not called.
func Start(ctx context.Context, c Config) (*Replica, error) {
	r := &Replica{Log: c.Log, Client: c.Client, Health: health.New(), cfg: c}
	if r.Client == nil {
		if err := r.kubeClient(); err != nil {
			return nil, err
		}
	}
	if len(c.Etcd.Endpoints) > 0 {
		c.Etcd.Logger = c.Log
		co, err := coord.NewKeeper(c.Etcd, c.Service, c.MemberID, c.AdvertiseAddress)
		if err != nil {
			return nil, err
		}
		r.Coord = co
		r.Health.AddReadiness("etcd-session", r.etcdSession)
	}
	srv, err := grpcutil.NewServer(c.Log, grpcutil.ServerOptions{TLS: c.TLS, Reflection: c.Reflection})
	if err != nil {
		return nil, err
	}
	// NOT_SERVING (not "unknown service") for probes by service name
	// until the first verdict.
	srv.SetServing(false, c.Readiness.Services...)
	if r.Timeline, r.closeTimeline, err = c.Timeline.Open(ctx, c.Service, c.MemberID); err != nil {
		return nil, err
	}
	r.Server, r.lis = srv, c.Listener
	if r.lis == nil {
		if r.lis, err = grpcutil.Listen(c.Listen); err != nil {
			return nil, err
		}
	}
	if !c.ReadOnly {
		r.Events = record.NewBroadcaster(record.WithContext(ctx))
		r.Events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.Client.CoreV1().Events("")})
		r.Recorder = r.Events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: kube.ControllerComponent})
	}
	r.API = kube.NewAPIProbe(r.Client)
	r.API.Timeout = c.ProbeTimeout
	r.API.Outage = kube.NewAPIOutage(c.Log)
	if !c.OwnAPICheck {
		r.Health.AddReadiness("api-server", func() error { return r.API.Check(APIGrace) })
	}
	return r, nil
}

// kubeClient makes the replica's Kubernetes client from its Config.
func (r *Replica) kubeClient() error {
	c := &r.cfg
	c.Kube.UserAgent = "volplane-" + c.Service
	cfg := c.RESTConfig
	if cfg == nil {
		var err error
		if cfg, err = kube.RESTConfig(c.Kube); err != nil {
			return err
		}
	}
	r.RESTConfig = kube.Tune(cfg, c.Kube)
	client, err := kube.Client(r.RESTConfig, c.Kube)
	if err != nil {
		return err
	}
	r.Client = client
	return nil
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
// services from each verdict, and logs each change with its reasons. Run
// runs it with Config.Readiness.
func (r *Replica) Readiness(ctx context.Context, interval time.Duration, services ...string) {
	ready, notReady := r.cfg.Readiness.Ready, r.cfg.Readiness.NotReady
	if ready == "" {
		ready = r.cfg.Service + " ready"
	}
	if notReady == "" {
		notReady = r.cfg.Service + " not ready"
	}
	var member []any
	if r.cfg.MemberID != "" {
		member = []any{"member", r.cfg.MemberID}
	}
	r.Health.Loop(ctx, interval, func(ok, changed bool, results []health.Result) {
		if !changed {
			return
		}
		r.Server.SetServing(ok, services...)
		if ok {
			r.Log.Info(ready, member...)
		} else {
			r.Log.Warn(notReady, append(member, "why", health.Summary(results))...)
		}
	})
}

// Addr is the address the gRPC server listens on.
func (r *Replica) Addr() string { return r.lis.Addr().String() }

// Close stops the Event broadcaster and closes the listener.
func (r *Replica) Close() {
	if r.Events != nil {
		r.Events.Shutdown()
	}
	if r.closeTimeline != nil {
		// Flush the spans still batched for the collector, for a while.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.closeTimeline(ctx); err != nil {
			r.Log.Warn("flush timeline spans", "error", err)
		}
	}
	r.lis.Close()
}

// Condition is a readiness check that passes while ok() is true and
// otherwise fails with why (a list not in yet, say).
func Condition(ok func() bool, why string) func() error {
	return func() error {
		if ok() {
			return nil
		}
		return errors.New(why)
	}
}

// Task is one of a replica's long-running parts: it runs until ctx ends
// (then returns nil) or fails (an error, which stops the replica).
type Task = func(ctx context.Context) error

// Until is a Task of f, which runs until ctx ends and never fails.
func Until(f func(ctx context.Context)) Task {
	return func(ctx context.Context) error {
		f(ctx)
		return nil
	}
}

// Run serves, in one group, the gRPC server, the debug server (metrics,
// /readyz, /livez), the etcd session, the API server probe, the readiness
// loop and the service's tasks, until ctx ends or one of them fails; then
// it stops the others (the gRPC server sets NOT_SERVING and drains calls
// for DrainGrace), logs "<service> stopped" and returns the first error.
func (r *Replica) Run(ctx context.Context, tasks ...Task) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.Server.Serve(gctx, r.lis, DrainGrace) })
	g.Go(func() error {
		return metrics.Serve(gctx, r.cfg.DebugAddress, r.Log, metrics.Handler(r.Health, r.cfg.Debug))
	})
	if r.Coord != nil {
		g.Go(func() error { return r.Coord.Run(gctx) })
	}
	g.Go(func() error {
		r.API.Run(gctx, time.Second)
		return nil
	})
	every := r.cfg.Readiness.Every
	if every <= 0 {
		every = DefaultReadyEvery
	}
	g.Go(func() error {
		r.Readiness(gctx, every, r.cfg.Readiness.Services...)
		return nil
	})
	for _, t := range tasks {
		g.Go(func() error { return t(gctx) })
	}
	err := g.Wait()
	r.Log.Info(r.cfg.Service + " stopped")
	return err
}
