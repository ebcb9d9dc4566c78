package provisioner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
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

// CapacityOptions configures storage capacity tracking: for every driver
// with the GET_CAPACITY controller capability, one CSIStorageCapacity
// object per topology segment and StorageClass, as external-provisioner's
// --enable-capacity publishes them, so the scheduler places pods of
// WaitForFirstConsumer claims where their volumes fit.
type CapacityOptions struct {
	// Enabled turns tracking on (--enable-capacity); off by default, as
	// in external-provisioner.
	Enabled bool
	// PollInterval is how often every object is refreshed
	// (--capacity-poll-interval); default DefaultCapacityPollInterval.
	// Objects are also refreshed when a volume is created or deleted, and
	// when classes, CSINodes or Node labels change.
	PollInterval time.Duration
	// Namespace holds the objects (--capacity-namespace): the
	// provisioner's own namespace, as external-provisioner's NAMESPACE.
	// Required when Enabled.
	Namespace string
	// ManagedBy is the csi.storage.k8s.io/managed-by label value of the
	// objects this provisioner owns (--capacity-managed-by); default
	// DefaultCapacityManagedBy. external-provisioner's is
	// "external-provisioner": set that to adopt its objects when replacing
	// it; the distinct default keeps the two from fighting over objects
	// while both run. The scheduler reads neither label.
	ManagedBy string
	// Owner is the object that owns the objects, "Kind/name" in Namespace
	// (--capacity-owner): Deployment, StatefulSet, DaemonSet or ReplicaSet
	// (apps/v1). Deleting it garbage-collects them, as external-provisioner's
	// --capacity-ownerref-level does for its Deployment. Empty sets no
	// owner: the objects stay after an uninstall, found by their labels.
	Owner string
	// ForImmediateBinding also publishes for classes with Immediate
	// binding (--capacity-for-immediate-binding); by default only
	// WaitForFirstConsumer classes, whose pods the scheduler places.
	ForImmediateBinding bool
}

func (c *CapacityOptions) validate() error {
	if !c.Enabled {
		return nil
	}
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("capacity tracking needs the namespace of its CSIStorageCapacity objects (--capacity-namespace)"))
	}
	switch {
	case c.PollInterval < 0:
		errs = append(errs, fmt.Errorf("--capacity-poll-interval must not be negative, got %s", c.PollInterval))
	case c.PollInterval == 0:
		c.PollInterval = DefaultCapacityPollInterval
	}
	if c.ManagedBy == "" {
		c.ManagedBy = DefaultCapacityManagedBy
	}
	if c.Owner != "" {
		if _, _, err := parseOwner(c.Owner); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ownerKinds are the kinds --capacity-owner accepts.
var ownerKinds = map[string]bool{"Deployment": true, "StatefulSet": true, "DaemonSet": true, "ReplicaSet": true}

func parseOwner(s string) (kind, name string, err error) {
	kind, name, ok := strings.Cut(s, "/")
	if !ok || name == "" || !ownerKinds[kind] {
		return "", "", fmt.Errorf("--capacity-owner %q: want Kind/name with Kind Deployment, StatefulSet, DaemonSet or ReplicaSet", s)
	}
	return kind, name, nil
}

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
// controller does nothing.
func newCapacityController(o CapacityOptions, log *slog.Logger, member string, client kubernetes.Interface, drivers *registry,
	n nodes, timeout time.Duration, elect reserver, factory informers.SharedInformerFactory) *capacityController {
	if !o.Enabled {
		return nil
	}
	c := &capacityController{
		log: log.With("component", "capacity"), opts: o, member: member, elect: elect, client: client,
		drivers: drivers, nodes: n, classes: factory.Storage().V1().StorageClasses().Lister(), timeout: timeout,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "capacity"}),
		getCapacity: func(d *driver) capacityClient { return d.controller },
	}
	all := func(any) { c.enqueueAll() }
	_, _ = factory.Storage().V1().StorageClasses().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: all, UpdateFunc: func(_, n any) { all(n) }, DeleteFunc: all})
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

