package provisioner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/replica"
	"github.com/volplane/volplane/pkg/watchclient"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
	"github.com/volplane/volplane/services/provisioner/capacity"
	"github.com/volplane/volplane/services/provisioner/orphans"
)

// Service is the provisioner's name in etcd membership.
const Service = "provisioner"

// Defaults of Options.
const (
	DefaultVolumeNamePrefix = "pvc"
	DefaultFSType           = ""
	DefaultTimeout          = 30 * time.Second
	DefaultRecoveryPeriod   = 10 * time.Second
	DefaultProbePeriod      = 30 * time.Second
)

// Options configures a provisioner replica.
type Options struct {
	// Options are the flags every replica shares (--kubeconfig, --listen,
	// --etcd-endpoints, the TLS files, ...).
	replica.Options

	// CSIEndpoints are the CSI drivers' gRPC addresses (unix:///path or
	// host:port), each optionally as provisioner-name=endpoint to serve
	// StorageClasses of that provisioner name; by default a driver serves
	// the name it reports in GetPluginInfo. At least one is required. CSI
	// is plaintext, as between every CSI driver and its sidecars: use unix
	// sockets. Optional with DiscoverSidecars.
	CSIEndpoints []string
	// DiscoverSidecars finds, at run time, the CSI drivers served by
	// volplane-csi-sidecars in the drivers' own pods (pkg/sidecar;
	// discovery.go): --discover-sidecars. Off by default in the flag; on
	// in the shipped manifests. It needs the TLS files (the sidecars
	// accept only the provisioner's client certificate).
	DiscoverSidecars bool
	// Namespace is the provisioner's own namespace, where it publishes
	// its CA bundle for the sidecars (ConfigMap sidecar.CAConfigMap) with
	// DiscoverSidecars: --namespace, default $POD_NAMESPACE, else
	// DefaultNamespace.
	Namespace string
	// VolumeNamePrefix names provisioned PVs <prefix>-<claim UID>.
	VolumeNamePrefix string
	// DefaultFSType is the filesystem of volumes whose class sets no
	// csi.storage.k8s.io/fstype; "" leaves it to the driver.
	DefaultFSType string
	// StrictTopology, as external-provisioner's --strict-topology: a
	// claim with a selected node asks only for that node's segment;
	// without it every segment of the driver's nodes is allowed, the
	// selected node's preferred.
	StrictTopology bool
	// ExtraCreateMetadata passes the claim's name and namespace and the PV
	// name to CreateVolume as csi.storage.k8s.io/pvc/name,
	// csi.storage.k8s.io/pvc/namespace and csi.storage.k8s.io/pv/name.
	ExtraCreateMetadata bool
	// Timeout bounds each CSI call; a call that runs out is retried with
	// the same volume name.
	Timeout time.Duration
	// RecoveryPeriod is how often the journal is scanned for operations to
	// finish or undo (this replica's that wait for a retry, and those of
	// replicas that died).
	RecoveryPeriod time.Duration
	// ProbePeriod is how often the drivers are probed.
	ProbePeriod time.Duration
	// Capacity configures storage capacity tracking (package capacity).
	Capacity capacity.Options
	// OrphanScanPeriod is how often the orphan report is made to refresh
	// volplane_provisioner_orphans (package orphans); default
	// orphans.DefaultScanPeriod, negative never (only ListOrphans does).
	OrphanScanPeriod time.Duration
	// AllowVolumeModeConversion lets a claim restored from a
	// VolumeSnapshot have another volume mode than the snapshot's source
	// volume without the VolumeSnapshotContent's
	// snapshot.storage.kubernetes.io/allow-volume-mode-change annotation:
	// --prevent-volume-mode-conversion=false (external-provisioner's flag,
	// true by default there and here; the zero Options checks).
	AllowVolumeModeConversion bool
	// VolumeNameUUIDLength, as external-provisioner's
	// --volume-name-uuid-length: PVs are named <prefix>-<the claim's UID
	// without dashes, cut to this length>; -1 or 0 (the zero Options): the
	// whole UID, dashes kept. Otherwise 1 to 32.
	VolumeNameUUIDLength int
	// NoImmediateTopology is external-provisioner's
	// --immediate-topology=false: a claim without a selected node, of a
	// class without allowedTopologies, is sent no accessibility
	// requirements (the zero Options sends every segment of the driver,
	// as upstream's default).
	NoImmediateTopology bool
	// ControllerPublishReadOnly, as external-provisioner's
	// --controller-publish-readonly: the PV of a claim whose only access
	// mode is ReadOnlyMany gets spec.csi.readOnly.
	ControllerPublishReadOnly bool
	// FeatureGates are external-provisioner's gates (--feature-gates;
	// featuregates.go): Topology, VolumeAttributesClass and
	// CrossNamespaceVolumeDataSource change what it does.
	FeatureGates FeatureGates
	// SnapshotOrphanSweepInterval is how often the snapshot-as-source
	// finalizers that no restore needs any more are removed
	// (snapshotprotection.go), as external-provisioner's
	// --snapshot-orphan-sweep-interval; 0 disables the sweep, as there
	// (the flag defaults to DefaultSnapshotOrphanSweepInterval).
	SnapshotOrphanSweepInterval time.Duration
	// WatcherAddress is the gRPC address of the watcher service, or of
	// several watcher replicas, comma-separated. When set, the claim and
	// StorageClass cache (cache.go) is fed by the watcher's stream (one
	// replica at a time, failing over; stream.go) instead of the
	// provisioner's own watches on the API server; empty: by its own
	// informers (informers.go).
	WatcherAddress string
	// StaleAfter is how long the cache the stream feeds may go without a
	// live, caught-up watcher stream before it is not trusted: no hint is
	// taken from it and DeleteVolume's guard lists claims from the API
	// server; 0 means DefaultStaleAfter, and with WatcherAddress anything
	// below watchclient.MinStaleAfter is refused.
	StaleAfter time.Duration
	// Standalone runs the provisioner without volplane's binder, beside
	// kube-controller-manager's (a managed cluster): it provisions by
	// itself every claim annotated for one of its drivers, as
	// external-provisioner does (standalone.go), and
	// kube-controller-manager binds the PVs it makes.
	Standalone bool
	// StandaloneWorkers is the number of claims provisioned at once in
	// standalone mode (external-provisioner's --worker-threads); 0 means
	// DefaultStandaloneWorkers.
	StandaloneWorkers int
	// RetryIntervalStart is how long a claim whose attempt did not finish
	// waits, in standalone mode, before the next; the wait doubles with
	// each further failure up to RetryIntervalMax (external-provisioner's
	// --retry-interval-start and --retry-interval-max); 0 means the
	// defaults.
	RetryIntervalStart, RetryIntervalMax time.Duration
}

