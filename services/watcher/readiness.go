package watcher

import (
	"context"
	"io"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Readiness tuning: the API server probe runs every probeInterval; the
// watcher is NOT_SERVING once the probe has failed for apiGrace, and for
// watchErrorWindow after any informer's watch failed (a reflector retries
// with a backoff of up to 30s, so its errors repeat while the API server is
// unreachable and stop once it has listed and watched again).
const (
	probeInterval    = time.Second
	apiGrace         = 3 * time.Second
	watchErrorWindow = 10 * time.Second
)

// apiHealth tracks whether the watcher's view of the API server is current:
// the informers' watch errors and a periodic probe of /readyz.
type apiHealth struct {
	mu             sync.Mutex
	lastWatchError time.Time
	watchErr       error
	lastProbeOK    time.Time
	probeErr       error
	now            func() time.Time
}

func newAPIHealth() *apiHealth {
	return &apiHealth{now: time.Now, lastProbeOK: time.Now()}
}

// watchError is an informer's WatchErrorHandler: it records the failure
// and logs it as client-go's default handler does. An expired resource
// version or a closed watch is routine (the reflector lists again at
// once) and does not count.
func (a *apiHealth) watchError(ctx context.Context, r *cache.Reflector, err error) {
	cache.DefaultWatchErrorHandler(ctx, r, err)
	if err == io.EOF || err == io.ErrUnexpectedEOF || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lastWatchError, a.watchErr = a.now(), err
}

// probed records the outcome of one API server probe.
func (a *apiHealth) probed(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.probeErr = err
	if err == nil {
		a.lastProbeOK = a.now()
	}
}

// healthy reports whether the informers can be trusted to be current, and
// why not.
func (a *apiHealth) healthy() (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if now.Sub(a.lastProbeOK) > apiGrace {
		return false, a.probeErr
	}
	if !a.lastWatchError.IsZero() && now.Sub(a.lastWatchError) < watchErrorWindow {
		return false, a.watchErr
	}
	return true, nil
}

// probeAPI asks the API server's /readyz; a client without a REST client
// (a fake in tests) always answers.
func probeAPI(ctx context.Context, client kubernetes.Interface) error {
	rc := client.Discovery().RESTClient()
	if rc == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return rc.Get().AbsPath("/readyz").Do(ctx).Error()
}
