package provisioner

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/coord"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// Labels of the CSIStorageCapacity objects, as external-provisioner sets
// them.
const (
	LabelDriverName = "csi.storage.k8s.io/drivername"
	LabelManagedBy  = "csi.storage.k8s.io/managed-by"
)

// Defaults of CapacityOptions.
const (
	DefaultCapacityPollInterval = time.Minute
	DefaultCapacityManagedBy    = "volplane-provisioner"
)

// reserver elects the one replica that publishes a driver's capacity: a
// reservation on the replica's etcd lease, which lapses when it dies.
type reserver interface {
	Reserve(ctx context.Context, resource, holder string) error
}

var _ reserver = (*coord.Keeper)(nil)

// capacityClient is what capacity tracking needs of a driver.
type capacityClient interface {
	GetCapacity(ctx context.Context, in *csi.GetCapacityRequest, opts ...grpc.CallOption) (*csi.GetCapacityResponse, error)
}

// capacityController keeps the CSIStorageCapacity objects of every served
// driver with GET_CAPACITY. Its queue holds driver names; a sync computes
// the objects the driver should have (its segments times its classes),
// asks GetCapacity for each and creates, updates or deletes objects to
// match, so it is idempotent and needs no memory between syncs. Only the
// replica holding the driver's reservation writes; the others skip, and
// take over when its lease lapses. The API writes are not fenced on the
// reservation, so two replicas may briefly both write: each write is
// idempotent and duplicates are deleted by the next sync.
type capacityController struct {
	log     *slog.Logger
	opts    CapacityOptions
	member  string
	elect   reserver
	client  kubernetes.Interface
	drivers *registry
	nodes   nodes
	classes storagelisters.StorageClassLister
	timeout time.Duration
	owner   *metav1.OwnerReference
	queue   workqueue.TypedRateLimitingInterface[string]
	// getCapacity reaches a driver's controller service; tests replace it.
	getCapacity func(d *driver) capacityClient
}

// newCapacityController is nil when tracking is off; every method of a nil
// controller does nothing. It watches Nodes and CSINodes through factory;
// classes come from the caller, who calls enqueueAll on every class change.
func newCapacityController(o CapacityOptions, log *slog.Logger, member string, client kubernetes.Interface, drivers *registry,
	n nodes, timeout time.Duration, elect reserver, factory informers.SharedInformerFactory, classes storagelisters.StorageClassLister) *capacityController {
	if !o.Enabled {
		return nil
	}
	c := &capacityController{
		log: log.With("component", "capacity"), opts: o, member: member, elect: elect, client: client,
		drivers: drivers, nodes: n, classes: classes, timeout: timeout,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "capacity"}),
		getCapacity: func(d *driver) capacityClient { return d.controller },
	}
	all := func(any) { c.enqueueAll() }
	_, _ = factory.Storage().V1().CSINodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: all, UpdateFunc: func(_, n any) { all(n) }, DeleteFunc: all})
	_, _ = factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: all, DeleteFunc: all,
		// Nodes are updated every few seconds (status); only their labels
		// make segments.
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || !labels.Equals(on.Labels, nn.Labels) {
				c.enqueueAll()
			}
		}})
	return c
}

func (c *capacityController) enqueueAll() {
	if c == nil {
		return
	}
	for _, d := range c.drivers.all() {
		if n := d.name(); n != "" {
			c.queue.Add(n)
		}
	}
}

// onVolumeChange is a CSI client interceptor that refreshes the driver's
// objects after every CreateVolume or DeleteVolume that succeeded, whichever
// path called it (a provisioning, a deletion, a recovery, an orphan's).
func (c *capacityController) onVolumeChange(d func() string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if c != nil && err == nil && (strings.HasSuffix(method, "/CreateVolume") || strings.HasSuffix(method, "/DeleteVolume")) {
			if n := d(); n != "" {
				c.queue.Add(n)
			}
		}
		return err
	}
}