// etcdUse is what the provisioner keeps in etcd besides membership.
const etcdUse = "the operation journal"

func (o *Options) validate() error {
	var errs []error
	errs = append(errs, o.Options.Validate(etcdUse)...)
	errs = append(errs, o.validateDiscovery()...)
	seen, listed := map[string]bool{}, map[string]bool{}
	for _, e := range o.CSIEndpoints {
		e = strings.TrimSpace(e)
		name, ep := parseEndpoint(e)
		switch {
		case ep == "":
			errs = append(errs, fmt.Errorf("CSI endpoint %q has no address (--csi-endpoint [provisioner-name=]unix:///path or host:port)", e))
		case listed[e]:
			errs = append(errs, fmt.Errorf("CSI endpoint %q is listed twice (--csi-endpoint): one driver served twice under one name", e))
		case name != "" && seen[name]:
			errs = append(errs, fmt.Errorf("provisioner name %q is mapped to two CSI endpoints (--csi-endpoint)", name))
		default:
			if err := checkCSIAddress(ep); err != nil {
				errs = append(errs, err)
			}
		}
		seen[name] = name != ""
		listed[e] = true
	}
	if o.VolumeNamePrefix == "" {
		o.VolumeNamePrefix = DefaultVolumeNamePrefix
	} else if strings.ContainsAny(o.VolumeNamePrefix, "/ ") || strings.ToLower(o.VolumeNamePrefix) != o.VolumeNamePrefix {
		errs = append(errs, fmt.Errorf("volume name prefix %q must be lower case with no '/' or spaces (--volume-name-prefix)", o.VolumeNamePrefix))
	}
	for _, d := range []struct {
		v    *time.Duration
		def  time.Duration
		flag string
	}{{&o.Timeout, DefaultTimeout, "--timeout"}, {&o.RecoveryPeriod, DefaultRecoveryPeriod, "--recovery-period"}, {&o.ProbePeriod, DefaultProbePeriod, "--probe-period"}} {
		switch {
		case *d.v < 0:
			errs = append(errs, fmt.Errorf("%s must not be negative, got %s", d.flag, *d.v))
		case *d.v == 0:
			*d.v = d.def
		}
	}
	errs = append(errs, o.validateStandalone()...)
	errs = append(errs, o.validateFlags()...)
	if o.SnapshotOrphanSweepInterval < 0 {
		errs = append(errs, fmt.Errorf("--snapshot-orphan-sweep-interval must not be negative, got %s", o.SnapshotOrphanSweepInterval))
	}
	if err := o.Capacity.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.OrphanScanPeriod == 0 {
		o.OrphanScanPeriod = orphans.DefaultScanPeriod
	}
	switch {
	case o.StaleAfter < 0:
		errs = append(errs, fmt.Errorf("stale-after must not be negative, got %s (--watcher-stale-after)", o.StaleAfter))
	case o.StaleAfter == 0:
		o.StaleAfter = DefaultStaleAfter
	case o.WatcherAddress != "" && o.StaleAfter < watchclient.MinStaleAfter:
		errs = append(errs, fmt.Errorf("--watcher-stale-after must be at least %s (twice the watcher probe interval: a current stream is that old between probes), got %s", watchclient.MinStaleAfter, o.StaleAfter))
	}
	return errors.Join(errs...)
}

