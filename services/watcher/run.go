package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
	startup "github.com/volplane/volplane/pkg/replica"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// Service is the watcher's name in health checks and logs.
const Service = "watcher"

// DefaultHistorySize is how many events the watcher keeps for subscribers
// that resume: at a few hundred changes per second, minutes of history.
const DefaultHistorySize = 100_000

// DefaultKubeQPS is the watcher's client-side API request limit (a fuse,
// kube.RateLimits): it only lists (in pages of 500) and watches.
const DefaultKubeQPS = 100

// Options configures the watcher.
type Options struct {
	// Kubeconfig is the kubeconfig path (--kubeconfig); empty means
	// client-go's loading rules (kube.ClientOptions.Kubeconfig).
	Kubeconfig string
	// RESTConfig, when set, is used instead of Kubeconfig (tests).
	RESTConfig *rest.Config
	// KubeQPS limits API requests per second on the client side; 0 means
	// DefaultKubeQPS, negative no limit (kube.RateLimits).
	KubeQPS float32
	// KubeBurst is the burst allowed above KubeQPS; 0 means twice KubeQPS.
	KubeBurst int
	// Listen is the gRPC listen address (host:port or unix:///path).
	Listen string
	// TLS is the replica's mutual TLS with its subscribers
	// (they present certificates of the same CA) (--tls-ca-file, --tls-cert-file,
	// --tls-key-file). Required: name the files, or set InsecurePlaintext
	// (--insecure-plaintext, local experiments only).
	TLS grpcutil.TLSFiles
	// GRPCReflection serves the gRPC reflection service
	// (--grpc-reflection); off by default.
	GRPCReflection bool
	// ResyncPeriod is the informers' resync period; 0 disables it. Resyncs
	// deliver no events (nothing changed): subscribers resync on their own.
	ResyncPeriod time.Duration
	// HistorySize is how many events are kept for resuming subscribers
	// (and how far a slow subscriber may lag before it gets a full list
	// again); 0 means DefaultHistorySize.
	HistorySize int
	// DebugAddress serves /metrics, /readyz, /livez (and /healthz, the
	// same) over HTTP, and /debug/pprof with EnablePprof; empty disables.
	DebugAddress string
	// EnablePprof serves /debug/pprof/ on DebugAddress (--enable-pprof);
	// off by default.
	EnablePprof bool
	// Logger receives the watcher's logs; default slog.Default().
	Logger *slog.Logger

	// limits and marks: zero means the defaults (tests shorten them).
	limits limits
	marks  markTiming
}