// run syncs until ctx ends: all drivers every PollInterval, and as events
// come. The caller starts the informers.
func (c *capacityController) run(ctx context.Context, probed <-chan struct{}, synced func() bool) {
	if c == nil {
		return
	}
	defer c.queue.ShutDown()
	select {
	case <-probed:
	case <-ctx.Done():
		return
	}
	if !synced() {
		return
	}
	if c.opts.Owner != "" {
		for c.owner == nil {
			ref, err := c.resolveOwner(ctx)
			if err == nil {
				c.owner = ref
				break
			}
			c.log.Warn("capacity tracking waits for its owner object", "owner", c.opts.Owner, "namespace", c.opts.Namespace, "error", err)
			select {
			case <-time.After(10 * time.Second):
			case <-ctx.Done():
				return
			}
		}
	}
	go func() {
		for c.processNext(ctx) {
		}
	}()
	t := time.NewTicker(c.opts.PollInterval)
	defer t.Stop()
	for {
		c.enqueueAll()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

func (c *capacityController) processNext(ctx context.Context) bool {
	name, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(name)
	if err := c.sync(ctx, name); err != nil {
		c.log.Warn("publish storage capacity", "driver", name, "error", err, "retries", c.queue.NumRequeues(name))
		c.queue.AddRateLimited(name)
		return true
	}
	c.queue.Forget(name)
	return true
}

// resolveOwner reads the owner object for its UID.
func (c *capacityController) resolveOwner(ctx context.Context) (*metav1.OwnerReference, error) {
	kind, name, err := parseOwner(c.opts.Owner)
	if err != nil {
		return nil, err
	}
	apps := c.client.AppsV1()
	var meta metav1.Object
	switch kind {
	case "Deployment":
		meta, err = apps.Deployments(c.opts.Namespace).Get(ctx, name, metav1.GetOptions{})
	case "StatefulSet":
		meta, err = apps.StatefulSets(c.opts.Namespace).Get(ctx, name, metav1.GetOptions{})
	case "DaemonSet":
		meta, err = apps.DaemonSets(c.opts.Namespace).Get(ctx, name, metav1.GetOptions{})
	case "ReplicaSet":
		meta, err = apps.ReplicaSets(c.opts.Namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, err
	}
	yes := true
	return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: kind, Name: name, UID: meta.GetUID(), Controller: &yes}, nil
}

// GetCapacity shows the CSIStorageCapacity objects published for a
// driver, read from the API server.
func (s *server) GetCapacity(ctx context.Context, req *provisionerv1.GetCapacityRequest) (*provisionerv1.GetCapacityResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name (the driver's name) is required")
	}
	d := s.p.drivers.byDriver(req.GetName())
	if d == nil {
		d = s.p.drivers.byProvisioner(req.GetName())
	}
	if d == nil {
		return nil, status.Errorf(codes.NotFound, "driver %q is not served by this provisioner (GET /v1/drivers lists those that are)", req.GetName())
	}
	if !d.has(csi.ControllerServiceCapability_RPC_GET_CAPACITY) {
		return nil, status.Errorf(codes.FailedPrecondition, "driver %q does not report the GET_CAPACITY controller capability: it tells no capacity, so none is published", d.name())
	}
	c := s.capacity
	if c == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "capacity tracking is off in this provisioner: start it with --enable-capacity to publish CSIStorageCapacity objects for driver %q", d.name())
	}
	list, err := s.p.client.StorageV1().CSIStorageCapacities(c.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(c.labels(d.name())).String()})
	if err != nil {
		return nil, apiStatus(err, "CSIStorageCapacities")
	}
	out := &provisionerv1.GetCapacityResponse{DriverName: d.name()}
	for _, o := range list.Items {
		pc := &provisionerv1.Capacity{Namespace: o.Namespace, Name: o.Name, StorageClassName: o.StorageClassName,
			Segment: selectorSegment(o.NodeTopology), CreateTime: timestamp(o.CreationTimestamp.Time)}
		if o.Capacity != nil {
			pc.CapacityBytes = o.Capacity.Value()
		}
		if o.MaximumVolumeSize != nil {
			pc.MaximumVolumeSizeBytes = o.MaximumVolumeSize.Value()
		}
		out.Capacities = append(out.Capacities, pc)
	}
	sort.Slice(out.Capacities, func(i, j int) bool {
		a, b := out.Capacities[i], out.Capacities[j]
		return capacityKey(a.StorageClassName, a.Segment) < capacityKey(b.StorageClassName, b.Segment)
	})
	return out, nil
}
