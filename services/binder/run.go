package binder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/pkg/watchclient"
	binderv1 "github.com/volplane/volplane/proto/volplane/binder/v1"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	reclaimerv1 "github.com/volplane/volplane/proto/volplane/reclaimer/v1"
)

// Service is the binder's name in etcd membership.
const Service = "binder"

// Options configures a binder replica.
type Options struct {
	// Options are the flags every replica shares (--kubeconfig, --listen,
	// --etcd-endpoints, the TLS files, ...).
	replica.Options

	// WatcherAddress is the gRPC address of the watcher service, or of
	// several watcher replicas, comma-separated (required). The binder
	// streams from one at a time and fails over to another when its stream
	// breaks or stalls.
	WatcherAddress string
	// StaleAfter is how long the binder may go without a live, caught-up
	// watcher stream before readiness goes NOT_SERVING and no reclaim or
	// provisioning is handed off; 0 means DefaultStaleAfter, and anything
	// below watchclient.MinStaleAfter is refused.
	StaleAfter time.Duration
	// ReclaimerAddress is the reclaimer service's gRPC address; empty means
	// Released volumes are left to another reclaimer.
	ReclaimerAddress string
	// ProvisionerAddress is the provisioner service's gRPC address; empty
	// means every StorageClass is left to external provisioners.
	ProvisionerAddress string
	// Workers is the number of claim workers (and of volume workers).
	Workers int
	// ProvisionCalls bounds the provisioner calls in flight (they run off
	// the workers, so a hanging driver never holds a worker).
	ProvisionCalls int
	// RetryIntervalStart is how long a claim whose provisioning failed
	// waits before the next attempt; the wait doubles with each further
	// failure up to RetryIntervalMax (external-provisioner's
	// --retry-interval-start and --retry-interval-max); 0 means the
	// defaults.
	RetryIntervalStart, RetryIntervalMax time.Duration
	// ResyncPeriod is how often every object is synced again; 0 disables.
	ResyncPeriod time.Duration
	// OwnershipSettle is how long the replica waits before acting on an
	// object it gains (ring change, new etcd session, start), so that the
	// previous owner has stopped (--ownership-settle); 0 means
	// DefaultOwnershipSettle.
	OwnershipSettle time.Duration
	// AllClaims makes this replica cache every claim, and answer
	// ListClaims alone (--claims-by-shard=false). The default, false, is
	// how the binder ships (DefaultClaimsByShard): it asks the watcher for
	// this replica's shard of the claims only, so that each replica's CPU
	// and memory for claims fall as 1/B, and ListClaims asks every replica
	// for its shard (fanout.go). The zero value is the shipped one, so
	// that every harness that starts a binder in process runs it sharded.
	AllClaims bool
	// ForeignBinderManagers are the field managers of other binders whose
	// binding writes to the claims and volumes this replica owns it
	// reports (foreign.go; --foreign-binder-managers); nil means
	// DefaultForeignBinderManagers, empty reports none.
	ForeignBinderManagers []string
}

// DefaultWorkers is the default number of workers per queue: enough
// requests in flight to keep the API server busy, since each bind is four
// sequential writes.
const DefaultWorkers = 128

// DefaultKubeQPS is the binder's client-side API request limit (a fuse,
// kube.RateLimits): a bind is four writes, and the benchmarks reach about
// 250 binds a second per replica.
const DefaultKubeQPS = 1000

// DefaultProvisionCalls is the default bound on provisioner calls in
// flight: each holds its slot through a CSI call and the provisioner's
// journal and PV writes.
const DefaultProvisionCalls = 128

// DefaultRetryIntervalStart and DefaultRetryIntervalMax are
// external-provisioner's defaults of --retry-interval-start and
// --retry-interval-max.
const (
	DefaultRetryIntervalStart = time.Second
	DefaultRetryIntervalMax   = 5 * time.Minute
)

// DefaultResyncPeriod is how often every object is synced again, as in
// kube-controller-manager.
const DefaultResyncPeriod = 15 * time.Second

// DefaultClaimsByShard is the binder command's --claims-by-shard: each
// replica holds only its shard of the claims.
const DefaultClaimsByShard = true

// etcdUse is what the binder keeps in etcd besides membership.
const etcdUse = "reservations"