func (o *Options) validate() error {
	errs := grpcutil.ValidateListenAndTLS(o.Listen, o.TLS)
	if o.HistorySize < 0 {
		errs = append(errs, fmt.Errorf("history size must not be negative (0 means %d), got %d (--history-size)", DefaultHistorySize, o.HistorySize))
	}
	if err := kube.RateLimits(&o.KubeQPS, &o.KubeBurst, DefaultKubeQPS); err != nil {
		errs = append(errs, err)
	}
	if o.ResyncPeriod < 0 {
		errs = append(errs, fmt.Errorf("resync period must not be negative, got %s (--resync-period)", o.ResyncPeriod))
	}
	if o.HistorySize == 0 {
		o.HistorySize = DefaultHistorySize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.limits == (limits{}) {
		o.limits = defaultLimits
	}
	return errors.Join(errs...)
}

// Run runs the watcher until ctx ends, then stops gracefully: health goes
// NOT_SERVING, open streams end with Unavailable (subscribers resume from
// their cursor), and Run returns nil. Health is SERVING, for the whole
// server and for WatcherService, once the informers have synced. An error
// in the options names the flag to fix.
func Run(ctx context.Context, o Options) error {
	if err := o.validate(); err != nil {
		return fmt.Errorf("watcher options: %w", err)
	}
	return serve(ctx, o, nil, nil)
}

// serve runs the informers and the gRPC server until ctx ends, on client
// and lis when given (tests), else on those o names.
func serve(ctx context.Context, o Options, client kubernetes.Interface, lis net.Listener) error {
	r, err := startup.Start(ctx, o.config(client, lis))
	if err != nil {
		return err
	}
	defer r.Close()
	log := r.Log
	h := newHub(o.HistorySize)
	api := newAPIHealth(r.API, o.limits)
	informers, err := newInformers(r.Client, api, h, o.ResyncPeriod, log)
	if err != nil {
		return err
	}
	watcherv1.RegisterWatcherServiceServer(r.Server.Server, &server{hub: h, log: log, stopping: ctx.Done(), marks: o.marks})
	col := &collector{h: h, api: api}
	if reporting.CompareAndSwap(nil, col) {
		defer reporting.CompareAndSwap(col, nil)
	}
	// SERVING once the informers have synced and while their view is
	// current (apiHealth: every informer's watch open, none silent while
	// the API server does not answer), so that subscribers move to another
	// watcher (or know that theirs is behind). The stream itself goes on
	// either way. /readyz on the debug port says the same, check by check.
	var synced atomic.Bool
	r.Health.AddReadiness("informers", startup.Condition(synced.Load, "volumes, claims, classes and pods are not listed yet"))
	r.Health.AddReadiness("api-watches", func() error {
		if !synced.Load() {
			return nil // the informers' check says it
		}
		if ok, why := api.current(time.Now()); !ok {
			return fmt.Errorf("the view may be behind: %w", why)
		}
		return nil
	})
	tasks := []startup.Task{startup.Until(func(ctx context.Context) {
		if informers.waitForSync(ctx) {
			h.markSynced()
			synced.Store(true)
			r.Health.Recheck()
			pv, pvc, sc, pod := h.counts()
			log.Info("watcher synced", "persistent_volumes", pv, "persistent_volume_claims", pvc, "storage_classes", sc, "pods_with_claims", pod)
		}
	})}
	for _, reg := range informers {
		tasks = append(tasks, startup.Until(reg.inf.RunWithContext))
	}
	log.Info("watcher starting", "listen", r.Addr(), "history", o.HistorySize)
	return r.Run(ctx, tasks...)
}

// config is the watcher's replica: no etcd, nothing written to the API,
// and readiness judged from the informers' watches rather than from the
// API server's probe alone.
func (o *Options) config(client kubernetes.Interface, lis net.Listener) startup.Config {
	return startup.Config{
		Service: Service, RESTConfig: o.RESTConfig, Client: client, Kube: kube.ClientOptions{Kubeconfig: o.Kubeconfig, QPS: o.KubeQPS, Burst: o.KubeBurst},
		Listen: o.Listen, Listener: lis, DebugAddress: o.DebugAddress, Debug: metrics.Debug{Pprof: o.EnablePprof},
		TLS: o.TLS, Reflection: o.GRPCReflection, Log: o.Logger,
		ReadOnly: true, ProbeTimeout: o.limits.probeTimeout, OwnAPICheck: true,
		Readiness: startup.Readiness{Every: judgeInterval, Services: []string{watcherv1.WatcherService_ServiceDesc.ServiceName},
			Ready: "watcher serving: its view of the API server is current", NotReady: "watcher not serving"},
	}
}

// informer is one of the watcher's informers, the kind of its events and
// how it slims its objects.
type informer struct {
	inf       cache.SharedIndexInformer
	kind      watcherv1.Kind
	transform cache.TransformFunc
}

type informerSet []informer

// waitForSync waits until every informer has synced (true) or ctx ends.
func (s informerSet) waitForSync(ctx context.Context) bool {
	synced := make([]cache.InformerSynced, len(s))
	for i, reg := range s {
		synced[i] = reg.inf.HasSynced
	}
	return cache.WaitForCacheSync(ctx.Done(), synced...)
}

// newInformers makes the informers on volumes, claims, classes and pods,
// each feeding h. Each informer's list and watch calls and streams are
// observed by api (readiness.go): whether its watch is open is what says
// the view is current.
func newInformers(client kubernetes.Interface, api *apiHealth, h *hub, resync time.Duration, log *slog.Logger) (informerSet, error) {
	core, storage := client.CoreV1(), client.StorageV1()
	pvs := api.informer("PersistentVolume", client, &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return core.PersistentVolumes().List(ctx, opts)
		},
		WatchFuncWithContext: core.PersistentVolumes().Watch,
	}, &corev1.PersistentVolume{}, resync)
	pvcs := api.informer("PersistentVolumeClaim", client, &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return core.PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, opts)
		},
		WatchFuncWithContext: core.PersistentVolumeClaims(metav1.NamespaceAll).Watch,
	}, &corev1.PersistentVolumeClaim{}, resync)
	classes := api.informer("StorageClass", client, &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return storage.StorageClasses().List(ctx, opts)
		},
		WatchFuncWithContext: storage.StorageClasses().Watch,
	}, &storagev1.StorageClass{}, resync)
	// Pods are many and big, and only their use of claims matters: their
	// informer keeps a slim view of each (slimPod); the others keep each
	// object as its protobuf (encoded.go).
	pods := api.informer("Pod", client, &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return core.Pods(metav1.NamespaceAll).List(ctx, opts)
		},
		WatchFuncWithContext: core.Pods(metav1.NamespaceAll).Watch,
	}, &corev1.Pod{}, resync)
	set := informerSet{
		{pvs, watcherv1.Kind_KIND_PERSISTENT_VOLUME, transform},
		{pvcs, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM, transform},
		{classes, watcherv1.Kind_KIND_STORAGE_CLASS, transform},
		{pods, watcherv1.Kind_KIND_POD, slimPod},
	}
	for _, reg := range set {
		if err := reg.inf.SetTransform(reg.transform); err != nil {
			return nil, fmt.Errorf("set %v transform: %w", reg.kind, err)
		}
		if _, err := reg.inf.AddEventHandler(handler(h, reg.kind, log)); err != nil {
			return nil, fmt.Errorf("register %v handler: %w", reg.kind, err)
		}
	}
	return set, nil
}

