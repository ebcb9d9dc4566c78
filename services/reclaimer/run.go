package reclaimer

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/grpcutil"
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
	// Not waited for: until the index holds every claim, the guard lists
	// the claims from the API server (kubeCluster.ClaimsNaming) and the
	// replica is not ready; its debug port and health answer meanwhile,
	// so a replica waiting for the API server is not killed for it.
	c := newController(log, o.MemberID, kubeCluster{c: client, claims: claimInformer.GetIndexer(), synced: claimInformer.HasSynced}, co,
		newDrivers(prov, o.DriversRefreshPeriod, log), prov, recorder, cfg, o.RetryIntervalStart, o.RetryIntervalMax, nil)
	if reporting.CompareAndSwap(nil, c) {
		defer reporting.CompareAndSwap(c, nil)
	}
	r.Health.AddReadiness("claims-informer", func() error {
		if claimInformer.HasSynced() {
			return nil
		}
		return errors.New("the claims are not listed yet")
	})

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
			// Ready while it has an etcd session, the API server answers
			// and the claims are listed (the checks of r.Health).
			r.Readiness(ctx, time.Second, reclaimerv1.ReclaimerService_ServiceDesc.ServiceName)
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
