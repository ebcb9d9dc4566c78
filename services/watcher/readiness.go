package watcher

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8swatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"

	"github.com/volplane/volplane/pkg/kube"
)

// Readiness tuning; the package documentation ("Readiness") says what
// they mean together.
const (
	// judgeInterval is how often readiness is judged (and the API server
	// probed).
	judgeInterval = time.Second
	// rewatchGrace is how long an informer may go without an open watch
	// on the API server: a reflector opens the next watch at once when one
	// ends (every 5 to 10 minutes, or after a "too old" resourceVersion),
	// which against a slow API server takes as long as a request. While
	// the API server is down or refuses the watch, the gap grows.
	rewatchGrace = 10 * time.Second
	// silenceLimit is how long an open watch may deliver nothing, not
	// even a bookmark (the API server sends one about every minute on
	// every watch), before it counts as dead, if the API server does not
	// answer the probe either.
	silenceLimit = 90 * time.Second
	// probeGrace is how long the probe must have been failing (each
	// request allowed kube.DefaultProbeTimeout) to count as failing.
	probeGrace = 3 * time.Second
)

// limits are the readiness tuning; tests shorten them.
type limits struct {
	rewatch, silence, probeGrace time.Duration
	// probeTimeout bounds one probe request (kube.APIProbe.Timeout).
	probeTimeout time.Duration
}

var defaultLimits = limits{rewatch: rewatchGrace, silence: silenceLimit, probeGrace: probeGrace, probeTimeout: kube.DefaultProbeTimeout}

// apiProbe is what readiness needs of kube.APIProbe (which the replica
// runs).
type apiProbe interface {
	Healthy(grace time.Duration) (bool, error)
}

var _ apiProbe = (*kube.APIProbe)(nil)

// apiHealth judges whether the watcher's view of the API server is
// current, from the state of each informer's watch (watchState) and, for
// a watch that has gone silent, a periodic probe of /readyz. The probe on
// its own changes nothing: a slow API server is slow, and its watches say
// whether they still deliver.
type apiHealth struct {
	probe   apiProbe
	limits  limits
	mu      sync.Mutex
	watches map[string]*watchState
}

func newAPIHealth(p apiProbe, l limits) *apiHealth {
	return &apiHealth{probe: p, limits: l, watches: map[string]*watchState{}}
}

// informer returns an informer of obj over lw whose list and watch calls
// and watch streams are observed under name.
func (a *apiHealth) informer(name string, client kubernetes.Interface, lw *cache.ListWatch, obj runtime.Object, resync time.Duration) cache.SharedIndexInformer {
	st := &watchState{name: name, closed: time.Now()}
	a.mu.Lock()
	a.watches[name] = st
	a.mu.Unlock()
	observed := &observedListWatch{lw: lw, st: st, noWatchList: watchlist.DoesClientNotSupportWatchListSemantics(client)}
	return cache.NewSharedIndexInformerWithOptions(observed, obj, cache.SharedIndexInformerOptions{ResyncPeriod: resync, Indexers: cache.Indexers{}})
}

// current reports whether the informers' view is current at now, and why
// not: every informer holds an open watch (or has been without one for no
// longer than limits.rewatch), and no open watch has been silent for
// longer than limits.silence while the probe fails.
func (a *apiHealth) current(now time.Time) (bool, error) {
	probeOK, probeErr := a.probe.Healthy(a.limits.probeGrace)
	a.mu.Lock()
	names := make([]string, 0, len(a.watches))
	for n := range a.watches {
		names = append(names, n)
	}
	a.mu.Unlock()
	sort.Strings(names)
	for _, n := range names {
		a.mu.Lock()
		w := a.watches[n]
		a.mu.Unlock()
		s := w.get()
		switch {
		case s.open == 0 && now.Sub(s.closed) > a.limits.rewatch:
			why := fmt.Errorf("%s informer: no watch open on the API server for %s", n, now.Sub(s.closed).Round(time.Second))
			if s.err != nil {
				why = fmt.Errorf("%w (last error: %w)", why, s.err)
			}
			return false, why
		case s.open > 0 && !probeOK && now.Sub(s.heard) > a.limits.silence:
			return false, fmt.Errorf("%s informer: its watch has delivered nothing, not even a bookmark, for %s, and the API server does not answer: %w",
				n, now.Sub(s.heard).Round(time.Second), probeErr)
		}
	}
	return true, nil
}