// handler feeds one informer into the hub. Pods that use no claim are
// left out (a pod's volumes never change), and so are updates of a pod that
// leave its view as it was.
func handler(h *hub, kind watcherv1.Kind, log *slog.Logger) cache.ResourceEventHandler {
	record := func(typ watcherv1.EventType, obj any) {
		if p, ok := obj.(*podView); ok && len(p.claims) == 0 {
			return
		}
		o, ok := obj.(kube.Object)
		if !ok {
			log.Error("unexpected object from informer", "kind", kind, "type", fmt.Sprintf("%T", obj))
			return
		}
		m, err := meta.Accessor(o)
		if err != nil {
			log.Error("object without metadata", "kind", kind, "error", err)
			return
		}
		key := m.GetName()
		if ns := m.GetNamespace(); ns != "" {
			key = ns + "/" + key
		}
		h.append(typ, kind, key, o, m.GetResourceVersion())
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { record(watcherv1.EventType_EVENT_TYPE_ADDED, obj) },
		UpdateFunc: func(oldObj, newObj any) {
			if rv(oldObj) != "" && rv(oldObj) == rv(newObj) {
				return // an informer resync: nothing changed
			}
			if o, ok := oldObj.(*podView); ok {
				if n, ok := newObj.(*podView); ok && o.sameView(n) {
					return // nothing a subscriber sees changed
				}
			}
			record(watcherv1.EventType_EVENT_TYPE_UPDATED, newObj)
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			record(watcherv1.EventType_EVENT_TYPE_DELETED, obj)
		},
	}
}

func rv(obj any) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return m.GetResourceVersion()
}

var (
	_ kube.Object = (*corev1.PersistentVolume)(nil)
	_ kube.Object = (*storagev1.StorageClass)(nil)
)
