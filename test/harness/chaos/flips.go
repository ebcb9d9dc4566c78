package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Flips watches every PersistentVolume's phase through the run and counts
// the moves a correct control plane never makes: from Released or Failed
// straight back to Bound (a released volume is reclaimed, and made
// Available first if Recycle scrubbed it). The watch resumes from its
// last resourceVersion across apiserver restarts; a resume the server
// refuses (compacted) relists, and the gap is reported.
//
// The same watch records every rebind: a volume whose claimRef moves
// from one claim UID to another without being cleared in between (the
// binder's opt-in rebind of a Released volume, docs/rebind.md; nothing
// else in Kubernetes or volplane does that). A rebind's Released->Bound is
// not a flip: CheckRebinds judges it.
type Flips struct {
	mu      sync.Mutex
	phase   map[string]corev1.PersistentVolumePhase
	ref     map[string]corev1.ObjectReference // last claimRef with a UID
	flips   map[string]int
	rebinds []Rebind
	rebound map[string]bool // a rebind seen since the volume was last Bound
	gaps    int
}

// Rebind is a volume's claimRef seen moving from one claim to another.
type Rebind struct {
	// Volume is the PV's name.
	Volume string
	// From and To are the claimRefs before and after.
	From, To corev1.ObjectReference
	// Phase is the volume's phase in the last event before the move.
	Phase corev1.PersistentVolumePhase
	// Policy is the volume's own rebind annotation and HasPolicy whether
	// it has one; Class is its StorageClass.
	Policy    string
	HasPolicy bool
	Class     string
	// Reclaim is the volume's reclaim policy.
	Reclaim corev1.PersistentVolumeReclaimPolicy
	// At is when the watch saw the move.
	At time.Time
}

// WatchFlips starts watching until ctx ends.
func WatchFlips(ctx context.Context, client kubernetes.Interface) *Flips {
	f := &Flips{phase: map[string]corev1.PersistentVolumePhase{}, ref: map[string]corev1.ObjectReference{},
		flips: map[string]int{}, rebound: map[string]bool{}}
	go f.run(ctx, client)
	return f
}

func (f *Flips) run(ctx context.Context, client kubernetes.Interface) {
	rv := ""
	for ctx.Err() == nil {
		if rv == "" {
			list, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
			if err != nil {
				f.pause(ctx)
				continue
			}
			for i := range list.Items {
				f.see(&list.Items[i])
			}
			rv = list.ResourceVersion
		}
		w, err := client.CoreV1().PersistentVolumes().Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			if apierrors.IsGone(err) || apierrors.IsResourceExpired(err) {
				f.gap()
				rv = ""
			}
			f.pause(ctx)
			continue
		}
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Error:
				if st := apierrors.FromObject(ev.Object); apierrors.IsGone(st) || apierrors.IsResourceExpired(st) {
					f.gap()
					rv = ""
				}
			case watch.Deleted:
				if pv, ok := ev.Object.(*corev1.PersistentVolume); ok {
					f.mu.Lock()
					delete(f.phase, pv.Name)
					delete(f.ref, pv.Name)
					delete(f.rebound, pv.Name)
					f.mu.Unlock()
					rv = pv.ResourceVersion
				}
			default:
				if pv, ok := ev.Object.(*corev1.PersistentVolume); ok {
					if ev.Type != watch.Bookmark {
						f.see(pv)
					}
					rv = pv.ResourceVersion
				}
			}
			if rv == "" {
				break
			}
		}
		w.Stop()
	}
}

func (f *Flips) pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(200 * time.Millisecond):
	}
}

func (f *Flips) gap() {
	f.mu.Lock()
	f.gaps++
	f.mu.Unlock()
}

func (f *Flips) see(pv *corev1.PersistentVolume) {
	f.mu.Lock()
	defer f.mu.Unlock()
	prev, now := f.phase[pv.Name], pv.Status.Phase
	old, had := f.ref[pv.Name]
	switch ref := pv.Spec.ClaimRef; {
	case ref == nil || ref.UID == "":
		delete(f.ref, pv.Name)
	default:
		if had && ref.UID != old.UID {
			policy, has := pv.Annotations[annRebindReleased]
			f.rebinds = append(f.rebinds, Rebind{Volume: pv.Name, From: old, To: *ref, Phase: prev,
				Policy: policy, HasPolicy: has, Class: pv.Spec.StorageClassName, Reclaim: pv.Spec.PersistentVolumeReclaimPolicy, At: time.Now()})
			f.rebound[pv.Name] = true
		}
		f.ref[pv.Name] = *ref
	}
	if now == corev1.VolumeBound && (prev == corev1.VolumeReleased || prev == corev1.VolumeFailed) && !f.rebound[pv.Name] {
		f.flips[pv.Name]++
	}
	if now == corev1.VolumeBound {
		delete(f.rebound, pv.Name)
	}
	f.phase[pv.Name] = now
}

// Rebinds lists the rebinds seen, in order.
func (f *Flips) Rebinds() []Rebind {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.rebinds)
}

// Result lists the volumes that flipped, with their counts, and how many
// times the watch had to relist.
func (f *Flips) Result() (flipped []string, total, gaps int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for n, c := range f.flips {
		flipped = append(flipped, fmt.Sprintf("%s x%d", n, c))
		total += c
	}
	sort.Strings(flipped)
	return flipped, total, f.gaps
}
