package provisioner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/sidecar"
)

// discovery finds the drivers served by volplane-csi-sidecars: it watches
// their registrations (Leases labelled sidecar.LabelRegistration, in
// every namespace), checks each one at every renewal (sync), and keeps the
// registry's discovered drivers' sidecars to the verified ones.
//
// A registration is used only while, in this order: it is fresh; its pod
// exists (one GET, no cluster-wide pod informer), is not being deleted, is
// Ready and has an IP, and, in the node's network (hostNetwork), declares
// the registered port in one of its containers; a SubjectAccessReview lets the pod's ServiceAccount
// serve the driver; and the sidecar at podIP:port shows the pinned
// certificate to the provisioner's client certificate and names the
// registered driver. Whatever fails is logged once per registration and
// reason, at info, naming the Lease, the pod and the reason.
type discovery struct {
	log    *slog.Logger
	client kubernetes.Interface
	leases coordinationlisters.LeaseLister
	synced cache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[string]
	reg    *registry
	known  *knownDrivers
	// connect dials a sidecar of driver at addr pinning hash (pinnedTLS
	// and the CSI interceptors).
	connect func(driver, addr, hash string) (*grpc.ClientConn, error)
	now     func() time.Time

	mu sync.Mutex
	// drivers is the driver each lease's endpoint is in; logged the
	// last reason logged per lease (so each is logged once).
	drivers map[string]string
	logged  map[string]string
}

// leaseSelector selects the sidecars' registrations.
const leaseSelector = sidecar.LabelRegistration

// newDiscovery watches registrations through its own informer factory
// (the caller starts it) and adds what it finds to reg.
func newDiscovery(log *slog.Logger, client kubernetes.Interface, reg *registry, known *knownDrivers,
	connect func(driver, addr, hash string) (*grpc.ClientConn, error)) (*discovery, informers.SharedInformerFactory, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = leaseSelector }))
	inf := factory.Coordination().V1().Leases()
	d := &discovery{log: log.With("component", "sidecar-discovery"), client: client, leases: inf.Lister(), synced: inf.Informer().HasSynced,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "sidecar-registrations"}),
		reg: reg, known: known, connect: connect, now: time.Now, drivers: map[string]string{}, logged: map[string]string{}}
	_, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    d.enqueue,
		UpdateFunc: func(_, o any) { d.enqueue(o) },
		DeleteFunc: d.enqueue,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("sidecar registration informer: %w", err)
	}
	return d, factory, nil
}

func (d *discovery) enqueue(obj any) {
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		d.queue.Add(key)
	}
}

// run works the queue until ctx ends.
func (d *discovery) run(ctx context.Context) {
	go func() { <-ctx.Done(); d.queue.ShutDown() }()
	for d.next(ctx) {
	}
}

func (d *discovery) next(ctx context.Context) bool {
	key, quit := d.queue.Get()
	if quit {
		return false
	}
	defer d.queue.Done(key)
	if err := d.sync(ctx, key); err != nil {
		d.log.Warn("check sidecar registration", "lease", key, "error", err)
		d.queue.AddRateLimited(key)
		return true
	}
	d.queue.Forget(key)
	return true
}

// sync checks the registration of lease key (namespace/name) and updates
// its driver's sidecars. An error (the API server could not be asked)
// leaves things as they are, to be retried.
func (d *discovery) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	l, err := d.leases.Leases(ns).Get(name)
	if apierrors.IsNotFound(err) {
		d.drop(key, "", "the registration Lease is gone")
		return nil
	} else if err != nil {
		return err
	}
	r, err := sidecar.FromLease(l)
	if err != nil {
		d.drop(key, "", "malformed registration: "+err.Error())
		return nil
	}
	pod, why, err := d.verify(ctx, r)
	if err != nil {
		return err
	}
	if why != "" {
		d.drop(key, r.Key(), why)
		return nil
	}
	// Checked again when it expires, unless a renewal comes first.
	d.queue.AddAfter(key, r.Expires().Sub(d.now())+100*time.Millisecond)
	if why := d.use(ctx, key, r, pod.Status.PodIP); why != "" {
		d.drop(key, r.Key(), why)
	}
	return nil
}

