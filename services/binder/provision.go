package binder

import (
	"context"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"

	"github.com/volplane/volplane/pkg/kube"
	"github.com/volplane/volplane/pkg/served"
	provisionerv1 "github.com/volplane/volplane/proto/volplane/provisioner/v1"
)

// servedTTL is how long the list of provisioner names the provisioner
// serves is trusted before it is asked again (in the background).
const servedTTL = 10 * time.Second

// provisionerClient adapts the provisioner's gRPC client to the binder's
// needs; served caches which provisioner names it serves.
type provisionerClient struct {
	c      provisionerv1.ProvisionerServiceClient
	served *served.Cache
}

var _ provisioner = (*provisionerClient)(nil)

func newProvisionerClient(c provisionerv1.ProvisionerServiceClient, log *slog.Logger) *provisionerClient {
	return &provisionerClient{c: c, served: served.New(c, served.Options{Period: servedTTL}, log)}
}

// Serves answers from the provisioner's last ListDrivers. Until it has
// answered once, the caller waits for an answer (at most 5s); after that
// the list is refreshed in the background when older than servedTTL, so
// no worker waits on the provisioner, which may be down.
func (p *provisionerClient) Serves(ctx context.Context, name string) bool {
	return p.served.Get(ctx).Provisioners[name]
}

// Drivers asks the provisioner for its drivers now (explain wants the
// answer of the moment, not the cached one Serves uses).
func (p *provisionerClient) Drivers(ctx context.Context) ([]*provisionerv1.Driver, error) {
	resp, err := p.c.ListDrivers(ctx, &provisionerv1.ListDriversRequest{})
	return resp.GetDrivers(), err
}

// Operation is the journaled provisioning of the claim with uid, nil when
// none is in flight.
func (p *provisionerClient) Operation(ctx context.Context, uid string) (*provisionerv1.Operation, error) {
	resp, err := p.c.ListOperations(ctx, &provisionerv1.ListOperationsRequest{ClaimUid: uid})
	if err != nil || len(resp.GetOperations()) == 0 {
		return nil, err
	}
	return resp.GetOperations()[0], nil
}

// Plan asks the provisioner for the CreateVolume request it would send for
// claim (PlanVolume: nothing is written).
func (p *provisionerClient) Plan(ctx context.Context, claim *corev1.PersistentVolumeClaim) (*provisionerv1.PlanVolumeResponse, error) {
	b, err := kube.EncodeProto(claim)
	if err != nil {
		return nil, err
	}
	return p.c.PlanVolume(ctx, &provisionerv1.PlanVolumeRequest{Claim: b})
}

