package reclaimer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/coord"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
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
	r, err := startup.Start(ctx, o.Config(Service))
	if err != nil {
		return err
	}
	defer r.Close()
	log, client, co, recorder, srv := r.Log, r.Client, r.Coord, r.Recorder, r.Server

	var prov provisioner
	if o.ProvisionerAddress != "" {
		cc, err := grpcutil.Dial(o.ProvisionerAddress, o.TLS)
		if err != nil {
			return err
		}
		defer cc.Close()
		prov = provisionerv1.NewProvisionerServiceClient(cc)
	}

	metrics.RegisterWorkqueueMetrics()
	cfg := config{
		mode: o.RecycleMode, nodeName: o.NodeName, prefixes: o.RecyclePathPrefixes, template: o.template, image: o.RecyclerImage, namespace: o.RecyclerNamespace,
		minTimeout: o.RecyclerMinimumTimeout, increment: o.RecyclerTimeoutIncrement, ttl: o.RecordTTL,
	}
	// Claims by the volume they ask for, so the guard before a destructive
	// step reads only those claims from the API (managedFields dropped:
	// most of a cached claim's bytes).
	claimInformers := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(func(obj any) (any, error) {
		if m, ok := obj.(metav1.Object); ok {
			m.SetManagedFields(nil)
		}
		return obj, nil
	}))
	claimInformer := claimInformers.Core().V1().PersistentVolumeClaims().Informer()
	if err := claimInformer.AddIndexers(cache.Indexers{byVolumeName: indexByVolumeName}); err != nil {
		return fmt.Errorf("index claims: %w", err)
	}
	claimInformers.Start(ctx.Done())
	defer claimInformers.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), claimInformer.HasSynced) {
		return ctx.Err()
	}
	c := newController(log, o.MemberID, kubeCluster{c: client, claims: claimInformer.GetIndexer()}, co, newDrivers(prov, o.DriversRefreshPeriod, log), prov,
		recorder, cfg, o.RetryIntervalStart, o.RetryIntervalMax, nil)

	reclaimerv1.RegisterReclaimerServiceServer(srv.Server, &server{c: c, tls: o.TLS, peer: func(ctx context.Context, id string) (string, error) {
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
	}})
	log.Info("reclaimer starting", "member", o.MemberID, "listen", r.Addr(), "recycleMode", o.RecycleMode,
		"node", o.NodeName, "provisioner", o.ProvisionerAddress)

	tasks := []func(context.Context) error{
		func(ctx context.Context) error {
			// Every session after the first replaces a lost one.
			first := true
			for {
				changed := co.Changed()
				if co.Ready() {
					if !first {
						c.sessionOpened(ctx)
					}
					first = false
				}
				select {
				case <-changed:
				case <-ctx.Done():
					return nil
				}
			}
		},
		func(ctx context.Context) error {
			readiness(ctx, srv, co, r.API, log)
			return nil
		},
		func(ctx context.Context) error {
			c.run(ctx, o.Workers, o.TakeoverPeriod)
			return nil
		},
	}
	if o.RecycleMode == RecyclePod {
		tasks = append(tasks, func(ctx context.Context) error { return c.watchRecyclers(ctx, client) })
	}
	err = r.Run(ctx, tasks...)
	log.Info("reclaimer stopped")
	return err
}

// readiness keeps the replica SERVING while it has an etcd session, etcd
// raises no alarm (NOSPACE) and the API server answers, NOT_SERVING
// otherwise, until ctx ends.
func readiness(ctx context.Context, srv *grpcutil.Server, co *coord.Keeper, api *kube.APIProbe, log *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	serving := false
	for {
		apiOK, apiErr := api.Healthy(3 * time.Second)
		etcdErr := co.Health() // no session, or an etcd alarm (NOSPACE)
		ready := etcdErr == nil && apiOK
		if ready != serving {
			serving = ready
			srv.SetServing(ready, reclaimerv1.ReclaimerService_ServiceDesc.ServiceName)
			log.Info("reclaimer readiness changed", "serving", ready, "etcd_session", co.Ready(), "etcd", etcdErr, "api_server", apiOK, "api_error", apiErr)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