// capacityKey names one object: a class in a segment.
func capacityKey(class string, seg map[string]string) string {
	return class + " " + segmentString(seg)
}

// wanted is one object a driver should have.
type wanted struct {
	class *storagev1.StorageClass
	seg   map[string]string // nil: a driver without topology
}

// desired lists the objects driver d should have: its classes (those of
// its provisioner name, WaitForFirstConsumer unless ForImmediateBinding)
// in every segment of a node where it is installed.
func (c *capacityController) desired(d *driver) ([]wanted, error) {
	classes, err := c.classes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	segs := []map[string]string{nil}
	if d.current().topology {
		segs = nil
		cns, err := c.nodes.CSINodes()
		if err != nil {
			return nil, fmt.Errorf("list CSINodes: %w", err)
		}
		for _, cn := range cns {
			keys := topologyKeys(cn, d.name())
			if len(keys) == 0 {
				continue
			}
			node, err := c.nodes.Node(cn.Name)
			if err != nil {
				continue
			}
			if seg, err := segmentOf(node, keys); err == nil {
				segs = append(segs, seg)
			}
		}
		segs = dedupe(segs)
	}
	var out []wanted
	for _, sc := range classes {
		if sc.Provisioner != d.provisionerName() {
			continue
		}
		wffc := sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer
		if !wffc && !c.opts.ForImmediateBinding {
			continue
		}
		for _, seg := range segs {
			if seg != nil && len(sc.AllowedTopologies) > 0 && !allowed(seg, sc.AllowedTopologies) {
				continue
			}
			out = append(out, wanted{class: sc, seg: seg})
		}
	}
	return out, nil
}

// sync makes driver name's objects match what GetCapacity says now.
func (c *capacityController) sync(ctx context.Context, name string) error {
	d := c.drivers.byDriver(name)
	if d == nil || !d.ready() {
		return nil // probed again soon; the next poll comes back
	}
	if err := c.elect.Reserve(ctx, "capacity/"+name, c.member); err != nil {
		if errors.Is(err, coord.ErrReserved) {
			return nil // another replica publishes this driver's capacity
		}
		return err
	}
	var want []wanted
	if d.has(csi.ControllerServiceCapability_RPC_GET_CAPACITY) {
		var err error
		if want, err = c.desired(d); err != nil {
			return err
		}
	}
	api := c.client.StorageV1().CSIStorageCapacities(c.opts.Namespace)
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(c.labels(name)).String()})
	if err != nil {
		return fmt.Errorf("list CSIStorageCapacities: %w", err)
	}
	have := map[string]*storagev1.CSIStorageCapacity{}
	var errs []error
	for i := range list.Items {
		obj := &list.Items[i]
		k := capacityKey(obj.StorageClassName, selectorSegment(obj.NodeTopology))
		if _, dup := have[k]; dup {
			// Two writers raced once: keep one.
			errs = append(errs, c.delete(ctx, obj))
			continue
		}
		have[k] = obj
	}
	for _, w := range want {
		k := capacityKey(w.class.Name, w.seg)
		obj := have[k]
		delete(have, k)
		if err := c.publish(ctx, d, w, obj); err != nil {
			errs = append(errs, err)
		}
	}
	for _, obj := range have { // a class or segment that is gone
		errs = append(errs, c.delete(ctx, obj))
	}
	return errors.Join(errs...)
}

func (c *capacityController) labels(driver string) map[string]string {
	return map[string]string{LabelDriverName: driver, LabelManagedBy: c.opts.ManagedBy}
}