// verify checks, in order, that r is fresh, that its pod exists, is not
// being deleted, is Ready and has an IP, and that its ServiceAccount may
// serve r's driver. why says what failed; err, that it could not be told.
func (d *discovery) verify(ctx context.Context, r sidecar.Registration) (pod *corev1.Pod, why string, err error) {
	if now := d.now(); !r.Fresh(now) {
		return nil, fmt.Sprintf("expired at %s (not renewed)", r.Expires().UTC().Format(time.RFC3339)), nil
	}
	pod, err = d.client.CoreV1().Pods(r.Namespace).Get(ctx, r.Pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, "the pod does not exist", nil
	case err != nil:
		return nil, "", fmt.Errorf("read pod %s: %w", r.Key(), err)
	case pod.DeletionTimestamp != nil:
		return nil, "the pod is being deleted", nil
	case !podReady(pod):
		return nil, "the pod is not Ready", nil
	case pod.Status.PodIP == "":
		return nil, "the pod has no IP", nil
	case r.Node != "" && pod.Spec.NodeName != r.Node:
		return nil, fmt.Sprintf("the registration is for node %q (--node-deployment), but the pod runs on node %q", r.Node, pod.Spec.NodeName), nil
	case pod.Spec.HostNetwork && !declaresPort(pod, r.Port):
		return nil, fmt.Sprintf("the pod runs in the node's network (hostNetwork) and none of its containers declares the registered port %d "+
			"(ports: containerPort %d, TCP), so it may be another process's of the node", r.Port, r.Port), nil
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	allowed, reason, err := d.mayServe(ctx, r.Namespace, sa, r.Driver)
	if err != nil {
		return nil, "", err
	}
	if !allowed {
		return nil, fmt.Sprintf("ServiceAccount %s/%s may not serve CSI driver %s (SubjectAccessReview: verb %s on %s %s, %s; bind ClusterRole %s to it)",
			r.Namespace, sa, r.Driver, sidecar.VerbServe, sidecar.Group, sidecar.ResourceDrivers, reason, sidecar.ClusterRole), nil
	}
	return pod, "", nil
}

// declaresPort reports whether a container of pod declares port (TCP)
// among its ports. A pod in the node's network shares the node's ports
// with every other process there: a registration of such a pod could
// name any of them, and the provisioner would send its CSI calls (and the
// secrets in them) to whoever listens. A declared port is the pod's own:
// in the node's network its hostPort is the containerPort, which the
// scheduler gives one pod of a node at a time.
func declaresPort(pod *corev1.Pod, port int) bool {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if int(p.ContainerPort) == port && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP) {
				return true
			}
		}
	}
	return false
}

// podReady reports whether pod's Ready condition is True.
func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// mayServe asks the API server whether ServiceAccount ns/sa may serve
// driver (a SubjectAccessReview).
func (d *discovery) mayServe(ctx context.Context, ns, sa, driver string) (bool, string, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Group: sidecar.Group, Resource: sidecar.ResourceDrivers, Verb: sidecar.VerbServe, Name: driver,
		},
	}}
	out, err := d.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("SubjectAccessReview for ServiceAccount %s/%s: %w", ns, sa, err)
	}
	reason := out.Status.Reason
	if reason == "" {
		reason = "denied"
	}
	return out.Status.Allowed, reason, nil
}