func (o *Options) validate() error {
	var errs []error
	if len(watchclient.Addresses(o.WatcherAddress)) == 0 {
		errs = append(errs, errors.New("the watcher address is required (--watcher-address)"))
	}
	switch {
	case o.StaleAfter < 0:
		errs = append(errs, fmt.Errorf("stale-after must not be negative, got %s (--watcher-stale-after)", o.StaleAfter))
	case o.StaleAfter == 0:
		o.StaleAfter = DefaultStaleAfter
	case o.StaleAfter < watchclient.MinStaleAfter:
		errs = append(errs, fmt.Errorf("--watcher-stale-after must be at least %s (twice the watcher probe interval: a current stream is that old between probes), got %s", watchclient.MinStaleAfter, o.StaleAfter))
	}
	if o.KubeQPS == 0 {
		o.KubeQPS = DefaultKubeQPS
	}
	errs = append(errs, o.Options.Validate(etcdUse)...)
	// SyncClaim, SyncVolume and ExplainClaim are forwarded to the replica
	// that owns the object, at the address this one registers.
	if err := o.ValidatePeerAddress(); err != nil {
		errs = append(errs, err)
	}
	if o.Workers < 0 {
		errs = append(errs, fmt.Errorf("workers must be at least 1, got %d (--workers)", o.Workers))
	}
	if o.OwnershipSettle < 0 {
		errs = append(errs, fmt.Errorf("ownership settle must not be negative, got %s (--ownership-settle)", o.OwnershipSettle))
	}
	if o.OwnershipSettle == 0 {
		o.OwnershipSettle = DefaultOwnershipSettle
	}
	if o.ResyncPeriod < 0 {
		errs = append(errs, fmt.Errorf("resync period must not be negative, got %s (--resync-period)", o.ResyncPeriod))
	}
	if o.Workers == 0 {
		o.Workers = DefaultWorkers
	}
	if o.ProvisionCalls < 0 {
		errs = append(errs, fmt.Errorf("provision calls must be at least 1, got %d (--provision-calls)", o.ProvisionCalls))
	}
	if o.ProvisionCalls == 0 {
		o.ProvisionCalls = DefaultProvisionCalls
	}
	switch {
	case o.RetryIntervalStart < 0:
		errs = append(errs, fmt.Errorf("retry interval start must not be negative, got %s (--retry-interval-start)", o.RetryIntervalStart))
	case o.RetryIntervalStart == 0:
		o.RetryIntervalStart = DefaultRetryIntervalStart
	}
	switch {
	case o.RetryIntervalMax < 0:
		errs = append(errs, fmt.Errorf("retry interval max must not be negative, got %s (--retry-interval-max)", o.RetryIntervalMax))
	case o.RetryIntervalMax == 0:
		o.RetryIntervalMax = DefaultRetryIntervalMax
	}
	if o.RetryIntervalStart > 0 && o.RetryIntervalMax > 0 && o.RetryIntervalMax < o.RetryIntervalStart {
		errs = append(errs, fmt.Errorf("--retry-interval-max (%s) must not be below --retry-interval-start (%s)", o.RetryIntervalMax, o.RetryIntervalStart))
	}
	if o.ForeignBinderManagers == nil {
		o.ForeignBinderManagers = DefaultForeignBinderManagers
	}
	return errors.Join(errs...)
}

