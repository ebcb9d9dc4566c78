package watcher

import (
	"context"
	"io"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/volplane/volplane/pkg/kube"
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
	probe          *kube.APIProbe
	mu             sync.Mutex
	lastWatchError time.Time
	watchErr       error
}

func newAPIHealth(client kubernetes.Interface) *apiHealth {
	return &apiHealth{probe: kube.NewAPIProbe(client)}
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
	a.lastWatchError, a.watchErr = time.Now(), err
}

// healthy reports whether the informers can be trusted to be current, and
// why not.
func (a *apiHealth) healthy() (bool, error) {
	if ok, err := a.probe.Healthy(apiGrace); !ok {
		return false, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.lastWatchError.IsZero() && time.Since(a.lastWatchError) < watchErrorWindow {
		return false, a.watchErr
	}
	return true, nil
}
