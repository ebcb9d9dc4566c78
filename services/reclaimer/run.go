package reclaimer

import (
	"context"
	"fmt"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	startup "github.com/volplane/volplane/pkg/replica"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Run runs a reclaimer replica until ctx ends, then shuts down gracefully:
// its journal locks go with its lease, so another replica takes its
// reclaims over. An etcd outage does not stop it: while it has no etcd
// session no reclaim step is taken (every step is fenced on the session's
// lease) and it is NOT_SERVING; once a new session is open, the reclaims of
// the old one are taken over from the journal like any orphan.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("reclaimer options: %w", err)
	}
	cfg := o.Config(Service)
	// Ready while it has an etcd session, the API server answers and the
	// claims are listed (the checks of r.Health).
	cfg.Readiness = startup.Readiness{Every: time.Second, Services: []string{reclaimerv1.ReclaimerService_ServiceDesc.ServiceName}}
	r, err := startup.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	var prov provisioner
	if o.ProvisionerAddress != "" {
		cc, err := grpcutil.Dial(o.ProvisionerAddress, o.TLS)
		if err != nil {
			return err
		}
		defer cc.Close()
		prov = provisionerv1.NewProvisionerServiceClient(cc)
	}
	claims, err := startClaimInformer(ctx, r)
	if err != nil {
		return err
	}
	defer claims.Shutdown()
	c := newController(r.Log, o.MemberID, claims.cluster, r.Coord, newDrivers(prov, o.DriversRefreshPeriod, r.Log), prov, r.Recorder, o.config(),
		o.RetryIntervalStart, o.RetryIntervalMax, nil)
	// Reclaim steps go to OpenTelemetry only (trace.go); the replica's
	// timeline store itself stays empty.
	c.tracer = r.Timeline.Tracer()
	if reporting.CompareAndSwap(nil, c) {
		defer reporting.CompareAndSwap(c, nil)
	}
	r.Health.AddReadiness("claims-informer", startup.Condition(claims.synced, "the claims are not listed yet"))
	reclaimerv1.RegisterReclaimerServiceServer(r.Server.Server, &server{c: c, tls: o.TLS, peer: memberAddress(r.Coord)})
	r.Log.Info("reclaimer starting", "member", o.MemberID, "listen", r.Addr(), "recycleMode", o.RecycleMode,
		"node", o.NodeName, "provisioner", o.ProvisionerAddress, "standalone", o.Standalone)
	tasks := []startup.Task{
		startup.Until(func(ctx context.Context) { followSessions(ctx, r.Coord, c.sessionOpened) }),
		startup.Until(func(ctx context.Context) { c.run(ctx, o.Workers, o.TakeoverPeriod) }),
	}
	if o.Standalone {
		f := informers.NewSharedInformerFactoryWithOptions(r.Client, 0, informers.WithTransform(kube.StripManagedFields))
		w, synced, err := startVolumeWatch(r.Log.With("controller", "standalone"), c, f, o)
		if err != nil {
			return err
		}
		f.Start(ctx.Done())
		defer f.Shutdown()
		tasks = append(tasks, func(ctx context.Context) error { return w.run(ctx, synced) })
	}
	if o.RecycleMode == RecyclePod {
		tasks = append(tasks, func(ctx context.Context) error { return c.watchRecyclers(ctx, r.Client) })
	}
	return r.Run(ctx, tasks...)
}

// config is the controller's share of the options.
func (o *Options) config() config {
	return config{
		mode: o.RecycleMode, nodeName: o.NodeName, prefixes: o.RecyclePathPrefixes, template: o.template, image: o.RecyclerImage, namespace: o.RecyclerNamespace,
		minTimeout: o.RecyclerMinimumTimeout, increment: o.RecyclerTimeoutIncrement, ttl: o.RecordTTL, standalone: o.Standalone,
	}
}

// claimInformer is the reclaimer's informer of claims, indexed by the
// volume they ask for, so the guard before a destructive step reads only
// those claims from the API (managedFields dropped: most of a cached
// claim's bytes).
type claimInformer struct {
	informers.SharedInformerFactory
	cluster kubeCluster
	synced  func() bool
}

// startClaimInformer starts the claim informer of r's client. It is not
// waited for: until the index holds every claim, the guard lists the
// claims from the API server (kubeCluster.ClaimsNaming) and the replica is
// not ready; its debug port and health answer meanwhile, so a replica
// waiting for the API server is not killed for it.
func startClaimInformer(ctx context.Context, r *startup.Replica) (claimInformer, error) {
	f := informers.NewSharedInformerFactoryWithOptions(r.Client, 0, informers.WithTransform(kube.StripManagedFields))
	inf := f.Core().V1().PersistentVolumeClaims().Informer()
	if err := inf.AddIndexers(cache.Indexers{byVolumeName: indexByVolumeName}); err != nil {
		return claimInformer{}, fmt.Errorf("index claims: %w", err)
	}
	f.Start(ctx.Done())
	return claimInformer{SharedInformerFactory: f, cluster: kubeCluster{c: r.Client, claims: inf.GetIndexer(), synced: inf.HasSynced}, synced: inf.HasSynced}, nil
}

// memberAddress is the address of a live reclaimer member by its ID ("",
// nil when it is not one), for the server's forwarding.
func memberAddress(co *coord.Keeper) func(ctx context.Context, id string) (string, error) {
	return func(ctx context.Context, id string) (string, error) {
		ms, err := co.Members(ctx, Service)
		if err != nil {
			return "", err
		}
		for _, m := range ms {
			if m.ID == id {
				return m.Address, nil
			}
		}
		return "", nil
	}
}
