package chaos

import (
	"context"
	"fmt"
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
type Flips struct {
	mu    sync.Mutex
	phase map[string]corev1.PersistentVolumePhase
	flips map[string]int
	gaps  int
}

// WatchFlips starts watching until ctx ends.
func WatchFlips(ctx context.Context, client kubernetes.Interface) *Flips {
	f := &Flips{phase: map[string]corev1.PersistentVolumePhase{}, flips: map[string]int{}}
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
	if now == corev1.VolumeBound && (prev == corev1.VolumeReleased || prev == corev1.VolumeFailed) {
		f.flips[pv.Name]++
	}
	f.phase[pv.Name] = now
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