// Run runs a binder replica until ctx ends, then shuts down gracefully.
// The etcd session is kept through outages: Run never ends because of
// etcd. Without a session the replica owns nothing (session.go).
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("binder options: %w", err)
	}
	cfg := o.Config(Service)
	cfg.Readiness = replica.Readiness{Every: 250 * time.Millisecond, Services: []string{binderv1.BinderService_ServiceDesc.ServiceName}}
	r, err := replica.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	metrics.RegisterWorkqueueMetrics()
	c, prov, closeClients, err := newWiredController(r, o)
	defer closeClients()
	if err != nil {
		return err
	}
	c.timeline = r.Timeline
	ptl, _ := prov.(provisionerTimeline) // nil without a provisioner
	// One binder per process in production; tests running several share
	// the registry, and the first one reports.
	if reporting.CompareAndSwap(nil, c) {
		defer reporting.CompareAndSwap(c, nil)
	}
	own := newOwnership(o.MemberID, o.OwnershipSettle)
	if !o.AllClaims {
		// The watcher sends this replica the claims of its shard only.
		c.shard = watchclient.NewShard()
		c.streams = c.shard.Streams
		own.shard, own.holds = c.shard, c.shard.Holds
		// The claims a full list brings were queued before they were
		// owned (Holds answers only once the list is in): queue them
		// again. The resync after the settle period (followMembers)
		// covers a list that comes in first.
		c.shard.OnListed(c.enqueueAll)
	}
	c.owns = own.owns
	c.canAct = func() bool {
		ok, _ := r.API.Healthy(3 * time.Second)
		// An etcd alarm (NOSPACE) refuses every reservation: not ready.
		return ok && own.ready() && r.Coord.Health() == nil
	}
	// Ready (gRPC health and /readyz) while the cache is current and the
	// replica can act: canAct, check by check.
	r.Health.AddReadiness("watcher-stream", c.streamCheck)
	r.Health.AddReadiness("membership", own.check)
	peers := newPeers(o.MemberID, own.current, o.TLS)
	defer peers.close()
	a := &api{c: c, memberID: o.MemberID, workers: o.Workers, members: own.members, peers: peers, prov: prov, ptl: ptl}
	if c.shard != nil {
		a.shard = c.shard
	}
	binderv1.RegisterBinderServiceServer(r.Server.Server, a)

	r.Log.Info("binder starting", "member", o.MemberID, "listen", r.Addr(), "watcher", o.WatcherAddress, "workers", o.Workers)
	return r.Run(ctx,
		func(ctx context.Context) error {
			return c.subscribe(ctx, watchclient.Addresses(o.WatcherAddress), o.TLS, r.Log)
		},
		func(ctx context.Context) error { return c.run(ctx, o.Workers, o.ResyncPeriod) },
		replica.Until(func(ctx context.Context) { followMembers(ctx, r.Coord, own, peers, c.enqueueAll, r.Log) }),
		replica.Until(func(ctx context.Context) {
			if c.foreign != nil {
				c.foreign.run(ctx)
			}
		}))
}

// newWiredController is the binder's controller on r, with its clients
// of the reclaimer and the provisioner (prov is nil without one); call
// closeClients when done, whatever the error.
func newWiredController(r *replica.Replica, o Options) (c *controller, prov provisionerInfo, closeClients func(), err error) {
	var conns []*grpc.ClientConn
	closeClients = func() {
		for i := len(conns) - 1; i >= 0; i-- {
			conns[i].Close()
		}
	}
	c = newController(r.Log, r.Client, r.Recorder)
	c.handed.ttl = o.ResyncPeriod
	if len(o.ForeignBinderManagers) > 0 {
		c.foreign = newForeignBinders(o.ForeignBinderManagers, r.Client, r.Recorder, r.Log)
		c.foreign.known = c.store.responded.has
	}
	c.provisions = newProvisions(o.ProvisionCalls, o.RetryIntervalStart, o.RetryIntervalMax)
	c.feed = &feed{staleAfter: o.StaleAfter}
	c.reservations.etcd = r.Coord
	c.journal = r.Coord
	c.etcdHealth = r.Coord.Health
	if o.ReclaimerAddress != "" {
		cc, err := grpcutil.Dial(o.ReclaimerAddress, o.TLS)
		if err != nil {
			return nil, nil, closeClients, err
		}
		conns = append(conns, cc)
		c.reclaimer = gatedReclaimer{next: reclaimerClient{reclaimerv1.NewReclaimerServiceClient(cc)}, c: c}
	}
	if o.ProvisionerAddress != "" {
		cc, err := grpcutil.Dial(o.ProvisionerAddress, o.TLS)
		if err != nil {
			return nil, nil, closeClients, err
		}
		conns = append(conns, cc)
		pc := newProvisionerClient(provisionerv1.NewProvisionerServiceClient(cc), r.Log)
		c.provisioner = gatedProvisioner{provisioner: pc, c: c}
		c.served = pc
		prov = pc // a nil interface when there is no provisioner
	}
	return c, prov, closeClients, nil
}

// reclaimerClient adapts the reclaimer's gRPC client to the binder's needs.
type reclaimerClient struct {
	c reclaimerv1.ReclaimerServiceClient
}

var _ reclaimer = reclaimerClient{}

func (r reclaimerClient) Reclaim(ctx context.Context, v *corev1.PersistentVolume) error {
	b, err := kube.EncodeProto(v)
	if err != nil {
		return err
	}
	_, err = r.c.Reclaim(ctx, &reclaimerv1.ReclaimRequest{VolumeName: v.Name, VolumeUid: string(v.UID), Volume: b})
	return err
}