func (p *provisionerClient) Provision(ctx context.Context, claim *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (provisionResult, error) {
	cb, err := kube.EncodeProto(claim)
	if err != nil {
		return provisionResult{}, err
	}
	sb, err := kube.EncodeProto(class)
	if err != nil {
		return provisionResult{}, err
	}
	resp, err := p.c.Provision(ctx, &provisionerv1.ProvisionRequest{
		ClaimNamespace: claim.Namespace, ClaimName: claim.Name, ClaimUid: string(claim.UID),
		Claim: cb, StorageClass: sb,
	})
	if err != nil {
		return provisionResult{}, err
	}
	res := provisionResult{outcome: resp.GetOutcome(), message: resp.GetMessage(),
		infeasible: resp.GetInfeasible(), classUID: types.UID(resp.GetStorageClassUid())}
	if res.classUID == "" {
		res.classUID = class.UID // a provisioner that does not say: the class sent
	}
	if len(resp.GetVolume()) > 0 {
		if res.volume, err = kube.DecodeVolume(resp.GetVolume()); err != nil {
			return provisionResult{}, err
		}
	}
	return res, nil
}

// provisions runs the provisioner's calls off the claim workers: a CSI
// driver that is slow or hangs (each call may take the provisioner's whole
// timeout) then holds at most a bounded number of these goroutines, never
// the workers that bind, as in Kubernetes where the external provisioner is
// a process of its own. A finished call leaves its result for the claim's
// next sync, which a worker runs, so one claim is still never synced by two
// at once.
type provisions struct {
	slots   chan struct{}                      // bounds the calls in flight
	backoff workqueue.TypedRateLimiter[string] // per claim, between attempts

	mu      sync.Mutex
	running map[string]bool
	results map[string]provisionOutcome
	// notBefore: claims whose last call did not finish, and when the next
	// may start.
	notBefore map[string]time.Time
	// announced: when each claim last got ExternalProvisioning (see
	// announce).
	announced map[string]time.Time
	// last: how each claim's last call ended, and when, for explain.
	last map[string]lastProvision
	// slow: claims whose last call the driver refused as infeasible, not
	// called again before slowFor (--retry-interval-max) has passed unless
	// their StorageClass is replaced (the library's slow set).
	slow    map[string]slowCall
	slowFor time.Duration
	now     func() time.Time
}

// slowCall is a claim's infeasible call: when it ended, for which claim
// and with which StorageClass.
type slowCall struct {
	at           time.Time
	claim, class types.UID
}

// announceEvery is how often a claim waiting for its volume is told so
// again: kube-controller-manager says ExternalProvisioning at each sync
// of the claim, so once per its 15s resync, not at every retry.
const announceEvery = 15 * time.Second

// announce reports whether claim key is due an ExternalProvisioning event
// now, and if so records it.
func (p *provisions) announce(key string, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if last, ok := p.announced[key]; ok && now.Sub(last) < announceEvery {
		return false
	}
	p.announced[key] = now
	return true
}

// lastProvision is how a claim's last Provision call ended.
type lastProvision struct {
	out provisionOutcome
	at  time.Time
}

// provisionOutcome is a finished call for one claim (by UID: a claim
// recreated under the same name never gets the old one's volume).
type provisionOutcome struct {
	uid types.UID
	res provisionResult
	err error
}

// newProvisions bounds the calls in flight to slots; a claim whose call
// did not finish waits start before the next, twice as long after each
// further failure, at most max (external-provisioner's
// --retry-interval-start and --retry-interval-max).
func newProvisions(slots int, start, max time.Duration) *provisions {
	return &provisions{
		slots:     make(chan struct{}, slots),
		backoff:   workqueue.NewTypedItemExponentialFailureRateLimiter[string](start, max),
		running:   map[string]bool{},
		results:   map[string]provisionOutcome{},
		notBefore: map[string]time.Time{},
		announced: map[string]time.Time{},
		last:      map[string]lastProvision{},
		slow:      map[string]slowCall{},
		slowFor:   max,
		now:       time.Now,
	}
}

// slowDown records that the call for claim key (of UID claim) just ended
// infeasible with the StorageClass of UID class: as external-provisioner
// v6.3.0 (sig-storage-lib-external-provisioner's markForSlowRetry), the
// next call waits for slowFor unless the class is replaced.
func (p *provisions) slowDown(key string, claim, class types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slow[key] = slowCall{at: p.now(), claim: claim, class: class}
}

// delayed reports whether the next call for claim key (of UID claim,
// whose StorageClass has UID class now) must still wait after an
// infeasible one (the library's delayProvisioningIfRecentlyInfeasible),
// and until when. A mark that expired, or was made for another claim or
// class, is dropped: the claim starts over.
func (p *provisions) delayed(key string, claim, class types.UID) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.slow[key]
	if !ok {
		return time.Time{}, false
	}
	until := s.at.Add(p.slowFor)
	if s.claim != claim || s.class != class || !p.now().Before(until) {
		delete(p.slow, key)
		return time.Time{}, false
	}
	return until, true
}

// take returns the finished call of claim key with uid, if there is one.
func (p *provisions) take(key string, uid types.UID) (provisionOutcome, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out, ok := p.results[key]
	if !ok {
		return provisionOutcome{}, false
	}
	delete(p.results, key)
	return out, out.uid == uid
}

// busy reports whether a call for key is in flight.
func (p *provisions) busy(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.running[key]
}

// start runs call for claim key in the background unless one is running,
// and then calls done(key) so the claim is synced again.
func (p *provisions) start(ctx context.Context, key string, uid types.UID, call func(context.Context) (provisionResult, error), done func(string)) {
	p.mu.Lock()
	if p.running[key] {
		p.mu.Unlock()
		return
	}
	p.running[key] = true
	p.mu.Unlock()
	go func() {
		out := provisionOutcome{uid: uid}
		select {
		case p.slots <- struct{}{}:
			out.res, out.err = call(ctx)
			<-p.slots
		case <-ctx.Done():
			out.err = ctx.Err()
		}
		p.mu.Lock()
		delete(p.running, key)
		p.results[key] = out
		p.last[key] = lastProvision{out: out, at: time.Now()}
		p.mu.Unlock()
		done(key)
	}()
}

// retry schedules the next call for key after its backoff, which it
// returns: a call that did not finish.
func (p *provisions) retry(key string) time.Duration {
	d := p.backoff.When(key)
	p.mu.Lock()
	p.notBefore[key] = time.Now().Add(d)
	p.mu.Unlock()
	return d
}

// wait is how long the next call for key must still wait.
func (p *provisions) wait(key string) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Until(p.notBefore[key])
}

// finished ends key's backoff: its call finished.
func (p *provisions) finished(key string) {
	p.mu.Lock()
	delete(p.notBefore, key)
	delete(p.slow, key)
	p.mu.Unlock()
	p.backoff.Forget(key)
}

// forget drops what is kept of a deleted claim.
func (p *provisions) forget(key string) {
	p.mu.Lock()
	delete(p.results, key)
	delete(p.announced, key)
	delete(p.last, key)
	p.mu.Unlock()
	p.finished(key)
}

// state is what explain shows of claim key's calls: one is running, when
// the next may start (zero: no backoff), and how the last ended (ok false:
// none is known).
func (p *provisions) state(key string, uid types.UID) (running bool, next time.Time, last lastProvision, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	last, ok = p.last[key]
	if ok && last.out.uid != uid {
		ok = false
	}
	return p.running[key], p.notBefore[key], last, ok
}
