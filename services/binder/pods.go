package binder

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/volplane/volplane/pkg/kube"
	watcherv1 "github.com/volplane/volplane/proto/volplane/watcher/v1"
)

// waitEvent is the event for an unbound WaitForFirstConsumer claim that
// no node was selected for, as kube-controller-manager's PV controller
// gives it (emitEventForUnboundDelayBindingClaim): WaitForPodScheduled
// while pods (names) that use the claim are neither scheduled nor
// terminated (findNonScheduledPodsByPVC), naming them; otherwise
// WaitForFirstConsumer. kube-controller-manager lists several pods in its
// pod index's order, which is random; they are sorted here.
func waitEvent(pods []string) (reason, message string) {
	switch len(pods) {
	case 0:
		return kube.EventWaitForFirstConsumer, "waiting for first consumer to be created before binding"
	case 1:
		return kube.EventWaitForPodScheduled, fmt.Sprintf("waiting for pod %s to be scheduled", pods[0])
	}
	return kube.EventWaitForPodScheduled, fmt.Sprintf("waiting for pods %s to be scheduled", strings.Join(pods, ","))
}

// podIndex is the binder's view of the pods that use claims, fed by the
// watcher's KIND_POD events: which pods wait, unscheduled, for a claim. It
// keeps a resourceVersion per pod (so that a full list from a lagging
// watcher never moves a pod back in time) and the claims of the pods that
// wait, nothing else: about a hundred bytes per pod.
type podIndex struct {
	mu sync.RWMutex
	// pods: every pod that uses claims, by "namespace/name".
	pods map[string]podEntry
	// waiting: by claim key, the names of the pods that use the claim and
	// are neither scheduled nor terminated (a slice: rarely more than one).
	waiting map[string][]string
}

type podEntry struct {
	rv string
	// claims are the claim names of a waiting pod; nil for the others.
	claims []string
}

func newPodIndex() *podIndex {
	return &podIndex{pods: map[string]podEntry{}, waiting: map[string][]string{}}
}

// put records a pod's view at resourceVersion rv (a pod's UID is not kept:
// a pod created again under the same name has a newer resourceVersion).
// It returns the keys of the claims whose waiting pods changed. An older
// version than the one held is ignored.
func (x *podIndex) put(key string, p *watcherv1.Pod, rv string) []string {
	var claims []string
	if p.GetNodeName() == "" && !p.GetTerminated() {
		claims = p.GetClaimNames()
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	old, known := x.pods[key]
	if known && !notOlder(rv, old.rv) {
		return nil
	}
	x.pods[key] = podEntry{rv: rv, claims: claims}
	if slices.Equal(old.claims, claims) {
		return nil
	}
	ns := p.GetNamespace()
	x.unindex(ns, p.GetName(), old.claims)
	for _, cl := range claims {
		k := ns + "/" + cl
		if !slices.Contains(x.waiting[k], p.GetName()) {
			x.waiting[k] = append(x.waiting[k], p.GetName())
		}
	}
	return claimKeys(ns, old.claims, claims)
}

// remove forgets a pod and returns the keys of the claims it was waiting
// for.
func (x *podIndex) remove(key string) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	old, known := x.pods[key]
	if !known {
		return nil
	}
	delete(x.pods, key)
	ns, name, _ := strings.Cut(key, "/")
	x.unindex(ns, name, old.claims)
	return claimKeys(ns, old.claims, nil)
}

func (x *podIndex) unindex(ns, name string, claims []string) {
	for _, cl := range claims {
		k := ns + "/" + cl
		names := slices.DeleteFunc(x.waiting[k], func(n string) bool { return n == name })
		if len(names) == 0 {
			delete(x.waiting, k)
		} else {
			x.waiting[k] = names
		}
	}
}

// claimKeys lists the claims of a and b (names in ns) as keys, each once.
func claimKeys(ns string, a, b []string) []string {
	keys := make([]string, 0, len(a)+len(b))
	for _, cl := range slices.Concat(a, b) {
		if k := ns + "/" + cl; !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// unscheduled lists, sorted, the names of the pods waiting for a claim.
func (x *podIndex) unscheduled(claimKey string) []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	names := slices.Clone(x.waiting[claimKey])
	slices.Sort(names)
	return names
}

// keys lists every pod known.
func (x *podIndex) keys() []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]string, 0, len(x.pods))
	for k := range x.pods {
		out = append(out, k)
	}
	return out
}

// queueWaitingClaims queues those of the claims that are still unbound.
func (c *caches) queueWaitingClaims(keys []string) {
	for _, k := range keys {
		cl := c.store.claim(k)
		if cl == nil || cl.Spec.VolumeName != "" {
			continue
		}
		if _, done := cl.Annotations[kube.AnnBindCompleted]; done {
			continue
		}
		c.claimQueue.add(k)
	}
}
