package reclaimer

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/kube"
)

// watchRecyclers runs informers on the recycler pods (by label, in the
// recycler namespace) and on the Events about pods there, until ctx ends.
// A pod's every change syncs its volume again; an Event about a recycler
// pod of a reclaim this replica holds is repeated on the volume as a
// RecyclerPod Event, as kube-controller-manager does. The informers list
// and then watch, resuming from their last resourceVersion when a watch
// breaks: no polling.
func (c *controller) watchRecyclers(ctx context.Context, client kubernetes.Interface) error {
	pods := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(c.cfg.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = labelManagedBy + "=" + managedBy }))
	if _, err := pods.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.podChanged,
		UpdateFunc: func(_, obj any) { c.podChanged(obj) },
		DeleteFunc: c.podChanged,
	}); err != nil {
		return fmt.Errorf("watch recycler pods: %w", err)
	}
	events := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(c.cfg.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("involvedObject.kind", "Pod").String()
		}))
	if _, err := events.Core().V1().Events().Informer().AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if !initial {
				c.podEvent(obj)
			}
		},
	}); err != nil {
		return fmt.Errorf("watch recycler pod events: %w", err)
	}
	pods.Start(ctx.Done())
	events.Start(ctx.Done())
	defer pods.Shutdown()
	defer events.Shutdown()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for typ, ok := range pods.WaitForCacheSync(sctx.Done()) {
		if !ok && ctx.Err() == nil {
			return fmt.Errorf("the %v informer did not sync within a minute", typ)
		}
	}
	<-ctx.Done()
	return nil
}

// podChanged syncs the volume a recycler pod scrubs.
func (c *controller) podChanged(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if name := p.Annotations[annVolume]; name != "" && c.heldRecord(name) != nil {
		c.queue.Add(name)
	}
}

// podEvent repeats an Event about a recycler pod on its volume.
func (c *controller) podEvent(obj any) {
	ev, ok := obj.(*corev1.Event)
	if !ok || !strings.HasPrefix(ev.InvolvedObject.Name, recyclerPodPrefix) {
		return
	}
	name := strings.TrimPrefix(ev.InvolvedObject.Name, recyclerPodPrefix)
	r := c.heldRecord(name)
	if r == nil || r.RecyclerPodUid == "" || r.RecyclerPodUid != string(ev.InvolvedObject.UID) {
		return
	}
	c.log.Info("recycler pod event", "volume", name, "pod", r.RecyclerPod, "type", ev.Type, "reason", ev.Reason, "message", ev.Message)
	typ := ev.Type
	if typ != corev1.EventTypeWarning {
		typ = corev1.EventTypeNormal
	}
	c.recorder.Eventf(volumeRef(r), typ, kube.EventRecyclerPod, "Recycler pod: %s", ev.Message)
}
