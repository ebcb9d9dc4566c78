package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/grpcutil"
	"github.com/volplane/volplane/pkg/health"
	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/metrics"
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
	// same) and /debug/pprof over HTTP; empty disables.
	DebugAddress string
	// Logger receives the watcher's logs; default slog.Default().
	Logger *slog.Logger
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
	client, err := kube.Client(o.RESTConfig, kube.ClientOptions{Kubeconfig: o.Kubeconfig, QPS: o.KubeQPS, Burst: o.KubeBurst, UserAgent: "volplane-watcher"})
	if err != nil {
		return err
	}
	lis, err := grpcutil.Listen(o.Listen)
	if err != nil {
		return err
	}
	return serve(ctx, o, client, lis)
}

// serve runs the informers and the gRPC server on lis until ctx ends.
func serve(ctx context.Context, o Options, client kubernetes.Interface, lis net.Listener) error {
	log := o.Logger
	h := newHub(o.HistorySize)
	api := newAPIHealth(client)
	factory := informers.NewSharedInformerFactoryWithOptions(client, o.ResyncPeriod,
		// Each object kept as its protobuf (encoded.go).
		informers.WithTransform(transform))
	pvs := factory.Core().V1().PersistentVolumes().Informer()
	pvcs := factory.Core().V1().PersistentVolumeClaims().Informer()
	classes := factory.Storage().V1().StorageClasses().Informer()
	// Pods are many and big, and only their use of claims matters: their
	// own informer, outside the factory (whose transform is for all its
	// informers), keeps a slim view of each (slimPod) and no index.
	pods := coreinformers.NewPodInformer(client, metav1.NamespaceAll, o.ResyncPeriod, cache.Indexers{})
	if err := pods.SetTransform(slimPod); err != nil {
		return fmt.Errorf("set pod transform: %w", err)
	}
	for _, reg := range []struct {
		inf  cache.SharedIndexInformer
		kind watcherv1.Kind
	}{
		{pvs, watcherv1.Kind_KIND_PERSISTENT_VOLUME},
		{pvcs, watcherv1.Kind_KIND_PERSISTENT_VOLUME_CLAIM},
		{classes, watcherv1.Kind_KIND_STORAGE_CLASS},
		{pods, watcherv1.Kind_KIND_POD},
	} {
		if _, err := reg.inf.AddEventHandler(handler(h, reg.kind, log)); err != nil {
			return fmt.Errorf("register %v handler: %w", reg.kind, err)
		}
		if err := reg.inf.SetWatchErrorHandlerWithContext(api.watch(reg.kind.String(), reg.inf)); err != nil {
			return fmt.Errorf("register %v watch error handler: %w", reg.kind, err)
		}
	}

	srv, err := grpcutil.NewServer(log, grpcutil.ServerOptions{TLS: o.TLS, Reflection: o.GRPCReflection})
	if err != nil {
		return err
	}
	// NOT_SERVING (not "unknown service") for probes by service name until
	// the informers have synced.
	srv.SetServing(false, watcherv1.WatcherService_ServiceDesc.ServiceName)
	watcherv1.RegisterWatcherServiceServer(srv.Server, &server{hub: h, log: log, stopping: ctx.Done()})

	col := collector{h}
	if err := metrics.Registry.Register(col); err == nil {
		defer metrics.Registry.Unregister(col)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(gctx, lis, 10*time.Second) })
	factory.Start(gctx.Done())
	defer factory.Shutdown()
	g.Go(func() error {
		pods.RunWithContext(gctx)
		return nil
	})
	log.Info("watcher starting", "listen", lis.Addr().String(), "history", o.HistorySize)
	var synced atomic.Bool
	g.Go(func() error {
		if !cache.WaitForCacheSync(gctx.Done(), pvs.HasSynced, pvcs.HasSynced, classes.HasSynced, pods.HasSynced) {
			return nil
		}
		h.markSynced()
		synced.Store(true)
		pv, pvc, sc, pod := h.counts()
		log.Info("watcher synced", "persistent_volumes", pv, "persistent_volume_claims", pvc, "storage_classes", sc, "pods_with_claims", pod)
		return nil
	})
	// SERVING once the informers have synced and while their view is
	// current: NOT_SERVING while the API server cannot be reached or a
	// watch on it fails, so that subscribers move to another watcher (or
	// know that theirs is stale). The stream itself goes on either way.
	// /readyz on the debug port says the same, check by check.
	checks := health.New()
	checks.AddReadiness("informers", func() error {
		if synced.Load() {
			return nil
		}
		return errors.New("volumes, claims, classes and pods are not listed yet")
	})
	checks.AddReadiness("api-server", func() error {
		if !synced.Load() {
			return nil // the informers' check says it
		}
		if ok, why := api.healthy(); !ok {
			if why == nil {
				why = errors.New("no answer")
			}
			return fmt.Errorf("the view may be stale: %w", why)
		}
		return nil
	})
	g.Go(func() error { return metrics.Serve(gctx, o.DebugAddress, log, checks) })
	g.Go(func() error {
		checks.Loop(gctx, probeInterval, func(ready, changed bool, results []health.Result) {
			if !changed {
				return
			}
			srv.SetServing(ready, watcherv1.WatcherService_ServiceDesc.ServiceName)
			if ready {
				log.Info("watcher serving: its view of the API server is current")
			} else {
				log.Warn("watcher not serving", "why", health.Summary(results))
			}
		})
		return nil
	})
	g.Go(func() error {
		api.probe.Run(gctx, probeInterval)
		return nil
	})
	err = g.Wait()
	log.Info("watcher stopped")
	return err
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