// use puts the sidecar of r at ip into its driver's pool: a new
// connection when the address or the pin changed (checked with a first
// call), else the settings of the renewal. It returns why the sidecar
// cannot be used, "" when it is.
func (d *discovery) use(ctx context.Context, key string, r sidecar.Registration, ip string) string {
	d.mu.Lock()
	prev := d.drivers[key]
	d.mu.Unlock()
	if prev != "" && prev != r.Driver {
		d.drop(key, "", "") // the registration now names another driver
	}
	drv, made := d.reg.sidecarDriver(r.Driver)
	addr := netJoin(ip, r.Port)
	if ep := drv.sidecars.get(key); ep != nil && ep.addr == addr && ep.hash == r.CertSHA256 {
		changed := fmt.Sprint(ep.settings) != fmt.Sprint(r.Settings) || ep.node != r.Node || fmt.Sprint(ep.topology) != fmt.Sprint(r.NodeTopology)
		drv.sidecars.set(endpointOf(key, addr, r, ep.conn), d.now())
		d.known.remember(ctx, r.Driver, d.now(), r.Key())
		if changed {
			d.reg.kick()
		}
		return ""
	}
	cc, err := d.connect(r.Driver, addr, r.CertSHA256)
	if err == nil {
		if err = checkSidecar(ctx, cc, r.Driver); err != nil {
			cc.Close()
		}
	}
	if err != nil {
		return fmt.Sprintf("the sidecar at %s does not answer with its pinned certificate: %v", addr, err)
	}
	if old := drv.sidecars.set(endpointOf(key, addr, r, cc), d.now()); old != nil {
		old.conn.Close()
	}
	d.mu.Lock()
	d.drivers[key] = r.Driver
	delete(d.logged, key)
	d.mu.Unlock()
	d.log.Info("volplane-csi-sidecar registered", "lease", key, "pod", r.Key(), "driver", r.Driver, "address", addr, "node", r.Node)
	if made {
		d.log.Info("CSI driver discovered", "driver", r.Driver)
	}
	d.known.remember(ctx, r.Driver, d.now(), r.Key())
	d.reg.kick()
	return ""
}

// endpointOf is the endpoint of registration r (lease key) at addr.
func endpointOf(key, addr string, r sidecar.Registration, cc *grpc.ClientConn) *sidecarEndpoint {
	return &sidecarEndpoint{lease: key, pod: r.Key(), addr: addr, hash: r.CertSHA256, settings: r.Settings, conn: cc,
		node: r.Node, topology: r.NodeTopology, immediate: r.NodeImmediateBinding}
}

// drop takes the sidecar of lease key out of its driver's pool, logging
// why once per registration and reason (pod names the registration's
// pod, "" when unknown; an empty why drops silently).
func (d *discovery) drop(key, pod, why string) {
	d.mu.Lock()
	driver := d.drivers[key]
	delete(d.drivers, key)
	logIt := why != "" && d.logged[key] != why
	if logIt {
		d.logged[key] = why
	}
	d.mu.Unlock()
	var old *sidecarEndpoint
	if driver != "" {
		drv, _ := d.reg.sidecarDriver(driver)
		if old = drv.sidecars.drop(key, d.now()); old != nil {
			old.conn.Close()
			pod = old.pod
			d.known.remember(context.Background(), driver, d.now(), old.pod)
		}
		d.reg.kick()
	}
	if logIt {
		d.log.Info("volplane-csi-sidecar registration not used", "lease", key, "pod", pod, "driver", driver, "reason", why)
	}
}

// netJoin is ip:port, bracketing an IPv6 address.
func netJoin(ip string, port int) string {
	return net.JoinHostPort(ip, strconv.Itoa(port))
}

// sidecarConnector dials sidecars with the provisioner's client
// certificate (read at each handshake by clientCert) and the CSI
// interceptors of a driver (interceptors, by driver name).
func sidecarConnector(clientCert func() (*tls.Certificate, error), interceptors func(driver, addr string) []grpc.UnaryClientInterceptor) func(driver, addr, hash string) (*grpc.ClientConn, error) {
	return func(driver, addr, hash string) (*grpc.ClientConn, error) {
		if clientCert == nil {
			return nil, errors.New("the provisioner has no client certificate (--tls-cert-file) to show a sidecar")
		}
		return dialSidecar(addr, pinnedTLS(clientCert, hash, time.Now), interceptors(driver, addr)...)
	}
}