// checkCSIAddress refuses a CSI endpoint that names neither a unix socket
// (unix:///path, or unix:path) nor host:port: gRPC would take it for
// something else and never connect.
func checkCSIAddress(ep string) error {
	if path, ok := strings.CutPrefix(ep, "unix:"); ok {
		if strings.TrimPrefix(path, "//") == "" {
			return fmt.Errorf("CSI endpoint %q names no socket (--csi-endpoint unix:///path/csi.sock)", ep)
		}
		return nil
	}
	if _, port, err := net.SplitHostPort(ep); err != nil || port == "" {
		hint := ""
		if strings.HasPrefix(ep, "/") {
			hint = fmt.Sprintf(": a socket is unix://%s", ep)
		}
		return fmt.Errorf("CSI endpoint %q is neither unix:///path nor host:port (--csi-endpoint)%s", ep, hint)
	}
	return nil
}

// Run runs a provisioner replica until ctx ends. The etcd session is kept
// through outages: while there is none the journal refuses every fenced
// write (no CreateVolume starts), no DeleteVolume is made (runDelete asks
// the session), and the replica is NOT_SERVING; Run goes on.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("provisioner options: %w", err)
	}
	cfg := o.Config(Service)
	cfg.Readiness = replica.Readiness{Every: time.Second, Services: []string{provisionerv1.ProvisionerService_ServiceDesc.ServiceName}}
	r, err := replica.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer r.Close()
	factory := informers.NewSharedInformerFactory(r.Client, 0)
	nodes := listers{factory.Core().V1().Nodes().Lister(), factory.Storage().V1().CSINodes().Lister()}
	objs := newObjectCache()
	feed, err := newFeeder(objs, o, factory, r.Log)
	if err != nil {
		return err
	}
	reg, capc, closeDrivers, err := newDrivers(r, o, factory, nodes, objs.classes)
	defer closeDrivers()
	if err != nil {
		return err
	}
	var discoveryTasks []replica.Task
	if o.DiscoverSidecars {
		if discoveryTasks, err = sidecarTasks(r, o, reg, capc); err != nil {
			return err
		}
	}
	objs.onClass = capc.EnqueueAll
	p, err := newProvisionerOf(r, o, reg, nodes)
	if err != nil {
		return err
	}
	p.timeline = r.Timeline
	api := newServer(p, objs)
	api.capacity = capc
	provisionerv1.RegisterProvisionerServiceServer(r.Server.Server, api)
	clones := newCloneProtection(r.Log, r.Client, corelisters.NewPersistentVolumeClaimLister(objs.claims))
	objs.onClaim = clones.claimChanged
	var standaloneVolumes cache.SharedIndexInformer
	if o.Standalone {
		if standaloneVolumes, err = volumeInformer(factory); err != nil {
			return err
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	// Serving once the informers have synced and every driver is ready (and
	// the replica's checks pass). The claim and class cache is not waited
	// for: until it is current, claims and classes are read from the API.
	var informersSynced atomic.Bool
	r.Health.AddReadiness("informers", replica.Condition(informersSynced.Load, "nodes and CSINodes (and, without a watcher, claims and classes) are not listed yet"))
	r.Health.AddReadiness("csi-drivers", reg.check)
	r.Log.Info("provisioner starting", "feature_gates", o.FeatureGates.String(), "member", o.MemberID, "listen", r.Addr(), "csi_endpoints", o.CSIEndpoints,
		"discover_sidecars", o.DiscoverSidecars, "watcher", o.WatcherAddress, "standalone", o.Standalone)
	parts := runParts{factory: factory, reg: reg, capc: capc, p: p, api: api, objs: objs, feed: feed, clones: clones,
		informersSynced: &informersSynced, standaloneVolumes: standaloneVolumes, discovery: discoveryTasks}
	return r.Run(ctx, parts.tasks(r, o)...)
}

// runParts are the parts of a provisioner replica that run as tasks.
type runParts struct {
	factory           informers.SharedInformerFactory
	reg               *registry
	capc              *capacity.Controller
	p                 *provisioner
	api               *server
	objs              *objectCache
	feed              feeder
	clones            *cloneProtection
	informersSynced   *atomic.Bool
	standaloneVolumes cache.SharedIndexInformer
	discovery         []replica.Task
}

// tasks are the loops of a replica, each restarted until the replica
// stops (replica.Until): probes, informers, recovery, clone protection,
// capacity, orphans, the claim feed, and as configured sidecar discovery,
// standalone mode and the snapshot sweep.
func (x runParts) tasks(r *replica.Replica, o Options) []func(context.Context) error {
	reg, p, objs, factory := x.reg, x.p, x.objs, x.factory
	tasks := []func(context.Context) error{
		replica.Until(func(ctx context.Context) { reg.probeLoop(ctx, o.ProbePeriod) }),
		replica.Until(func(ctx context.Context) { x.informersSynced.Store(allSynced(factory.WaitForCacheSync(ctx.Done()))) }),
		replica.Until(func(ctx context.Context) { p.recoveryLoop(ctx, o.RecoveryPeriod, reg.probed) }),
		func(ctx context.Context) error {
			return x.clones.run(ctx, objs.hasSynced, objs.current, o.RecoveryPeriod)
		},
		replica.Until(func(ctx context.Context) {
			x.capc.Run(ctx, reg.probed, func() bool { return cache.WaitForCacheSync(ctx.Done(), objs.hasSynced) })
		}),
		replica.Until(func(ctx context.Context) { x.api.orphans.Loop(ctx, o.OrphanScanPeriod, reg.probed) }),
		x.feed.run,
		replica.Until(func(ctx context.Context) { objs.report(ctx, r.Log, x.feed) }),
	}
	tasks = append(tasks, x.discovery...)
	if o.Standalone {
		tasks = append(tasks, standaloneTask(r.Log, o, p, objs, x.standaloneVolumes, x.clones.claimChanged))
	}
	if o.SnapshotOrphanSweepInterval > 0 {
		sweeper := &snapshotSweeper{log: r.Log, client: r.Client, dynamic: p.sources.dynamic, claims: corelisters.NewPersistentVolumeClaimLister(objs.claims)}
		tasks = append(tasks, replica.Until(func(ctx context.Context) {
			sweeper.run(ctx, objs.hasSynced, objs.current, o.SnapshotOrphanSweepInterval)
		}))
	}
	return tasks
}

// newDrivers is the registry of the CSI drivers of o, dialed, and the
// capacity controller (nil when disabled) their volume changes are told
// to; call closeDrivers when done, whatever the error.
func newDrivers(r *replica.Replica, o Options, factory informers.SharedInformerFactory, nodes listers, classes cache.Indexer) (
	reg *registry, capc *capacity.Controller, closeDrivers func(), err error) {
	reg = newRegistry(r.Log)
	reg.gates, reg.allowModeConversion = o.FeatureGates, o.AllowVolumeModeConversion
	capc = capacity.New(o.Capacity, capacity.Config{Log: r.Log, Member: o.MemberID, Elect: r.Coord, Client: r.Client,
		Drivers: capacityDrivers{reg: reg, nodes: nodes}, Factory: factory,
		Classes: storagelisters.NewStorageClassLister(classes), Timeout: o.Timeout})
	closeDrivers, err = dialDrivers(reg, o.CSIEndpoints, r.Log, capc.OnVolumeChange)
	return reg, capc, closeDrivers, err
}

// allSynced reports whether every informer of a WaitForCacheSync synced
// (false when its wait was cut short).
func allSynced[K comparable](synced map[K]bool) bool {
	for _, ok := range synced {
		if !ok {
			return false
		}
	}
	return true
}

// dialDrivers adds to reg a driver for each CSI endpoint, its calls logged,
// measured and reported to onChange (capacity); call closeAll when done,
// whatever the error.
func dialDrivers(reg *registry, endpoints []string, log *slog.Logger, onChange func(func() string) grpc.UnaryClientInterceptor) (closeAll func(), err error) {
	var conns []*grpc.ClientConn
	closeAll = func() {
		for i := len(conns) - 1; i >= 0; i-- {
			conns[i].Close()
		}
	}
	for _, e := range endpoints {
		name, ep := parseEndpoint(strings.TrimSpace(e))
		var d *driver
		dname := func() string {
			if d == nil {
				return ""
			}
			return d.name()
		}
		cm := newCSIMetrics()
		cc, err := grpcutil.DialCSI(ep, grpc.WithChainUnaryInterceptor(csiLogger(log, ep),
			connection.ExtendedCSIMetricsManager{CSIMetricsManager: cm}.RecordMetricsClientInterceptor, onChange(dname)))
		if err != nil {
			return closeAll, fmt.Errorf("CSI endpoint %s: %w", ep, err)
		}
		conns = append(conns, cc)
		d = newDriver(ep, name, cc)
		d.metrics = cm
		reg.add(d)
	}
	return closeAll, nil
}

// newProvisionerOf is the provisioner of replica r.
func newProvisionerOf(r *replica.Replica, o Options, reg *registry, nodes listers) (*provisioner, error) {
	dyn, err := dynamic.NewForConfig(r.RESTConfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	return &provisioner{
		log: r.Log, member: o.MemberID, client: r.Client, journal: r.Coord, session: r.Coord.Ready, drivers: reg,
		nodes: nodes,
		sources: sources{client: r.Client, dynamic: dyn, crossNamespace: o.FeatureGates.Enabled(GateCrossNamespaceVolumeDataSource),
			allowModeConversion: o.AllowVolumeModeConversion},
		events: recorders(r.Events),
		prefix: o.VolumeNamePrefix, defaultFSType: o.DefaultFSType, strictTopology: o.StrictTopology, extraMetadata: o.ExtraCreateMetadata,
		flags:   flagsOf(o),
		timeout: o.Timeout, now: time.Now, inflight: map[string]bool{}, instance: newInstance(time.Now()),
	}, nil
}

// recoveryLoop, once every driver has been probed, finishes or undoes the
// journal's operations (recoverAll) every period until ctx ends.
func (p *provisioner) recoveryLoop(ctx context.Context, period time.Duration, probed <-chan struct{}) {
	select {
	case <-probed:
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		p.recoverAll(ctx)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// newFeeder is what fills the claim and class cache c: the watchers'
// stream when o names watchers (the caller runs it), else claim and
// StorageClass informers added to factory (which the caller starts).
func newFeeder(c *objectCache, o Options, factory informers.SharedInformerFactory, log *slog.Logger) (feeder, error) {
	if watchers := watchclient.Addresses(o.WatcherAddress); len(watchers) > 0 {
		return newStreamFeed(c, watchers, o.TLS, log, o.StaleAfter), nil
	}
	return newInformerFeed(c, factory)
}

// listers answer topology questions from the informers' caches.
type listers struct {
	nodes    corelisters.NodeLister
	csiNodes storagelisters.CSINodeLister
}

var _ nodes = listers{}

func (l listers) Node(name string) (*corev1.Node, error) { return l.nodes.Get(name) }
func (l listers) CSINode(name string) (*storagev1.CSINode, error) {
	return l.csiNodes.Get(name)
}
func (l listers) CSINodes() ([]*storagev1.CSINode, error) {
	return l.csiNodes.List(labels.Everything())
}
func (l listers) Nodes() ([]*corev1.Node, error) { return l.nodes.List(labels.Everything()) }

// recorders gives each provisioner name its own event source, as
// external-provisioner's library's events carry the driver's name; the
// empty name is external-provisioner's own recorder (upstreamRecorder).
func recorders(b record.EventBroadcaster) func(string) record.EventRecorder {
	var mu sync.Mutex
	m := map[string]record.EventRecorder{}
	return func(name string) record.EventRecorder {
		mu.Lock()
		defer mu.Unlock()
		r, ok := m[name]
		if !ok {
			component := eventComponent(name)
			if name == upstreamRecorder {
				component = "external-provisioner"
			}
			r = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})
			m[name] = r
		}
		return r
	}
}

// upstreamRecorder names, for events, external-provisioner's own
// recorder, whose source is "external-provisioner" (pkg/controller's
// NewCSIProvisioner) rather than the library's "<provisioner>_<host>_<uuid>":
// the one event v6.3.0 records with it is the populator's.
const upstreamRecorder = ""

// instanceID tells this process's events from another's on the same host.
var instanceID = string(uuid.NewUUID())

// eventComponent is the source component of a provisioner's events, as
// sig-storage-lib-external-provisioner names it:
// "<provisioner>_<hostname>_<uuid>".
func eventComponent(provisioner string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return provisioner + "_" + host + "_" + instanceID
}
