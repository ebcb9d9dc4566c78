package watcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/kube"
)

// Readiness tuning. The API server probe runs every probeInterval; the
// watcher is NOT_SERVING once it has failed for apiGrace. An informer whose
// watch failed (or that was running while the probe failed) counts as
// stale until it shows progress (its last synced resourceVersion moves), or
// until staleLimit has passed since the failure and since the API server
// answered again: a reflector retries with a backoff of up to 30s, so after
// an outage it may take that long to watch again, and a quiet resource
// moves its resourceVersion only with the next event or bookmark.
const (
	probeInterval = time.Second
	apiGrace      = 3 * time.Second
	staleLimit    = 35 * time.Second
)

// apiHealth tracks whether the watcher's view of the API server is current:
// the informers' watch errors and progress, and a periodic probe of
// /readyz.
type apiHealth struct {
	probe     *kube.APIProbe
	mu        sync.Mutex
	informers map[string]*informerHealth
	probeOK   bool      // the probe's last verdict
	answered  time.Time // when the probe last went from failing to answering
}

// informerHealth is one informer's state since its last failure.
type informerHealth struct {
	inf    cache.SharedIndexInformer
	failed time.Time // zero: not failed
	rv     string    // its last synced resourceVersion at the failure
	err    error
}

func newAPIHealth(client kubernetes.Interface) *apiHealth {
	return &apiHealth{probe: kube.NewAPIProbe(client), informers: map[string]*informerHealth{}, probeOK: true}
}

// watch registers inf under name and returns its WatchErrorHandler: it
// records the failure and logs it as client-go's default handler does. An
// expired resource version or a closed watch is routine (the reflector
// lists again at once) and does not count.
func (a *apiHealth) watch(name string, inf cache.SharedIndexInformer) cache.WatchErrorHandlerWithContext {
	a.mu.Lock()
	a.informers[name] = &informerHealth{inf: inf}
	a.mu.Unlock()
	return func(ctx context.Context, r *cache.Reflector, err error) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.informers[name].fail(err)
	}
}

func (h *informerHealth) fail(err error) {
	h.failed, h.rv, h.err = time.Now(), h.inf.LastSyncResourceVersion(), err
}

// healthy reports whether the informers can be trusted to be current, and
// why not.
func (a *apiHealth) healthy() (bool, error) {
	ok, probeErr := a.probe.Healthy(apiGrace)
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if !ok {
		// Every informer missed what happened meanwhile, watch error or not.
		for _, h := range a.informers {
			if h.failed.IsZero() {
				h.fail(fmt.Errorf("the API server does not answer: %w", probeErr))
			}
		}
		a.probeOK = false
		return false, probeErr
	}
	if !a.probeOK {
		a.probeOK, a.answered = true, now
	}
	for name, h := range a.informers {
		switch {
		case h.failed.IsZero():
		case h.inf.LastSyncResourceVersion() != h.rv,
			now.Sub(h.failed) > staleLimit && now.Sub(a.answered) > staleLimit:
			h.failed, h.err = time.Time{}, nil
		default:
			return false, fmt.Errorf("%s informer: %w", name, h.err)
		}
	}
	return true, nil
}