// publish asks the driver for w's capacity and creates or updates obj.
func (c *capacityController) publish(ctx context.Context, d *driver, w wanted, obj *storagev1.CSIStorageCapacity) error {
	req := &csi.GetCapacityRequest{Parameters: capacityParameters(w.class)}
	if w.seg != nil {
		req.AccessibleTopology = &csi.Topology{Segments: w.seg}
	}
	cctx, cancel := context.WithTimeout(ctx, c.timeout)
	resp, err := c.getCapacity(d).GetCapacity(cctx, req)
	cancel()
	if err != nil {
		return fmt.Errorf("GetCapacity of class %s in %s: %w", w.class.Name, segmentString(w.seg), err)
	}
	capacity := resource.NewQuantity(resp.GetAvailableCapacity(), resource.BinarySI)
	var maxSize *resource.Quantity
	if m := resp.GetMaximumVolumeSize(); m != nil {
		maxSize = resource.NewQuantity(m.GetValue(), resource.BinarySI)
	}
	api := c.client.StorageV1().CSIStorageCapacities(c.opts.Namespace)
	if obj == nil {
		obj = &storagev1.CSIStorageCapacity{
			ObjectMeta:        metav1.ObjectMeta{GenerateName: "csisc-", Labels: c.labels(d.name())},
			StorageClassName:  w.class.Name,
			NodeTopology:      &metav1.LabelSelector{MatchLabels: w.seg},
			Capacity:          capacity,
			MaximumVolumeSize: maxSize,
		}
		if c.owner != nil {
			obj.OwnerReferences = []metav1.OwnerReference{*c.owner}
		}
		created, err := api.Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create CSIStorageCapacity for class %s in %s: %w", w.class.Name, segmentString(w.seg), err)
		}
		c.log.Debug("created CSIStorageCapacity", "name", created.Name, "class", w.class.Name, "segment", segmentString(w.seg), "capacity", capacity.String())
		return nil
	}
	if sameQuantity(obj.Capacity, capacity) && sameQuantity(obj.MaximumVolumeSize, maxSize) && c.ownedBy(obj) {
		return nil
	}
	obj = obj.DeepCopy()
	obj.Capacity, obj.MaximumVolumeSize = capacity, maxSize
	if !c.ownedBy(obj) {
		obj.OwnerReferences = append(obj.OwnerReferences, *c.owner)
	}
	if _, err := api.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update CSIStorageCapacity %s: %w", obj.Name, err)
	}
	c.log.Debug("updated CSIStorageCapacity", "name", obj.Name, "class", w.class.Name, "segment", segmentString(w.seg), "capacity", capacity.String())
	return nil
}

func (c *capacityController) delete(ctx context.Context, obj *storagev1.CSIStorageCapacity) error {
	err := c.client.StorageV1().CSIStorageCapacities(obj.Namespace).Delete(ctx, obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &obj.UID}})
	if err != nil && !isNotFoundOrConflict(err) {
		return fmt.Errorf("delete CSIStorageCapacity %s: %w", obj.Name, err)
	}
	return nil
}

// ownedBy reports whether obj carries the configured owner (true when
// none is configured).
func (c *capacityController) ownedBy(obj *storagev1.CSIStorageCapacity) bool {
	if c.owner == nil {
		return true
	}
	for _, r := range obj.OwnerReferences {
		if r.UID == c.owner.UID {
			return true
		}
	}
	return false
}

func sameQuantity(a, b *resource.Quantity) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Cmp(*b) == 0
}

// capacityParameters are the class parameters CreateVolume gets, so
// GetCapacity answers for the volumes this class makes: without the
// csi.storage.k8s.io/ keys, which only the provisioner reads.
func capacityParameters(class *storagev1.StorageClass) map[string]string {
	out := map[string]string{}
	for k, v := range class.Parameters {
		if !strings.HasPrefix(k, csiParameterPrefix) {
			out[k] = v
		}
	}
	return out
}

// selectorSegment is the segment an object's nodeTopology selects (nil
// for none).
func selectorSegment(s *metav1.LabelSelector) map[string]string {
	if s == nil || len(s.MatchLabels) == 0 {
		return nil
	}
	return s.MatchLabels
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

// isNotFoundOrConflict: the object is gone, or is another one now.
func isNotFoundOrConflict(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsConflict(err)
}