// watchState is one informer's connection to the API server as its
// ListerWatcher sees it: how many watches are open (0 or 1), since when
// none is, when it last heard from the API server, and the last error.
type watchState struct {
	name   string
	mu     sync.Mutex
	open   int
	closed time.Time // while open == 0: since when no watch is open
	heard  time.Time // the last answer to a call, event or bookmark
	err    error     // the last failed call or ERROR event
}

// watchSnapshot is a copy of a watchState.
type watchSnapshot struct {
	open          int
	closed, heard time.Time
	err           error
}

func (s *watchState) get() watchSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return watchSnapshot{open: s.open, closed: s.closed, heard: s.heard, err: s.err}
}

// called records the outcome of a list or watch call.
func (s *watchState) called(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.err = err
		return
	}
	s.heard = time.Now()
}

func (s *watchState) opened() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open++
	s.heard, s.err = time.Now(), nil
}

func (s *watchState) event(ev k8swatch.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.heard = time.Now()
	if ev.Type == k8swatch.Error {
		s.err = apierrors.FromObject(ev.Object)
	}
}

func (s *watchState) ended() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	if s.open == 0 {
		s.closed = time.Now()
	}
}

// observedListWatch is an informer's ListerWatcher that reports its calls
// and streams to a watchState.
type observedListWatch struct {
	lw *cache.ListWatch
	st *watchState
	// noWatchList: the client cannot serve WatchList (a fake clientset),
	// so the reflector lists instead (see watchlist).
	noWatchList bool
}

var _ cache.ListerWatcherWithContext = (*observedListWatch)(nil)

func (o *observedListWatch) List(opts metav1.ListOptions) (runtime.Object, error) {
	return o.ListWithContext(context.Background(), opts)
}

func (o *observedListWatch) Watch(opts metav1.ListOptions) (k8swatch.Interface, error) {
	return o.WatchWithContext(context.Background(), opts)
}

func (o *observedListWatch) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	obj, err := o.lw.ListWithContext(ctx, opts)
	o.st.called(err)
	return obj, err
}

func (o *observedListWatch) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (k8swatch.Interface, error) {
	w, err := o.lw.WatchWithContext(ctx, opts)
	if err != nil {
		o.st.called(err)
		return nil, err
	}
	o.st.opened()
	ow := &observedWatch{in: w, st: o.st, out: make(chan k8swatch.Event), stop: make(chan struct{})}
	go ow.run()
	return ow, nil
}

// IsWatchListSemanticsUnSupported tells the reflector what the client
// does (watchlist.DoesClientNotSupportWatchListSemantics).
func (o *observedListWatch) IsWatchListSemanticsUnSupported() bool { return o.noWatchList }

// observedWatch passes a watch's events on, reporting each, and its end,
// to a watchState.
type observedWatch struct {
	in   k8swatch.Interface
	st   *watchState
	out  chan k8swatch.Event
	stop chan struct{}
	once sync.Once
}

func (w *observedWatch) run() {
	defer close(w.out)
	defer w.st.ended()
	for {
		select {
		case ev, ok := <-w.in.ResultChan():
			if !ok {
				return
			}
			w.st.event(ev)
			select {
			case w.out <- ev:
			case <-w.stop:
				return
			}
		case <-w.stop:
			return
		}
	}
}

func (w *observedWatch) ResultChan() <-chan k8swatch.Event { return w.out }

func (w *observedWatch) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.in.Stop()
	})
}
