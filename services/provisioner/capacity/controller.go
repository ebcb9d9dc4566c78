package capacity

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
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

// Reserver elects the one replica that publishes a driver's capacity: a
// reservation on the replica's etcd lease, which lapses when it dies.
type Reserver interface {
	Reserve(ctx context.Context, resource, holder string) error
}

var _ Reserver = (*coord.Keeper)(nil)

// Client is what tracking needs of a driver's controller service.
type Client interface {
	GetCapacity(ctx context.Context, in *csi.GetCapacityRequest, opts ...grpc.CallOption) (*csi.GetCapacityResponse, error)
}

// Driver is what tracking knows of one CSI driver when it syncs it.
type Driver struct {
	// Name is its CSI name, ProvisionerName the StorageClass provisioner
	// it serves.
	Name, ProvisionerName string
	// Ready: its last probe succeeded.
	Ready bool
	// Topology: it has VOLUME_ACCESSIBILITY_CONSTRAINTS (one object per
	// segment); GetCapacity: it has the GET_CAPACITY capability.
	Topology, GetCapacity bool
	// Client reaches its controller service.
	Client Client
}

// Drivers are the drivers the provisioner serves and the topology of the
// nodes they are installed on.
type Drivers interface {
	// Names are the CSI names of the drivers (those probed).
	Names() []string
	// Driver is the driver of that CSI name; false when none is served.
	Driver(name string) (Driver, bool)
	// Segments are the topology segments of the nodes where the driver
	// is installed, sorted, without repeats.
	Segments(driver string) ([]map[string]string, error)
	// Allowed reports whether the class's allowedTopologies admit seg.
	Allowed(seg map[string]string, class *storagev1.StorageClass) bool
}

// Controller keeps the CSIStorageCapacity objects of every served
// driver with GET_CAPACITY. Its queue holds driver names; a sync computes
// the objects the driver should have (its segments times its classes),
// asks GetCapacity for each and creates, updates or deletes objects to
// match, so it is idempotent and needs no memory between syncs. Only the
// replica holding the driver's reservation writes; the others skip, and
// take over when its lease lapses. The API writes are not fenced on the
// reservation, so two replicas may briefly both write: each write is
// idempotent and duplicates are deleted by the next sync.
type Controller struct {
	log     *slog.Logger
	opts    Options
	member  string
	elect   Reserver
	client  kubernetes.Interface
	drivers Drivers
	classes storagelisters.StorageClassLister
	timeout time.Duration
	owner   *metav1.OwnerReference
	queue   workqueue.TypedRateLimitingInterface[string]
}

// Config is what a Controller works with besides its Options.
type Config struct {
	Log *slog.Logger
	// Member holds the drivers' reservations (Elect).
	Member string
	Elect  Reserver
	Client kubernetes.Interface
	// Drivers are the drivers served; Factory brings the Node and CSINode
	// changes (the caller starts it); Classes are the StorageClasses,
	// whose owner calls EnqueueAll on every change.
	Drivers Drivers
	Factory informers.SharedInformerFactory
	Classes storagelisters.StorageClassLister
	// Timeout bounds each GetCapacity.
	Timeout time.Duration
}

// New is nil when tracking is off; every method of a nil Controller does
// nothing.
func New(o Options, cfg Config) *Controller {
	if !o.Enabled {
		return nil
	}
	c := &Controller{
		log: cfg.Log.With("component", "capacity"), opts: o, member: cfg.Member, elect: cfg.Elect, client: cfg.Client,
		drivers: cfg.Drivers, classes: cfg.Classes, timeout: cfg.Timeout,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "capacity"}),
	}
	all := func(any) { c.EnqueueAll() }
	_, _ = cfg.Factory.Storage().V1().CSINodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: all, UpdateFunc: func(_, n any) { all(n) }, DeleteFunc: all})
	_, _ = cfg.Factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: all, DeleteFunc: all,
		// Nodes are updated every few seconds (status); only their labels
		// make segments.
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if !ok1 || !ok2 || !labels.Equals(on.Labels, nn.Labels) {
				c.EnqueueAll()
			}
		}})
	return c
}

// EnqueueAll syncs every driver soon.
func (c *Controller) EnqueueAll() {
	if c == nil {
		return
	}
	for _, n := range c.drivers.Names() {
		c.queue.Add(n)
	}
}

// OnVolumeChange is a CSI client interceptor that refreshes the driver's
// objects after every CreateVolume or DeleteVolume that succeeded, whichever
// path called it (a provisioning, a deletion, a recovery, an orphan's).
// driver names the driver of the connection ("" until probed).
func (c *Controller) OnVolumeChange(driver func() string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if c != nil && err == nil && (strings.HasSuffix(method, "/CreateVolume") || strings.HasSuffix(method, "/DeleteVolume")) {
			if n := driver(); n != "" {
				c.queue.Add(n)
			}
		}
		return err
	}
}

// Run syncs until ctx ends, once probed is closed and synced reports the
// classes listed: all drivers every PollInterval, and as events come. The
// caller starts the informers.
func (c *Controller) Run(ctx context.Context, probed <-chan struct{}, synced func() bool) {
	if c == nil {
		return
	}
	defer c.queue.ShutDown()
	select {
	case <-probed:
	case <-ctx.Done():
		return
	}
	if !synced() || !c.waitForOwner(ctx) {
		return
	}
	go func() {
		for c.processNext(ctx) {
		}
	}()
	t := time.NewTicker(c.opts.PollInterval)
	defer t.Stop()
	for {
		c.EnqueueAll()
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// waitForOwner reads the configured owner object until it can, and
// reports whether it did before ctx ended (true with no owner configured).
func (c *Controller) waitForOwner(ctx context.Context) bool {
	if c.opts.Owner == "" {
		return true
	}
	for {
		ref, err := c.resolveOwner(ctx)
		if err == nil {
			c.owner = ref
			return true
		}
		c.log.Warn("capacity tracking waits for its owner object", "owner", c.opts.Owner, "namespace", c.opts.Namespace, "error", err)
		select {
		case <-time.After(10 * time.Second):
		case <-ctx.Done():
			return false
		}
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
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
func (c *Controller) resolveOwner(ctx context.Context) (*metav1.OwnerReference, error) {
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

// Published is the CSIStorageCapacity objects published for driver, as
// the API server has them, by class and segment.
func (c *Controller) Published(ctx context.Context, driver string) ([]*provisionerv1.Capacity, error) {
	list, err := c.client.StorageV1().CSIStorageCapacities(c.opts.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(c.labels(driver)).String()})
	if err != nil {
		return nil, err
	}
	var out []*provisionerv1.Capacity
	for _, o := range list.Items {
		pc := &provisionerv1.Capacity{Namespace: o.Namespace, Name: o.Name, StorageClassName: o.StorageClassName,
			Segment: selectorSegment(o.NodeTopology)}
		if t := o.CreationTimestamp.Time; !t.IsZero() {
			pc.CreateTime = timestamppb.New(t)
		}
		if o.Capacity != nil {
			pc.CapacityBytes = o.Capacity.Value()
		}
		if o.MaximumVolumeSize != nil {
			pc.MaximumVolumeSizeBytes = o.MaximumVolumeSize.Value()
		}
		out = append(out, pc)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return key(a.StorageClassName, a.Segment) < key(b.StorageClassName, b.Segment)
	})
	return out, nil
}
